package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"reflect"
	"slices"
	"strings"

	kyaml "sigs.k8s.io/kustomize/kyaml/yaml"
	"sigs.k8s.io/yaml"
)

// helmLabels are the labels the chart may add to an object's
// metadata.labels beyond what kustomize gives it, and nothing else.
var helmLabels = []string{
	"helm.sh/chart",
	"app.kubernetes.io/managed-by",
	"app.kubernetes.io/instance",
	"app.kubernetes.io/version",
}

// object is one parsed manifest object, as JSON-like maps.
type object = map[string]any

// objectKey names an object the way the comparison pairs them.
func objectKey(o object) string {
	meta, _ := o["metadata"].(map[string]any)
	ns, _ := meta["namespace"].(string)
	name, _ := meta["name"].(string)
	return fmt.Sprintf("%s/%s %s/%s", o["apiVersion"], o["kind"], ns, name)
}

// parseObjects splits a multi-document manifest into objects by key; empty
// documents (comments only, templates that rendered nothing) are skipped.
func parseObjects(manifest []byte) (map[string]object, error) {
	out := map[string]object{}
	dec := kyaml.NewDecoder(bytes.NewReader(manifest))
	for {
		var doc kyaml.Node
		if err := dec.Decode(&doc); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, err
		}
		if len(doc.Content) == 0 || doc.Content[0].Kind != kyaml.MappingNode || len(doc.Content[0].Content) == 0 {
			continue
		}
		var b bytes.Buffer
		enc := kyaml.NewEncoder(&b)
		if err := enc.Encode(&doc); err != nil {
			return nil, err
		}
		// Through JSON, as the API server sees it: 0400 and 256 are one
		// number, "6443" stays a string.
		var o object
		if err := yaml.Unmarshal(b.Bytes(), &o); err != nil {
			return nil, err
		}
		k := objectKey(o)
		if _, dup := out[k]; dup {
			return nil, fmt.Errorf("%s twice", k)
		}
		out[k] = o
	}
}

// stripHelmLabels removes from got's labels the Helm labels that want
// lacks, and the labels map itself when nothing is left of it.
func stripHelmLabels(got, want object) {
	meta, _ := got["metadata"].(map[string]any)
	labels, _ := meta["labels"].(map[string]any)
	wantMeta, _ := want["metadata"].(map[string]any)
	wantLabels, _ := wantMeta["labels"].(map[string]any)
	for _, l := range helmLabels {
		if _, ok := wantLabels[l]; !ok {
			delete(labels, l)
		}
	}
	if labels != nil && len(labels) == 0 && wantLabels == nil {
		delete(meta, "labels")
	}
}

// compareObjects compares the chart's objects with kustomize's, pair by
// pair, and returns one readable finding per difference: an object only
// one side has, or the diff of a pair (-kustomize +chart).
func compareObjects(kustomize, chart map[string]object, ignore func(key string) bool) []string {
	var findings []string
	for _, k := range slices.Sorted(maps.Keys(kustomize)) {
		if ignore(k) {
			continue
		}
		got, ok := chart[k]
		if !ok {
			findings = append(findings, fmt.Sprintf("%s: in the kustomize build, not in the chart", k))
			continue
		}
		want := kustomize[k]
		stripHelmLabels(got, want)
		if !reflect.DeepEqual(want, got) {
			findings = append(findings, fmt.Sprintf("%s differs (-kustomize +chart):\n%s", k, yamlDiff(want, got)))
		}
	}
	for _, k := range slices.Sorted(maps.Keys(chart)) {
		if _, ok := kustomize[k]; !ok && !ignore(k) {
			y, _ := yaml.Marshal(chart[k])
			findings = append(findings, fmt.Sprintf("%s: in the chart, not in the kustomize build:\n%s", k, indent(string(y))))
		}
	}
	return findings
}

func indent(s string) string {
	return "    " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n    ")
}

// yamlDiff is a unified diff, three lines of context, of want and got as sorted
// YAML: the lines a reader of either file recognises, where a structural
// diff would print Go maps.
func yamlDiff(want, got object) string {
	ya, _ := yaml.Marshal(want)
	yb, _ := yaml.Marshal(got)
	x := strings.Split(strings.TrimRight(string(ya), "\n"), "\n")
	y := strings.Split(strings.TrimRight(string(yb), "\n"), "\n")
	// lcs[i][j]: the longest common subsequence of x[i:] and y[j:].
	lcs := make([][]int, len(x)+1)
	for i := range lcs {
		lcs[i] = make([]int, len(y)+1)
	}
	for i := len(x) - 1; i >= 0; i-- {
		for j := len(y) - 1; j >= 0; j-- {
			if x[i] == y[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	type line struct {
		op   byte
		text string
	}
	var lines []line
	i, j := 0, 0
	for i < len(x) || j < len(y) {
		switch {
		case i < len(x) && j < len(y) && x[i] == y[j]:
			lines = append(lines, line{' ', x[i]})
			i, j = i+1, j+1
		case i < len(x) && (j == len(y) || lcs[i+1][j] >= lcs[i][j+1]):
			lines = append(lines, line{'-', x[i]})
			i++
		default:
			lines = append(lines, line{'+', y[j]})
			j++
		}
	}
	// Print every changed line and the unchanged ones within context of
	// one; "..." stands for the rest.
	const context = 3
	show := make([]bool, len(lines))
	for n, l := range lines {
		if l.op != ' ' {
			for k := max(0, n-context); k <= min(len(lines)-1, n+context); k++ {
				show[k] = true
			}
		}
	}
	var b strings.Builder
	for n, l := range lines {
		switch {
		case show[n]:
			if n == 0 || !show[n-1] {
				// Where the hunk is: the lines it is nested in.
				var path []string
				ind := indentOf(l.text)
				for k := n - 1; k >= 0 && ind > 0; k-- {
					if t := lines[k].text; lines[k].op != '+' && indentOf(t) < ind {
						path = append([]string{strings.TrimSpace(t)}, path...)
						ind = indentOf(t)
					}
				}
				fmt.Fprintf(&b, "  @@ %s\n", strings.Join(path, " > "))
			}
			fmt.Fprintf(&b, "  %c %s\n", l.op, l.text)
		case n > 0 && show[n-1]:
			b.WriteString("    ...\n")
		}
	}
	return b.String()
}

// indentOf is the indentation of a YAML line, a list item's "- " counted
// as indentation, so that an item's fields nest in it.
func indentOf(line string) int {
	t := strings.TrimLeft(line, " ")
	n := len(line) - len(t)
	if strings.HasPrefix(t, "- ") {
		n += 2
	}
	return n
}
