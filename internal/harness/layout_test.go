package harness

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/loopvol/loopvol"

// TestShippedImportsNoHarness fails when a package the binaries are built
// from, cmd/... and pkg/... and everything they import (test files aside),
// imports a package under internal/harness.
func TestShippedImportsNoHarness(t *testing.T) {
	cmd := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}{{range .Imports}} {{.}}{{end}}", module+"/cmd/...", module+"/pkg/...")
	out, err := cmd.Output()
	if err != nil {
		if exit, ok := err.(*exec.ExitError); ok {
			t.Fatalf("go list: %v\n%s", err, exit.Stderr)
		}
		t.Fatalf("go list: %v", err)
	}
	var listed []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		listed = append(listed, fields[0])
		for _, imp := range fields[1:] {
			if imp == module+"/internal/harness" || strings.HasPrefix(imp, module+"/internal/harness/") {
				t.Errorf("%s imports %s: a shipped package must not import the test harness", fields[0], imp)
			}
		}
	}
	// Not a vacuous pass: the binaries themselves were listed.
	for _, bin := range []string{module + "/cmd/driver", module + "/cmd/attacher"} {
		if !slices.Contains(listed, bin) {
			t.Errorf("go list -deps did not list %s", bin)
		}
	}
}
