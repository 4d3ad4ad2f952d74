// Package attacherproc builds cmd/attacher once per test binary and runs it
// as a real process, the way it runs next to a driver in a cluster: its own
// pid, its log in a file (printed when the test fails), stopped with SIGTERM
// or killed with SIGKILL like a crashed container, and stopped in t.Cleanup
// whatever happens.
package attacherproc

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/loopvol/loopvol/test/internal/gobuild"
)

// Binary builds cmd/attacher once per test binary and returns its path.
func Binary(tb testing.TB) string {
	tb.Helper()
	return gobuild.Binary(tb, "github.com/loopvol/loopvol/cmd/attacher")
}

// Cleanup removes the built binaries; call it from TestMain after m.Run.
func Cleanup() { gobuild.Cleanup() }

// Attacher is one running (or ended) attacher process.
type Attacher struct {
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

// Start runs the attacher with args and returns at once: the tests wait for
// what the attacher does, not for a readiness signal. The log goes to
// dir/<name>.log. The process is stopped (SIGTERM, then SIGKILL) in
// t.Cleanup, and its log tail is printed when the test has failed. It also
// dies with the test binary (PR_SET_PDEATHSIG), so a test that panics
// leaves nothing running.
func Start(tb testing.TB, dir, name string, args ...string) *Attacher {
	tb.Helper()
	return StartBinary(tb, Binary(tb), dir, name, args...)
}

// StartBinary is Start with another attacher binary (the benchmark runs
// external-attacher the same way, so that both are measured alike).
func StartBinary(tb testing.TB, bin, dir, name string, args ...string) *Attacher {
	tb.Helper()
	a := &Attacher{Name: name, LogPath: filepath.Join(dir, name+".log"), done: make(chan struct{})}
	logFile, err := os.OpenFile(a.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		tb.Fatal(err)
	}
	fmt.Fprintf(logFile, "=== attacherproc: starting %s at %s: %s\n", name, time.Now().Format(time.RFC3339Nano), strings.Join(args, " "))
	a.cmd = exec.Command(bin, args...)
	a.cmd.Stdout, a.cmd.Stderr = logFile, logFile
	a.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := a.cmd.Start(); err != nil {
		logFile.Close()
		tb.Fatalf("start attacher %s: %v", name, err)
	}
	a.started = time.Now()
	go func() {
		a.waitErr = a.cmd.Wait()
		fmt.Fprintf(logFile, "=== attacherproc: %s ended: %v\n", name, a.waitErr)
		logFile.Close()
		close(a.done)
	}()
	tb.Cleanup(func() {
		a.Stop()
		if tb.Failed() {
			tb.Logf("attacher %s log %s (last 8 KiB):\n%s", name, a.LogPath, a.Tail(8192))
		}
	})
	return a
}

// Pid is the process ID.
func (a *Attacher) Pid() int { return a.cmd.Process.Pid }

// Done is closed when the process has ended.
func (a *Attacher) Done() <-chan struct{} { return a.done }

// Running reports whether the process has not ended yet.
func (a *Attacher) Running() bool {
	select {
	case <-a.done:
		return false
	default:
		return true
	}
}

// Stop sends SIGTERM and waits up to 30 s for a clean exit, then kills.
// It returns the process's exit error (nil after a clean stop).
func (a *Attacher) Stop() error {
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
func (a *Attacher) Err() error {
	if a.Running() {
		return nil
	}
	return a.waitErr
}

// Kill sends SIGKILL, as a node or container crash would, and waits for the
// process to end.
func (a *Attacher) Kill() {
	if !a.Running() {
		return
	}
	_ = a.cmd.Process.Kill()
	<-a.done
}

// PeakRSS returns the process's peak resident set size in bytes (VmHWM in
// /proc/<pid>/status). It fails once the process has ended.
func (a *Attacher) PeakRSS() (int64, error) {
	if !a.Running() {
		return 0, fmt.Errorf("attacher %s has ended", a.Name)
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
func (a *Attacher) Log() string {
	data, _ := os.ReadFile(a.LogPath)
	return string(bytes.ToValidUTF8(data, []byte("?")))
}

// Tail returns the last n bytes of the log.
func (a *Attacher) Tail(n int) string {
	s := a.Log()
	if len(s) > n {
		s = s[len(s)-n:]
	}
	return s
}

// FreeAddress returns 127.0.0.1:<port> with a port that was free a moment
// ago, for --http-endpoint. Another process could take it in between; on
// this test machine nothing else hands out ports that fast.
func FreeAddress(tb testing.TB) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}
