package proc

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// waitFor polls cond every 10 ms for up to 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within 10s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// gone reports whether pid has ended: no such process, or a zombie left
// for its new parent to reap.
func gone(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	i := strings.LastIndexByte(string(stat), ')')
	return i >= 0 && i+2 < len(stat) && stat[i+2] == 'Z'
}

func TestStartLogsAndStopsOnSIGTERM(t *testing.T) {
	dir := t.TempDir()
	p := Start(t, "/bin/sh", dir, "echoer", "-c", "echo hello; exec sleep 1000")
	if p.LogPath != filepath.Join(dir, "echoer.log") {
		t.Errorf("LogPath = %s, want %s", p.LogPath, filepath.Join(dir, "echoer.log"))
	}
	waitFor(t, "output in the log", func() bool { return strings.Contains(p.Log(), "hello\n") })
	if !p.Running() || p.Err() != nil {
		t.Fatalf("Running %v, Err %v: want a running process", p.Running(), p.Err())
	}
	// sleep dies of the SIGTERM, which Stop counts as a clean stop.
	if err := p.Stop(); err != nil {
		t.Errorf("Stop = %v, want nil", err)
	}
	if p.Running() {
		t.Error("Running after Stop")
	}
	log := p.Log()
	if !strings.HasPrefix(log, "=== proc: starting echoer at ") || !strings.Contains(log, ": -c echo hello; exec sleep 1000\nhello\n") {
		t.Errorf("log does not start with the start mark, then the output:\n%s", log)
	}
	if !strings.Contains(log, "=== proc: echoer ended: signal: terminated\n") {
		t.Errorf("log lacks the end mark:\n%s", log)
	}
}

func TestRunWithoutMarksDirAndEnv(t *testing.T) {
	logDir, work := t.TempDir(), t.TempDir()
	p, err := Run(Spec{
		Name:   "env",
		Bin:    "/bin/sh",
		Args:   []string{"-c", `pwd; echo "$PROC_TEST"`},
		LogDir: logDir,
		Dir:    work,
		Env:    []string{"PROC_TEST=set"},
	})
	if err != nil {
		t.Fatal(err)
	}
	<-p.Done()
	if err := p.Err(); err != nil {
		t.Errorf("Err = %v, want a clean exit", err)
	}
	if got, want := p.Log(), work+"\nset\n"; got != want {
		t.Errorf("log = %q, want %q (the output only)", got, want)
	}
}

func TestStopKillsAfterGrace(t *testing.T) {
	p, err := Run(Spec{
		Name:   "stubborn",
		Bin:    "/bin/sh",
		Args:   []string{"-c", "trap '' TERM; echo ready; while :; do sleep 1; done"},
		LogDir: t.TempDir(),
		Grace:  200 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Kill)
	waitFor(t, "ready", func() bool { return strings.Contains(p.Log(), "ready") })
	start := time.Now()
	err = p.Stop()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Errorf("Stop = %v, want the process killed", err)
	}
	if d := time.Since(start); d < 200*time.Millisecond {
		t.Errorf("Stop killed after %s, before the grace of 200ms", d)
	}
}

func TestGroupStopKillsTheGroup(t *testing.T) {
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "child.pid")
	// The child ignores SIGTERM and stays in the group after its parent
	// died of it: Stop kills it with the rest of the group.
	p, err := Run(Spec{
		Name:   "parent",
		Bin:    "/bin/sh",
		Args:   []string{"-c", `(trap '' TERM; exec sleep 1000) & echo $! >` + pidFile + `; exec sleep 1000`},
		LogDir: dir,
		Group:  true,
	})
	if err != nil {
		t.Fatal(err)
	}
	var child int
	waitFor(t, "the child's pid", func() bool {
		b, err := os.ReadFile(pidFile)
		child, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil
	})
	t.Cleanup(func() { _ = syscall.Kill(child, syscall.SIGKILL) })
	if pgid, err := syscall.Getpgid(p.Pid()); err != nil || pgid != p.Pid() {
		t.Errorf("process group %d, %v: want %d, a group of its own", pgid, err, p.Pid())
	}
	if err := p.Stop(); err != nil {
		t.Errorf("Stop = %v, want nil", err)
	}
	waitFor(t, "end of the child left in the group", func() bool { return gone(child) })
}

func TestKill(t *testing.T) {
	p := Start(t, "/bin/sh", t.TempDir(), "victim", "-c", "exec sleep 1000")
	p.Kill()
	if p.Running() {
		t.Fatal("Running after Kill")
	}
	if err := p.Err(); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Errorf("Err = %v, want killed", err)
	}
	// Stopping an ended process returns how it ended.
	if err := p.Stop(); err == nil {
		t.Error("Stop after Kill = nil, want how it ended")
	}
}

func TestRunMissingBinary(t *testing.T) {
	_, err := Run(Spec{Name: "nothing", Bin: filepath.Join(t.TempDir(), "nothing"), LogDir: t.TempDir()})
	if err == nil || !strings.HasPrefix(err.Error(), "start nothing: ") {
		t.Errorf("Run = %v, want a start error naming the process", err)
	}
}

func TestPeakRSS(t *testing.T) {
	p := Start(t, "/bin/sh", t.TempDir(), "rss", "-c", "exec sleep 1000")
	rss, err := p.PeakRSS()
	if err != nil || rss <= 0 {
		t.Errorf("PeakRSS = %d, %v: want a positive size", rss, err)
	}
	p.Kill()
	if _, err := p.PeakRSS(); err == nil {
		t.Error("PeakRSS of an ended process: no error")
	}
}
