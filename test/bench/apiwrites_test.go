package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"k8s.io/client-go/kubernetes"
)

// writeVerbs are the verbs of apiserver_request_total that change state.
// APPLY (server-side apply) is a PATCH the metric names apart; DELETECOLLECTION
// is one request however many objects it deletes.
var writeVerbs = map[string]bool{"POST": true, "PUT": true, "PATCH": true, "APPLY": true, "DELETE": true, "DELETECOLLECTION": true}

// writeKey is one series of apiserver_request_total, less the labels that
// do not matter here (group, version, scope, component, dry_run).
type writeKey struct {
	verb, resource, subresource, code string
}

func (k writeKey) String() string {
	r := k.resource
	if k.subresource != "" {
		r += "/" + k.subresource
	}
	return fmt.Sprintf("%s %s %s", k.verb, r, k.code)
}

// apiWrites is a snapshot of the API server's write counters.
type apiWrites map[writeKey]float64

// apiServerSnapshot is what the benchmark reads from the API server's
// /metrics before and after a window.
type apiServerSnapshot struct {
	writes apiWrites
	// cpu is process_cpu_seconds_total: the API server's own CPU time (etcd
	// runs as another process and is not in it).
	cpu float64
}

// scrapeAPIServer reads the API server's /metrics with client (an admin
// client: /metrics needs the right to GET a non-resource URL) and returns
// its write requests by verb, resource, subresource and code, and its CPU
// time.
func scrapeAPIServer(ctx context.Context, client kubernetes.Interface) (apiServerSnapshot, error) {
	data, err := client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return apiServerSnapshot{}, fmt.Errorf("read the API server's /metrics: %w", err)
	}
	snap := apiServerSnapshot{writes: apiWrites{}}
	w := snap.writes
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if v, ok := strings.CutPrefix(line, "process_cpu_seconds_total "); ok {
			if snap.cpu, err = strconv.ParseFloat(strings.TrimSpace(v), 64); err != nil {
				return snap, fmt.Errorf("metric line %q: %w", line, err)
			}
			continue
		}
		rest, ok := strings.CutPrefix(line, "apiserver_request_total{")
		if !ok {
			continue
		}
		end := strings.LastIndex(rest, "} ")
		if end < 0 {
			return snap, fmt.Errorf("unexpected metric line %q", line)
		}
		labels, err := parseLabels(rest[:end])
		if err != nil {
			return snap, fmt.Errorf("metric line %q: %w", line, err)
		}
		if !writeVerbs[labels["verb"]] || labels["dry_run"] != "" {
			continue
		}
		v, err := strconv.ParseFloat(strings.Fields(rest[end+2:])[0], 64)
		if err != nil {
			return snap, fmt.Errorf("metric line %q: %w", line, err)
		}
		w[writeKey{verb: labels["verb"], resource: labels["resource"], subresource: labels["subresource"], code: labels["code"]}] += v
	}
	return snap, sc.Err()
}

// parseLabels parses the inside of a Prometheus text-format label set:
// name="value",name="value" (values with \" \\ \n escapes).
func parseLabels(s string) (map[string]string, error) {
	out := map[string]string{}
	for s != "" {
		eq := strings.IndexByte(s, '=')
		if eq < 0 || eq+1 >= len(s) || s[eq+1] != '"' {
			return nil, fmt.Errorf("bad label set near %q", s)
		}
		name := s[:eq]
		s = s[eq+2:]
		var val strings.Builder
		i := 0
		for ; i < len(s) && s[i] != '"'; i++ {
			if s[i] == '\\' && i+1 < len(s) {
				i++
				switch s[i] {
				case 'n':
					val.WriteByte('\n')
				default:
					val.WriteByte(s[i])
				}
				continue
			}
			val.WriteByte(s[i])
		}
		if i >= len(s) {
			return nil, fmt.Errorf("unterminated value of label %s", name)
		}
		out[name] = val.String()
		s = strings.TrimPrefix(s[i+1:], ",")
	}
	return out, nil
}

// since returns the writes made between before and w.
func (w apiWrites) since(before apiWrites) apiWrites {
	d := apiWrites{}
	for k, v := range w {
		if n := v - before[k]; n != 0 {
			d[k] = n
		}
	}
	return d
}

// total sums the series whose resource is one of resources (all when none
// are given).
func (w apiWrites) total(resources ...string) float64 {
	var n float64
	for k, v := range w {
		if len(resources) == 0 || slices.Contains(resources, k.resource) {
			n += v
		}
	}
	return n
}

// filter returns the series whose resource is one of resources.
func (w apiWrites) filter(resources ...string) apiWrites {
	out := apiWrites{}
	for k, v := range w {
		if slices.Contains(resources, k.resource) {
			out[k] = v
		}
	}
	return out
}

// String lists the series, largest first, e.g. "PATCH volumeattachments/status 200: 2000".
func (w apiWrites) String() string {
	keys := slices.SortedFunc(maps.Keys(w), func(a, b writeKey) int {
		if w[a] != w[b] {
			if w[a] > w[b] {
				return -1
			}
			return 1
		}
		return strings.Compare(a.String(), b.String())
	})
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s: %.0f", k, w[k]))
	}
	return strings.Join(parts, ", ")
}
