package monitoring

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"sigs.k8s.io/yaml"
)

// prometheusRule wraps rules.yaml's groups in a monitoring.coreos.com/v1
// PrometheusRule, the object the Prometheus Operator loads.
func prometheusRule(t *testing.T) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(monitoringDir, "rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var spec map[string]any
	if err := yaml.Unmarshal(data, &spec); err != nil {
		t.Fatal(err)
	}
	obj := map[string]any{
		"apiVersion": "monitoring.coreos.com/v1",
		"kind":       "PrometheusRule",
		"metadata": map[string]any{
			"name":   "loopvol",
			"labels": map[string]any{"app.kubernetes.io/name": "loopvol", "app.kubernetes.io/component": "monitoring"},
		},
		"spec": spec,
	}
	out, err := yaml.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	return append([]byte("# Generated from rules.yaml by hack/monitoring (go test -run TestPrometheusRule -args -update): edit rules.yaml.\n"), out...)
}

// TestPrometheusRule: prometheusrule.yaml holds exactly rules.yaml's
// groups (-update rewrites it).
func TestPrometheusRule(t *testing.T) {
	want := prometheusRule(t)
	path := filepath.Join(monitoringDir, "prometheusrule.yaml")
	if *update {
		if err := os.WriteFile(path, want, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("prometheusrule.yaml is not rules.yaml wrapped: go test -run TestPrometheusRule -args -update in hack/monitoring")
	}
}
