package monitoring

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// dashboard is what the test reads of dashboard.json.
type dashboard struct {
	Panels []panel `json:"panels"`
}

type panel struct {
	Type    string   `json:"type"`
	Title   string   `json:"title"`
	Panels  []panel  `json:"panels"`
	Targets []target `json:"targets"`
}

type target struct {
	RefID string `json:"refId"`
	Expr  string `json:"expr"`
}

// TestDashboard: every panel of dashboard.json but a row has queries,
// each query parses as PromQL, and every metric it selects is exported
// (metrics.txt) or recorded by rules.yaml.
func TestDashboard(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(monitoringDir, "dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("dashboard.json: %v", err)
	}
	inv, recorded := inventory(t), recordedNames(t)
	var check func([]panel)
	check = func(ps []panel) {
		for _, p := range ps {
			if p.Type == "row" {
				check(p.Panels)
				continue
			}
			if len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			for _, tg := range p.Targets {
				names, err := exprMetrics(tg.Expr)
				if err != nil {
					t.Errorf("panel %q query %s: %v", p.Title, tg.RefID, err)
					continue
				}
				for _, n := range names {
					if !known(inv, recorded, n) {
						t.Errorf("panel %q query %s selects %s, which no loopvol binary exports (metrics.txt)", p.Title, tg.RefID, n)
					}
				}
			}
		}
	}
	check(d.Panels)
}
