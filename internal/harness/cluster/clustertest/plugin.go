package clustertest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/loopvol/loopvol/internal/harness/cluster"
	"github.com/loopvol/loopvol/internal/harness/testenv"
)

// Plugin runs the kubectl plugin against a cluster, as a user would, with
// the cluster's admin kubeconfig.
type Plugin struct {
	t   *testing.T
	bin string
	c   *cluster.Cluster
}

// NewPlugin builds cmd/kubectl-loopvol from this tree into the test's
// directory.
func NewPlugin(t *testing.T, c *cluster.Cluster) *Plugin {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "kubectl-loopvol")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/kubectl-loopvol")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/kubectl-loopvol: %v\n%s", err, out)
	}
	return &Plugin{t: t, bin: bin, c: c}
}

// Run runs the plugin and returns its standard output and exit code; its
// standard error goes to the test's log.
func (p *Plugin) Run(args ...string) (string, int) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, p.bin, append([]string{"--kubeconfig", p.c.Kubeconfig}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	code := 0
	switch {
	case errors.As(err, &exit):
		code = exit.ExitCode()
	case err != nil:
		p.t.Fatalf("kubectl-loopvol %s: %v", strings.Join(args, " "), err)
	}
	if stderr.Len() > 0 {
		p.t.Logf("kubectl-loopvol %s (exit %d), stderr:\n%s", strings.Join(args, " "), code, stderr.String())
	}
	return stdout.String(), code
}

// JSON runs the plugin with -o json and decodes its output into v; the
// command must succeed.
func (p *Plugin) JSON(v any, args ...string) {
	p.t.Helper()
	out, code := p.Run(append(args, "-o", "json")...)
	if code != 0 {
		p.t.Fatalf("kubectl-loopvol %s -o json exited %d:\n%s", strings.Join(args, " "), code, out)
	}
	if err := json.Unmarshal([]byte(out), v); err != nil {
		p.t.Fatalf("kubectl-loopvol %s -o json: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// Check is one check of `kubectl loopvol doctor -o json`.
type Check struct {
	Name   string `json:"name"`
	Result string `json:"result"`
	Detail string `json:"detail"`
	Hint   string `json:"hint"`
}

// Doctor runs `doctor -o json` and returns its checks by name and its
// exit code (1 when a check fails).
func (p *Plugin) Doctor() (map[string]Check, int) {
	p.t.Helper()
	out, code := p.Run("doctor", "-o", "json")
	var report struct {
		Checks []Check `json:"checks"`
	}
	if err := json.Unmarshal([]byte(out), &report); err != nil || len(report.Checks) == 0 {
		p.t.Fatalf("kubectl-loopvol doctor -o json (exit %d): %v\n%s", code, err, out)
	}
	checks := map[string]Check{}
	for _, c := range report.Checks {
		checks[c.Name] = c
	}
	return checks, code
}

// Table runs the plugin for its table, checks that every line fits 100
// columns and carries no colour (its output is no terminal), and returns
// it with the exit code. describe prints paths whole, to be copied, and
// what a claim waits for on one line: those lines may be longer.
func (p *Plugin) Table(args ...string) (string, int) {
	p.t.Helper()
	out, code := p.Run(args...)
	for _, line := range strings.Split(out, "\n") {
		whole := strings.HasPrefix(line, "Waiting:") || strings.Contains(line, "  /")
		if len([]rune(line)) > 100 && !whole {
			p.t.Errorf("kubectl-loopvol %s: a line of %d columns: %q", strings.Join(args, " "), len([]rune(line)), line)
		}
	}
	if strings.Contains(out, "\x1b[") {
		p.t.Errorf("kubectl-loopvol %s: colour on a pipe:\n%s", strings.Join(args, " "), out)
	}
	p.t.Logf("kubectl-loopvol %s (exit %d):\n%s", strings.Join(args, " "), code, out)
	return out, code
}
