package monitoring

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/common/promslog"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/promqltest"
	"github.com/prometheus/prometheus/rules"
	"sigs.k8s.io/yaml"
)

// monitoringDir is deploy/monitoring, seen from this module.
const monitoringDir = "../../deploy/monitoring"

// ruleTests is the format of rules_test.yaml: promtool test rules' format
// (tests, interval, input_series, alert_rule_test), the subset used here.
type ruleTests struct {
	EvaluationInterval model.Duration `json:"evaluation_interval"`
	Tests              []ruleTest     `json:"tests"`
}

type ruleTest struct {
	Name          string          `json:"name"`
	Interval      model.Duration  `json:"interval"`
	InputSeries   []inputSeries   `json:"input_series"`
	AlertRuleTest []alertRuleTest `json:"alert_rule_test"`
}

type inputSeries struct {
	Series string `json:"series"`
	Values string `json:"values"`
}

type alertRuleTest struct {
	EvalTime  model.Duration `json:"eval_time"`
	Alertname string         `json:"alertname"`
	ExpAlerts []expAlert     `json:"exp_alerts"`
}

type expAlert struct {
	ExpLabels map[string]string `json:"exp_labels"`
}

// TestRules runs rules_test.yaml against rules.yaml the way promtool test
// rules does: the series loaded, every group evaluated at each interval up
// to the last eval_time, and the firing alerts compared with the expected
// ones at each eval_time (none expected: none may fire). It also checks
// that every alert has a case where it fires and one where it does not.
func TestRules(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(monitoringDir, "rules_test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var suite ruleTests
	if err := yaml.UnmarshalStrict(data, &suite); err != nil {
		t.Fatalf("rules_test.yaml: %v", err)
	}
	evalInterval := time.Duration(suite.EvaluationInterval)
	if evalInterval == 0 {
		evalInterval = time.Minute
	}
	fires, quiet := map[string]bool{}, map[string]bool{}
	for _, tc := range suite.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			} else {
				quiet[a.Alertname] = true
			}
		}
		t.Run(tc.Name, func(t *testing.T) { runRuleTest(t, tc, evalInterval) })
	}
	for _, name := range alertNames(t) {
		if !fires[name] {
			t.Errorf("alert %s has no test where it fires", name)
		}
		if !quiet[name] {
			t.Errorf("alert %s has no test where it does not fire", name)
		}
	}
}

func runRuleTest(t *testing.T, tc ruleTest, evalInterval time.Duration) {
	interval := time.Duration(tc.Interval)
	if interval == 0 {
		interval = time.Minute
	}
	var load strings.Builder
	fmt.Fprintf(&load, "load %s\n", model.Duration(interval))
	for _, s := range tc.InputSeries {
		fmt.Fprintf(&load, "  %s %s\n", s.Series, s.Values)
	}
	ll, err := promqltest.NewLazyLoader(load.String(), promqltest.LazyLoaderOpts{EnableAtModifier: true, EnableNegativeOffset: true})
	if err != nil {
		t.Fatalf("input_series: %v", err)
	}
	t.Cleanup(func() { _ = ll.Close() })
	ll.SubqueryInterval = evalInterval
	m := rules.NewManager(&rules.ManagerOptions{
		QueryFunc:    rules.EngineQueryFunc(ll.QueryEngine(), ll.Storage()),
		AppendableV2: ll.Storage(),
		Context:      context.Background(),
		NotifyFunc:   func(context.Context, string, ...*rules.Alert) {},
		Logger:       promslog.NewNopLogger(),
	})
	groupMap, errs := m.LoadGroups(evalInterval, labels.EmptyLabels(), "", nil, false, filepath.Join(monitoringDir, "rules.yaml"))
	if errs != nil {
		t.Fatalf("rules.yaml: %v", errs)
	}
	// Evaluate in file order, so that recording rules come before the
	// alerts of later groups that use them.
	var groups []*rules.Group
	for _, g := range loadRules(t).Groups {
		groups = append(groups, groupMap[rules.GroupKey(filepath.Join(monitoringDir, "rules.yaml"), g.Name)])
	}

	checks := map[time.Duration][]alertRuleTest{}
	var last time.Duration
	for _, a := range tc.AlertRuleTest {
		at := time.Duration(a.EvalTime)
		checks[at] = append(checks[at], a)
		last = max(last, at)
	}
	start := time.Unix(0, 0).UTC()
	for at := time.Duration(0); at <= last; at += evalInterval {
		ts := start.Add(at)
		ll.WithSamplesTill(ts, func(err error) {
			if err != nil {
				t.Fatalf("loading samples till %s: %v", at, err)
			}
			for _, g := range groups {
				g.Eval(ll.Context(), ts)
				for _, r := range g.Rules() {
					if err := r.LastError(); err != nil {
						t.Fatalf("rule %s at %s: %v", r.Name(), at, err)
					}
				}
			}
		})
		for _, a := range checks[at] {
			got := firing(groups, a.Alertname)
			var want []string
			for _, e := range a.ExpAlerts {
				l := maps.Clone(e.ExpLabels)
				l["alertname"] = a.Alertname
				want = append(want, labelString(l))
			}
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Errorf("%s at %s: firing %q, want %q", a.Alertname, model.Duration(at), got, want)
			}
		}
	}
}

// firing returns the label sets of alert name's firing alerts, sorted.
func firing(groups []*rules.Group, name string) []string {
	var out []string
	for _, g := range groups {
		for _, r := range g.Rules() {
			ar, ok := r.(*rules.AlertingRule)
			if !ok || ar.Name() != name {
				continue
			}
			for _, a := range ar.ActiveAlerts() {
				if a.State == rules.StateFiring {
					out = append(out, labelString(a.Labels.Map()))
				}
			}
		}
	}
	slices.Sort(out)
	return out
}

func labelString(l map[string]string) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(l)) {
		parts = append(parts, fmt.Sprintf("%s=%q", k, l[k]))
	}
	return "{" + strings.Join(parts, ", ") + "}"
}
