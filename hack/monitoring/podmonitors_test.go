package monitoring

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// podMonitor is the part of a PodMonitor this test reads.
type podMonitor struct {
	Kind     string `json:"kind"`
	Metadata struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		Selector struct {
			MatchLabels map[string]string `json:"matchLabels"`
		} `json:"selector"`
		PodMetricsEndpoints []struct {
			Port        string `json:"port"`
			Relabelings []struct {
				TargetLabel string `json:"targetLabel"`
				Replacement string `json:"replacement"`
			} `json:"relabelings"`
		} `json:"podMetricsEndpoints"`
	} `json:"spec"`
}

// podManifests are the manifests that define the Pods of a component
// (app.kubernetes.io/component), in every layout.
var podManifests = map[string][]string{
	"controller": {"base/controller.yaml"},
	"node":       {"base/node.yaml", "overlays/distributed/node-deployment.yaml"},
}

// TestPodMonitors: podmonitors.yaml scrapes the controller and the node
// Pods under the job names rules.yaml selects, every endpoint of a
// PodMonitor sets its job, and every port it names is a metrics port that
// some layout gives that component's Pods.
func TestPodMonitors(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(monitoringDir, "podmonitors.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	rules, err := os.ReadFile(filepath.Join(monitoringDir, "rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var jobs []string
	for _, doc := range strings.Split(string(data), "\n---\n") {
		var pm podMonitor
		if err := yaml.Unmarshal([]byte(doc), &pm); err != nil {
			t.Fatal(err)
		}
		component := pm.Spec.Selector.MatchLabels["app.kubernetes.io/component"]
		files, ok := podManifests[component]
		if pm.Kind != "PodMonitor" || !ok || pm.Spec.Selector.MatchLabels["app.kubernetes.io/name"] != "loopvol" {
			t.Fatalf("%s %s selects %v, want loopvol's controller or node Pods", pm.Kind, pm.Metadata.Name, pm.Spec.Selector.MatchLabels)
		}
		var manifests string
		for _, f := range files {
			b, err := os.ReadFile(filepath.Join("..", "..", "deploy", "kubernetes", f))
			if err != nil {
				t.Fatal(err)
			}
			manifests += string(b)
		}
		job := ""
		for _, ep := range pm.Spec.PodMetricsEndpoints {
			if !regexp.MustCompile(`name: ` + regexp.QuoteMeta(ep.Port) + `, containerPort: `).MatchString(manifests) {
				t.Errorf("%s: port %s is no container port of the %s Pods (%s)", pm.Metadata.Name, ep.Port, component, strings.Join(files, ", "))
			}
			set := ""
			for _, r := range ep.Relabelings {
				if r.TargetLabel == "job" {
					set = r.Replacement
				}
			}
			if set == "" || (job != "" && set != job) {
				t.Errorf("%s: port %s sets job %q, want the one job of the PodMonitor (%q)", pm.Metadata.Name, ep.Port, set, job)
			}
			job = set
		}
		if job != pm.Metadata.Name {
			t.Errorf("PodMonitor %s sets job %q, want its own name", pm.Metadata.Name, job)
		}
		jobs = append(jobs, job)
	}
	slices.Sort(jobs)
	if want := []string{"loopvol-controller", "loopvol-node"}; !slices.Equal(jobs, want) {
		t.Fatalf("PodMonitors' jobs %v, want %v", jobs, want)
	}
	for _, job := range jobs {
		if !strings.Contains(string(rules), `job="`+job+`"`) {
			t.Errorf("rules.yaml names no job %q: the PodMonitors and the rules disagree", job)
		}
	}
}
