package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

const repo = "../.."

var chartPath = filepath.Join(repo, chartDir)

// namespaceKey is the one object of the overlays the chart leaves out on
// purpose: Helm installs into the release's namespace, made by
// --create-namespace or beforehand (docs/helm.md).
const namespaceKey = "v1/Namespace /loopvol"

func ciValues(t *testing.T, name string) map[string]any {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(chartPath, "ci", name+"-values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var vals map[string]any
	if err := yaml.Unmarshal(data, &vals); err != nil {
		t.Fatalf("ci/%s-values.yaml: %v", name, err)
	}
	return vals
}

// TestGenerated: templates/generated is what the kustomize sources make
// now. A change of one of them fails here until `go -C hack/helm run .
// -write` follows it.
func TestGenerated(t *testing.T) {
	if err := run(repo, false); err != nil {
		t.Fatal(err)
	}
}

// TestEqualToKustomize renders the chart with ci/<variant>-values.yaml and
// compares it, object by object, with `kustomize build` of the variant.
// Every kustomize file is read here, so a change of any of them that the
// chart does not follow fails this test.
func TestEqualToKustomize(t *testing.T) {
	mem, err := loadKustomizeTree(repo)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			want := kustomizeObjects(t, mem, v)
			if _, ok := want[namespaceKey]; !ok {
				t.Fatalf("the kustomize build has no %s: the chart's namespace handling needs a look", namespaceKey)
			}
			manifest, err := renderChart(chartPath, ciValues(t, v.name), "loopvol")
			if err != nil {
				t.Fatal(err)
			}
			got, err := parseObjects([]byte(manifest))
			if err != nil {
				t.Fatalf("the chart's manifest: %v", err)
			}
			for _, f := range compareObjects(want, got, func(k string) bool { return k == namespaceKey }) {
				t.Error(f)
			}
		})
	}
}

func kustomizeObjects(t *testing.T, mem filesys.FileSystem, v variant) map[string]object {
	t.Helper()
	y, err := kustomizeBuild(mem, v)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := parseObjects(y)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// TestCIValuesHaveVariants: every ci/*-values.yaml is compared with a
// kustomize build, so none is a set of values nobody checks.
func TestCIValuesHaveVariants(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(chartPath, "ci", "*-values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, v := range variants {
		names = append(names, v.name)
	}
	for _, f := range files {
		n := strings.TrimSuffix(filepath.Base(f), "-values.yaml")
		if !slices.Contains(names, n) {
			t.Errorf("%s has no variant in hack/helm's variants", f)
		}
	}
	if len(files) != len(variants) {
		t.Errorf("%d ci values files for %d variants", len(files), len(variants))
	}
}

// TestOtherNamespace: installed elsewhere than "loopvol", nothing of the
// chart names loopvol's namespace: no object lives there, no binding's
// subject or params, no ServiceAccount user name, no Service reference.
func TestOtherNamespace(t *testing.T) {
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			manifest, err := renderChart(chartPath, ciValues(t, v.name), "storage")
			if err != nil {
				t.Fatal(err)
			}
			objs, err := parseObjects([]byte(manifest))
			if err != nil {
				t.Fatal(err)
			}
			for k, o := range objs {
				walkStrings(o, "", func(path, s string) {
					if (strings.HasSuffix(path, ".namespace") && s == "loopvol") || strings.Contains(s, ":loopvol:") ||
						strings.Contains(s, "loopvol-webhook.loopvol.svc") {
						t.Errorf("%s: %s = %q names loopvol's namespace", k, path, s)
					}
				})
			}
		})
	}
}

func walkStrings(v any, path string, f func(path, s string)) {
	switch v := v.(type) {
	case map[string]any:
		for k, c := range v {
			walkStrings(c, path+"."+k, f)
		}
	case []any:
		for _, c := range v {
			walkStrings(c, path+"[]", f)
		}
	case string:
		f(path, v)
	}
}
