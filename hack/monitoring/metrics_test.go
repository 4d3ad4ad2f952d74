package monitoring

import (
	"flag"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/common/promslog"
	"github.com/prometheus/prometheus/model/rulefmt"
	promparser "github.com/prometheus/prometheus/promql/parser"
)

var update = flag.Bool("update", false, "rewrite deploy/monitoring/metrics.txt and prometheusrule.yaml from the code and rules.yaml instead of comparing")

// upstream are the metrics the binaries export through libraries, with the
// package that registers them: csi-lib-utils' CSI call latency, and
// component-base's workqueue and leader-election providers (cmd/attacher's
// blank imports).
var upstream = map[string]string{
	"csi_sidecar_operations_seconds":              "histogram csi-lib-utils/metrics (attacher)",
	"csi_plugin_operations_seconds":               "histogram csi-lib-utils/metrics (driver)",
	"process_start_time_seconds":                  "gauge csi-lib-utils/metrics",
	"workqueue_depth":                             "gauge component-base/metrics/prometheus/workqueue",
	"workqueue_adds_total":                        "counter component-base/metrics/prometheus/workqueue",
	"workqueue_queue_duration_seconds":            "histogram component-base/metrics/prometheus/workqueue",
	"workqueue_work_duration_seconds":             "histogram component-base/metrics/prometheus/workqueue",
	"workqueue_unfinished_work_seconds":           "gauge component-base/metrics/prometheus/workqueue",
	"workqueue_longest_running_processor_seconds": "gauge component-base/metrics/prometheus/workqueue",
	"workqueue_retries_total":                     "counter component-base/metrics/prometheus/workqueue",
	"leader_election_master_status":               "gauge component-base/metrics/prometheus/clientgo/leaderelection",
	"leader_election_slowpath_total":              "counter component-base/metrics/prometheus/clientgo/leaderelection",
}

// codeMetrics reads the metric names loopvol's own code registers: the
// names in prometheus.NewDesc calls and in Name fields of
// prometheus.{Counter,Gauge,Histogram}Opts, and the Done and Errors of
// kube.ClaimMetricNames, in every non-test file of cmd/, pkg/ and
// internal/ but internal/harness. It returns name → "type file".
func codeMetrics(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	fset := token.NewFileSet()
	for _, dir := range []string{"cmd", "pkg", "internal"} {
		root := filepath.Join("../..", dir)
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && strings.HasSuffix(path, "internal/harness") {
				return filepath.SkipDir
			}
			if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return nil
			}
			f, err := parser.ParseFile(fset, path, nil, 0)
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel("../..", path)
			add := func(lit ast.Expr, typ string) {
				bl, ok := lit.(*ast.BasicLit)
				if !ok || bl.Kind != token.STRING {
					return
				}
				name, _ := strconv.Unquote(bl.Value)
				out[name] = typ + " " + filepath.ToSlash(rel)
			}
			ast.Inspect(f, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.CallExpr:
					if sel, ok := n.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "NewDesc" && len(n.Args) > 0 {
						typ := "gauge"
						if strings.HasSuffix(n.Args[0].(*ast.BasicLit).Value, `_total"`) {
							typ = "counter"
						}
						add(n.Args[0], typ)
					}
				case *ast.CompositeLit:
					sel, ok := n.Type.(*ast.SelectorExpr)
					if !ok {
						return true
					}
					kind := map[string]string{"CounterOpts": "counter", "GaugeOpts": "gauge", "HistogramOpts": "histogram", "ClaimMetricNames": "counter"}[sel.Sel.Name]
					if kind == "" {
						return true
					}
					for _, e := range n.Elts {
						kv, ok := e.(*ast.KeyValueExpr)
						if !ok {
							continue
						}
						if k, ok := kv.Key.(*ast.Ident); ok && (k.Name == "Name" || (sel.Sel.Name == "ClaimMetricNames" && (k.Name == "Done" || k.Name == "Errors"))) {
							add(kv.Value, kind)
						}
					}
				}
				return true
			})
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// inventory is metrics.txt: name → "type source".
func inventory(t *testing.T) map[string]string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(monitoringDir, "metrics.txt"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for line := range strings.Lines(string(data)) {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, rest, _ := strings.Cut(line, " ")
		out[name] = rest
	}
	return out
}

// TestInventory: metrics.txt lists exactly the metrics the code registers
// and those of the libraries it uses (-update rewrites it).
func TestInventory(t *testing.T) {
	want := codeMetrics(t)
	for k, v := range upstream {
		want[k] = v
	}
	if *update {
		var b strings.Builder
		b.WriteString("# The metrics loopvol's driver and sidecar export: name, type, where it is registered.\n")
		b.WriteString("# Generated by hack/monitoring (go test -run TestInventory -args -update); TestRuleMetrics\n")
		b.WriteString("# and TestDashboard fail when a rule or panel names a metric not listed here.\n")
		for _, k := range slices.Sorted(maps.Keys(want)) {
			b.WriteString(k + " " + want[k] + "\n")
		}
		if err := os.WriteFile(filepath.Join(monitoringDir, "metrics.txt"), []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	got := inventory(t)
	for k, v := range want {
		if got[k] != v {
			t.Errorf("metrics.txt: %s is %q, the code says %q (go test -args -update)", k, got[k], v)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("metrics.txt lists %s, which nothing registers (go test -args -update)", k)
		}
	}
}

// exprMetrics returns the metric names expr selects, and the errors of an
// expression that does not parse.
func exprMetrics(expr string) ([]string, error) {
	e, err := promparser.NewParser(promparser.Options{}).ParseExpr(expr)
	if err != nil {
		return nil, err
	}
	var names []string
	promparser.Inspect(e, func(n promparser.Node, _ []promparser.Node) error {
		if vs, ok := n.(*promparser.VectorSelector); ok {
			names = append(names, vs.Name)
		}
		return nil
	})
	return names, nil
}

// known tells whether name is a metric of the inventory, or a series of
// one of its histograms, or a recording rule of rules.yaml.
// prometheusSeries are the series Prometheus itself writes for each
// target, which rules may name too.
var prometheusSeries = []string{"up"}

func known(inv map[string]string, recorded map[string]bool, name string) bool {
	if _, ok := inv[name]; ok || recorded[name] || slices.Contains(prometheusSeries, name) {
		return true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok && strings.HasPrefix(inv[base], "histogram ") {
			return true
		}
	}
	return false
}

func loadRules(t *testing.T) *rulefmt.RuleGroups {
	t.Helper()
	rgs, errs := rulefmt.ParseFile(filepath.Join(monitoringDir, "rules.yaml"), false, model.UTF8Validation, promparser.NewParser(promparser.Options{}), promslog.NewNopLogger())
	if len(errs) > 0 {
		t.Fatalf("rules.yaml: %v", errs)
	}
	return rgs
}

func alertNames(t *testing.T) []string {
	var out []string
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			if r.Alert != "" {
				out = append(out, r.Alert)
			}
		}
	}
	return out
}

func recordedNames(t *testing.T) map[string]bool {
	out := map[string]bool{}
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				out[r.Record] = true
			}
		}
	}
	return out
}

// TestRuleMetrics: every metric a rule selects is exported; every alert
// has a runbook section in docs/operations.md and a runbook_url to it.
func TestRuleMetrics(t *testing.T) {
	inv, recorded := inventory(t), recordedNames(t)
	ops, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			names, err := exprMetrics(r.Expr)
			if err != nil {
				t.Errorf("%s%s: %v", r.Alert, r.Record, err)
			}
			for _, n := range names {
				if !known(inv, recorded, n) {
					t.Errorf("%s%s selects %s, which no loopvol binary exports (metrics.txt)", r.Alert, r.Record, n)
				}
			}
			if r.Alert == "" {
				continue
			}
			if !strings.Contains(string(ops), "\n### "+r.Alert+"\n") {
				t.Errorf("docs/operations.md has no section ### %s", r.Alert)
			}
			if want := "docs/operations.md#" + strings.ToLower(r.Alert); !strings.HasSuffix(r.Annotations["runbook_url"], want) {
				t.Errorf("%s: runbook_url %q, want one ending in %s", r.Alert, r.Annotations["runbook_url"], want)
			}
		}
	}
}
