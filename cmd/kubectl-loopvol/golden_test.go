package main

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the commands' output instead of comparing")

// golden compares got with testdata/name.golden, or writes it with -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./cmd/kubectl-loopvol -args -update to write it)", err)
	}
	if diff := cmp.Diff(string(want), got); diff != "" {
		t.Errorf("%s differs (-want +got; -args -update rewrites it):\n%s", path, diff)
	}
}

// checkScreen fails when a line is wider than maxWidth or carries a
// colour sequence: without a terminal, nothing may be coloured.
func checkScreen(t *testing.T, out string, exempt func(line string) bool) {
	t.Helper()
	for i, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "\x1b[") {
			t.Errorf("line %d has a colour sequence: %q", i+1, line)
		}
		if n := utf8.RuneCountInString(line); n > maxWidth && (exempt == nil || !exempt(line)) {
			t.Errorf("line %d is %d columns wide, more than %d: %q", i+1, n, maxWidth, line)
		}
	}
}

func TestGolden(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		// code is the exit code the command must end with.
		code int
	}{
		{name: "status", args: []string{"status"}},
		{name: "status.json", args: []string{"status", "-o", "json"}},
		{name: "status.yaml", args: []string{"status", "-o", "yaml"}},
		{name: "volumes", args: []string{"volumes"}},
		{name: "volumes-all", args: []string{"volumes", "-A"}},
		{name: "volumes-shop", args: []string{"volumes", "-n", "shop"}},
		{name: "volumes.json", args: []string{"volumes", "-A", "-o", "json"}},
		{name: "volumes.yaml", args: []string{"volumes", "-A", "-o", "yaml"}},
		{name: "describe-pvc-bound", args: []string{"describe", "pvc", "data-web-0"}},
		{name: "describe-pvc-space", args: []string{"describe", "pvc", "big"}},
		{name: "describe-pvc-wffc", args: []string{"describe", "pvc", "scratch"}},
		{name: "describe-pvc-attach", args: []string{"describe", "pvc", "logs-web-0"}},
		{name: "describe-pv", args: []string{"describe", "pv", dbPV}},
		{name: "describe-pod", args: []string{"describe", "pod", "logs-0"}},
		{name: "describe-pvc.json", args: []string{"describe", "pvc", "big", "-o", "json"}},
		{name: "describe-pod.yaml", args: []string{"describe", "pod", "web-0", "-o", "yaml"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			out, stderr, code := f.run(t, "default", false, tc.args...)
			if code != tc.code {
				t.Fatalf("exit code %d, want %d; stderr: %s", code, tc.code, stderr)
			}
			golden(t, tc.name, out)
			if !strings.Contains(tc.name, ".") {
				// describe prints paths whole (they are to be copied), and
				// what a claim waits for on one line.
				checkScreen(t, out, func(line string) bool {
					return strings.Contains(line, "/var/lib/") || strings.HasPrefix(line, "Waiting:")
				})
			}
		})
	}
}
