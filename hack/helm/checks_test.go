package main

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/v2/lint/support"
	"sigs.k8s.io/yaml"
)

// TestLint is `helm lint --strict` through the SDK, with the chart's
// defaults and with every ci values file: the chart loads, Chart.yaml is
// complete, the templates render and parse, the values pass the schema.
func TestLint(t *testing.T) {
	kv, err := common.ParseKubeVersion(kubeVersion)
	if err != nil {
		t.Fatal(err)
	}
	sets := map[string]map[string]any{"defaults": nil}
	for _, v := range variants {
		sets[v.name] = ciValues(t, v.name)
	}
	for name, vals := range sets {
		t.Run(name, func(t *testing.T) {
			l := action.NewLint()
			l.Strict = true
			l.Namespace = "loopvol"
			l.KubeVersion = kv
			res := l.Run([]string{chartPath}, vals)
			for _, m := range res.Messages {
				if m.Severity > support.InfoSev {
					t.Errorf("lint: %s", m.Err)
				}
			}
			for _, err := range res.Errors {
				t.Errorf("lint: %v", err)
			}
			if res.TotalChartsLinted != 1 {
				t.Errorf("linted %d charts, want 1", res.TotalChartsLinted)
			}
		})
	}
}

// TestRefused: values the schema or the templates' checks refuse, each
// with the words of the message that says why.
func TestRefused(t *testing.T) {
	for _, tc := range []struct {
		name, values, want string
	}{
		{"unknown deployment mode", `deployment: cluster`, "deployment"},
		{"unknown value", `replicas: 2`, "additional properties 'replicas'"},
		{"pool with hostPath and nfs", `pools: [{name: a, hostPath: /a, nfs: {server: s, path: /e}}]`, "oneOf"},
		{"pool with neither", `pools: [{name: a}]`, "oneOf"},
		{"pool name not a DNS label", `pools: [{name: Fast, hostPath: /a}]`, "pattern"},
		{"relative kubelet dir", `kubeletDir: var/lib/kubelet`, "pattern"},
		{"bad pull policy", `images: {node: {pullPolicy: Sometimes}}`, "pullPolicy"},
		{"log verbosity as a string", `logVerbosity: "5"`, "logVerbosity"},
		{"fencing without shared pools", `{deployment: local, fencing: {enabled: true}}`, "fencing.enabled needs deployment: shared"},
		{"snapshots in distributed", `{deployment: distributed, snapshots: {enabled: true}}`, "snapshots.enabled"},
		{"NFS pool in distributed", `{deployment: distributed, pools: [{name: default, nfs: {server: s, path: /e}}]}`, "is an NFS export"},
		{"class of a pool not listed", `storageClasses: [{name: fast, pool: fast, fsType: xfs, volumeBindingMode: WaitForFirstConsumer, allowVolumeExpansion: true, reclaimPolicy: Delete}]`, `names pool "fast"`},
		{"pool listed twice", `pools: [{name: a, hostPath: /a}, {name: a, hostPath: /b}]`, "listed twice"},
		{"API server host without port", `apiServer: {host: 127.0.0.1}`, "both host and port"},
		{"cert-manager without issuer", `webhook: {certManager: {enabled: true}}`, "issuerRef.name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var vals map[string]any
			if err := yaml.Unmarshal([]byte(tc.values), &vals); err != nil {
				t.Fatal(err)
			}
			_, err := renderChart(chartPath, vals, "loopvol")
			if err == nil {
				t.Fatalf("values %s rendered; want a refusal", tc.values)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("values %s: error %q, want one that says %q", tc.values, err, tc.want)
			}
		})
	}
}

// TestComparisonFindsDifferences: the equality test is not blind. A
// flag, a pool's volume and a label that kustomize does not give are each
// reported, and so is an object one side lacks.
func TestComparisonFindsDifferences(t *testing.T) {
	mem, err := loadKustomizeTree(repo)
	if err != nil {
		t.Fatal(err)
	}
	want := kustomizeObjects(t, mem, variants[0]) // local
	vals := ciValues(t, "local")
	vals["logVerbosity"] = 3
	vals["pools"] = []any{map[string]any{"name": "default", "nfs": map[string]any{"server": "s", "path": "/e"}}}
	vals["snapshots"] = map[string]any{"enabled": true}
	manifest, err := renderChart(chartPath, vals, "loopvol")
	if err != nil {
		t.Fatal(err)
	}
	got, err := parseObjects([]byte(manifest))
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range got {
		o["metadata"].(map[string]any)["labels"].(map[string]any)["example.com/extra"] = "x"
	}
	all := strings.Join(compareObjects(want, got, func(k string) bool { return k == namespaceKey }), "\n")
	for _, w := range []string{"--v=3", "nfs", "example.com/extra", "VolumeSnapshotClass /loopvol: in the chart, not in the kustomize build"} {
		if !strings.Contains(all, w) {
			t.Errorf("the comparison did not report %q; it reported:\n%s", w, all)
		}
	}
}

// TestCertManager: with webhook.certManager, a Certificate for the
// webhook's Service in the release's namespace writes the Secret the
// controller pods mount.
func TestCertManager(t *testing.T) {
	vals := map[string]any{"webhook": map[string]any{
		"tlsSecretName": "hook-tls",
		"certManager":   map[string]any{"enabled": true, "issuerRef": map[string]any{"name": "ca"}},
	}}
	manifest, err := renderChart(chartPath, vals, "storage")
	if err != nil {
		t.Fatal(err)
	}
	objs, err := parseObjects([]byte(manifest))
	if err != nil {
		t.Fatal(err)
	}
	cert, ok := objs["cert-manager.io/v1/Certificate storage/loopvol-webhook"]
	if !ok {
		t.Fatal("no Certificate storage/loopvol-webhook")
	}
	spec := cert["spec"].(map[string]any)
	if spec["secretName"] != "hook-tls" || spec["dnsNames"].([]any)[0] != "loopvol-webhook.storage.svc" {
		t.Errorf("Certificate spec %v, want secretName hook-tls for loopvol-webhook.storage.svc", spec)
	}
	sts := objs["apps/v1/StatefulSet storage/loopvol-controller"]
	y, _ := yaml.Marshal(sts)
	if !strings.Contains(string(y), "secretName: hook-tls") {
		t.Errorf("the StatefulSet does not mount Secret hook-tls:\n%s", y)
	}
}

// TestMonitoringObjects: with monitoring.prometheusRule.enabled and
// monitoring.podMonitors.enabled the chart's PrometheusRule and PodMonitors
// are deploy/monitoring's prometheusrule.yaml and podmonitors.yaml in the
// release's namespace, with the selectors' labels added; the rule's
// Prometheus templates ({{ $labels.pool }}) pass through Helm untouched.
func TestMonitoringObjects(t *testing.T) {
	want := map[string]object{}
	for _, file := range []string{"prometheusrule.yaml", "podmonitors.yaml"} {
		data, err := os.ReadFile(filepath.Join(repo, "deploy", "monitoring", file))
		if err != nil {
			t.Fatal(err)
		}
		objs, err := parseObjects(data)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range objs {
			meta := o["metadata"].(map[string]any)
			meta["namespace"] = "storage"
			meta["labels"].(map[string]any)["release"] = "prometheus"
			want[fmt.Sprintf("%s/%s storage/%s", o["apiVersion"], o["kind"], meta["name"])] = o
		}
	}
	if len(want) != 3 {
		t.Fatalf("deploy/monitoring holds %d PrometheusRules and PodMonitors, want 3: %v", len(want), slices.Collect(maps.Keys(want)))
	}
	selector := map[string]any{"enabled": true, "labels": map[string]any{"release": "prometheus"}}
	vals := map[string]any{"monitoring": map[string]any{"prometheusRule": selector, "podMonitors": selector}}
	manifest, err := renderChart(chartPath, vals, "storage")
	if err != nil {
		t.Fatal(err)
	}
	got, err := parseObjects([]byte(manifest))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range compareObjects(want, got, func(k string) bool { _, ok := want[k]; return !ok }) {
		t.Error(f)
	}
	if !strings.Contains(manifest, "{{ $labels.pool }}") {
		t.Error("the rendered PrometheusRule lost its Prometheus templates")
	}
}

// TestKustomizeChangeFails: a change of a kustomize file that the chart
// does not follow fails the equality test, here a flag of the base's
// controller and a rule of the base's RBAC (the second through the
// generated templates, which are read from disk, not regenerated).
func TestKustomizeChangeFails(t *testing.T) {
	mem, err := loadKustomizeTree(repo)
	if err != nil {
		t.Fatal(err)
	}
	for file, change := range map[string][2]string{
		"base/controller.yaml":    {"--kube-api-qps=100", "--kube-api-qps=50"},
		"base/rbac-attacher.yaml": {`verbs: ["patch"]`, `verbs: ["patch", "update"]`},
	} {
		p := kustomizeRoot + "/" + file
		data, err := mem.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(data), change[0]) {
			t.Fatalf("%s has no %q any more: pick another change for this test", file, change[0])
		}
		if err := mem.WriteFile(p, []byte(strings.Replace(string(data), change[0], change[1], 1))); err != nil {
			t.Fatal(err)
		}
	}
	want := kustomizeObjects(t, mem, variants[0])
	manifest, err := renderChart(chartPath, ciValues(t, variants[0].name), "loopvol")
	if err != nil {
		t.Fatal(err)
	}
	got, err := parseObjects([]byte(manifest))
	if err != nil {
		t.Fatal(err)
	}
	all := strings.Join(compareObjects(want, got, func(k string) bool { return k == namespaceKey }), "\n")
	for _, w := range []string{"-         - --kube-api-qps=50", "+         - --kube-api-qps=100", "-   - update"} {
		if !strings.Contains(all, w) {
			t.Errorf("the changed kustomize file's %s is not reported; the comparison said:\n%s", w, all)
		}
	}
}
