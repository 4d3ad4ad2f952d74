package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestPlan(t *testing.T) {
	saved := modules
	t.Cleanup(func() { modules = saved })
	modules = []string{"a", "b", "c"}
	all := map[string]map[string]string{
		"a": {"shared": "v1.2.0", "pseudo": "v0.0.0-20260101000000-aaaaaaaaaaaa", "mine": "v1.0.0", "same": "v2.0.0"},
		"b": {"shared": "v1.10.0", "pseudo": "v0.0.0-20261023123148-ca04ba58ecab", "same": "v2.0.0"},
		"c": {"shared": "v1.3.0-rc.1", "theirs": "v0.1.0"},
	}
	want := []change{
		{dir: "a", path: "pseudo", from: "v0.0.0-20260101000000-aaaaaaaaaaaa", to: "v0.0.0-20261023123148-ca04ba58ecab"},
		// Semantic order, not the strings': v1.10.0 is the highest.
		{dir: "a", path: "shared", from: "v1.2.0", to: "v1.10.0"},
		{dir: "c", path: "shared", from: "v1.3.0-rc.1", to: "v1.10.0"},
	}
	if got := plan(all); !reflect.DeepEqual(got, want) {
		t.Errorf("plan:\n got %+v\nwant %+v", got, want)
	}
	if got := plan(map[string]map[string]string{"a": {"x": "v1.0.0"}, "b": {"x": "v1.0.0"}}); len(got) != 0 {
		t.Errorf("aligned modules: plan %+v, want nothing", got)
	}
}

// TestApplyRaisesReplace runs the real go command on two throwaway modules:
// a go.mod that replaces a module by a version of itself has the
// replacement raised, one that only requires it the requirement.
func TestApplyRaisesReplace(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command")
	}
	dir := t.TempDir()
	write := func(name, body string) string {
		t.Helper()
		d := filepath.Join(dir, name)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "go.mod"), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return d
	}
	replaced := write("replaced", "module example.com/r\n\ngo 1.26\n\nrequire (\n\tk8s.io/api v0.0.0\n\tk8s.io/apimachinery v0.37.0\n)\n\nreplace k8s.io/api => k8s.io/api v0.37.0\n")
	required := write("required", "module example.com/q\n\ngo 1.26\n\nrequire k8s.io/api v0.37.0\n")
	// Both changes of one folder go in one edit.
	if err := apply(replaced, []change{
		{dir: replaced, path: "k8s.io/api", from: "v0.37.0", to: "v0.37.2"},
		{dir: replaced, path: "k8s.io/apimachinery", from: "v0.37.0", to: "v0.37.2"},
	}); err != nil {
		t.Fatal(err)
	}
	if err := apply(required, []change{{dir: required, path: "k8s.io/api", from: "v0.37.0", to: "v0.37.2"}}); err != nil {
		t.Fatal(err)
	}
	for d, want := range map[string][]string{
		replaced: {"k8s.io/api v0.0.0", "k8s.io/apimachinery v0.37.2", "replace k8s.io/api => k8s.io/api v0.37.2"},
		required: {"require k8s.io/api v0.37.2"},
	} {
		data, err := os.ReadFile(filepath.Join(d, "go.mod"))
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range want {
			if !strings.Contains(string(data), w) {
				t.Errorf("%s/go.mod lacks %q:\n%s", filepath.Base(d), w, data)
			}
		}
	}
}
