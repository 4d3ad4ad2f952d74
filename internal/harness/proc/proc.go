// Package proc runs a binary under test as a real process, the way it runs
// in a cluster: its own pid, its log in a file (printed when the test fails),
// stopped with SIGTERM or killed with SIGKILL like a crashed container, and
// stopped in t.Cleanup whatever happens. driverproc and attacherproc build
// on it; the benchmark runs external-attacher through it too, so that both
// attachers are measured alike.
package proc

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Process is one running (or ended) process.
type Process struct {
	// Name tells replicas apart in test messages.
	Name string
	// LogPath is the file that collects the process's stdout and stderr.
	// Starting another process with the same name and directory appends to
	// it, after a line that marks the start.
	LogPath string

	cmd     *exec.Cmd
	started time.Time
	done    chan struct{}
	waitErr error
}

// Start runs bin with args and returns at once. The log goes to
// dir/<name>.log (appended to, after a line that marks the start). The
// process is stopped (SIGTERM, then SIGKILL) in tb.Cleanup, and its log tail
// is printed when the test has failed. It also dies with the test binary
// (PR_SET_PDEATHSIG), so a test that panics leaves nothing running.
func Start(tb testing.TB, bin, dir, name string, args ...string) *Process {
	tb.Helper()
	a := &Process{Name: name, LogPath: filepath.Join(dir, name+".log"), done: make(chan struct{})}
	logFile, err := os.OpenFile(a.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		tb.Fatal(err)
	}
	fmt.Fprintf(logFile, "=== proc: starting %s at %s: %s\n", name, time.Now().Format(time.RFC3339Nano), strings.Join(args, " "))
	a.cmd = exec.Command(bin, args...)
	a.cmd.Stdout, a.cmd.Stderr = logFile, logFile
	a.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := a.cmd.Start(); err != nil {
		logFile.Close()
		tb.Fatalf("start %s: %v", name, err)
	}
	a.started = time.Now()
	go func() {
		a.waitErr = a.cmd.Wait()
		fmt.Fprintf(logFile, "=== proc: %s ended: %v\n", name, a.waitErr)
		logFile.Close()
		close(a.done)
	}()
	tb.Cleanup(func() {
		a.Stop()
		if tb.Failed() {
			tb.Logf("%s log %s (last 8 KiB):\n%s", name, a.LogPath, a.Tail(8192))
		}
	})
	return a
}

// Pid is the process ID.
func (a *Process) Pid() int { return a.cmd.Process.Pid }

// Done is closed when the process has ended.
func (a *Process) Done() <-chan struct{} { return a.done }

// Running reports whether the process has not ended yet.
func (a *Process) Running() bool {
	select {
	case <-a.done:
		return false
	default:
		return true
	}
}

// Stop sends SIGTERM and waits up to 30 s for a clean exit, then kills.
// It returns the process's exit error (nil after a clean stop).
func (a *Process) Stop() error {
	if !a.Running() {
		return a.waitErr
	}
	_ = a.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-a.done:
	case <-time.After(30 * time.Second):
		_ = a.cmd.Process.Kill()
		<-a.done
		return a.waitErr
	}
	// Dying of the SIGTERM (external-attacher does not handle it) is a
	// clean stop too.
	var exit *exec.ExitError
	if errors.As(a.waitErr, &exit) {
		if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGTERM {
			return nil
		}
	}
	return a.waitErr
}

// Err is how the process ended (nil while it runs or after a clean exit).
func (a *Process) Err() error {
	if a.Running() {
		return nil
	}
	return a.waitErr
}

// Kill sends SIGKILL, as a node or container crash would, and waits for the
// process to end.
func (a *Process) Kill() {
	if !a.Running() {
		return
	}
	_ = a.cmd.Process.Kill()
	<-a.done
}

// PeakRSS returns the process's peak resident set size in bytes (VmHWM in
// /proc/<pid>/status). It fails once the process has ended.
func (a *Process) PeakRSS() (int64, error) {
	if !a.Running() {
		return 0, fmt.Errorf("%s has ended", a.Name)
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", a.Pid()))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "VmHWM:")
		if !ok {
			continue
		}
		fields := strings.Fields(rest) // "12345 kB"
		if len(fields) != 2 || fields[1] != "kB" {
			return 0, fmt.Errorf("unexpected VmHWM line %q", sc.Text())
		}
		kb, err := strconv.ParseInt(fields[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("VmHWM %q: %w", fields[0], err)
		}
		return kb << 10, nil
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("no VmHWM in /proc/%d/status", a.Pid())
}

// Log returns the whole log file so far.
func (a *Process) Log() string {
	data, _ := os.ReadFile(a.LogPath)
	return string(bytes.ToValidUTF8(data, []byte("?")))
}

// Tail returns the last n bytes of the log.
func (a *Process) Tail(n int) string {
	s := a.Log()
	if len(s) > n {
		s = s[len(s)-n:]
	}
	return s
}
