package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"k8s.io/apimachinery/pkg/util/wait"
)

// metricSet is one scrape of a /metrics endpoint.
type metricSet map[string]*dto.MetricFamily

// scrape reads url once. It retries for a few seconds, since a process
// that has just started may not listen yet.
func (r *rig) scrape(url string) metricSet {
	r.t.Helper()
	var (
		set     metricSet
		lastErr error
	)
	err := wait.PollUntilContextTimeout(r.ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		set, lastErr = scrapeOnce(ctx, url)
		return lastErr == nil, nil
	})
	if err != nil {
		r.t.Fatalf("scrape %s: %v (last error: %v)", url, err, lastErr)
	}
	return set
}

func scrapeOnce(ctx context.Context, url string) (metricSet, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	// Ask for the text format: the parser below reads only that.
	req.Header.Set("Accept", "text/plain; version=0.0.4")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, fmt.Errorf("%s: %s", resp.Status, body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", url, err)
	}
	return metricSet(fams), nil
}

// value sums the series of metric name whose labels include want: the
// value of counters and gauges, the sample count of histograms and
// summaries. A metric that does not exist counts 0.
func (s metricSet) value(name string, want map[string]string) float64 {
	fam := s[name]
	if fam == nil {
		return 0
	}
	total := 0.0
	for _, m := range fam.GetMetric() {
		if !hasLabels(m, want) {
			continue
		}
		switch {
		case m.GetCounter() != nil:
			total += m.GetCounter().GetValue()
		case m.GetGauge() != nil:
			total += m.GetGauge().GetValue()
		case m.GetHistogram() != nil:
			total += float64(m.GetHistogram().GetSampleCount())
		case m.GetSummary() != nil:
			total += float64(m.GetSummary().GetSampleCount())
		case m.GetUntyped() != nil:
			total += m.GetUntyped().GetValue()
		}
	}
	return total
}

// byLabel lists the series of name with their label values, for messages.
func (s metricSet) byLabel(name, label string) string {
	fam := s[name]
	if fam == nil {
		return "none"
	}
	sums := map[string]float64{}
	for _, m := range fam.GetMetric() {
		key := ""
		for _, lp := range m.GetLabel() {
			if lp.GetName() == label {
				key = lp.GetValue()
			}
		}
		one := metricSet{name: &dto.MetricFamily{Name: fam.Name, Type: fam.Type, Metric: []*dto.Metric{m}}}
		sums[key] += one.value(name, nil)
	}
	var parts []string
	for k, v := range sums {
		parts = append(parts, fmt.Sprintf("%s=%g", k, v))
	}
	sort.Strings(parts)
	return strings.Join(parts, " ")
}

func hasLabels(m *dto.Metric, want map[string]string) bool {
	for k, v := range want {
		found := false
		for _, lp := range m.GetLabel() {
			if lp.GetName() == k && lp.GetValue() == v {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// The counts the tests compare.

// driverCalls is the number of calls of method the driver answered with
// code (e.g. "OK"; empty: any code), from csi_plugin_operations_seconds.
func (s metricSet) driverCalls(method, code string) float64 {
	return s.value("csi_plugin_operations_seconds", callLabels(method, code))
}

// sidecarCalls is the number of calls of method the attacher made that
// ended with code (empty: any), from csi_sidecar_operations_seconds.
func (s metricSet) sidecarCalls(method, code string) float64 {
	return s.value("csi_sidecar_operations_seconds", callLabels(method, code))
}

func callLabels(method, code string) map[string]string {
	l := map[string]string{"method_name": method}
	if code != "" {
		l["grpc_status_code"] = code
	}
	return l
}

func (s metricSet) attaches() float64 { return s.value("loopvol_attacher_attaches_total", nil) }
func (s metricSet) detaches() float64 { return s.value("loopvol_attacher_detaches_total", nil) }
func (s metricSet) attachErrors() float64 {
	return s.value("loopvol_attacher_attach_errors_total", nil)
}
func (s metricSet) reconcileResyncs() float64 {
	return s.value("loopvol_attacher_reconcile_resyncs_total", nil)
}
