// Package proc runs a binary as a real process, the way it runs on a node:
// its own pid, its output in a log file, stopped with SIGTERM and killed
// with SIGKILL when it does not stop in time (or at once, as a crashed
// container), and dead with the process that started it
// (PR_SET_PDEATHSIG), so that a test that panics or a demo that is killed
// leaves nothing running.
//
// Run starts one process as described by a Spec: the cluster
// (internal/harness/cluster) runs each of its daemons through it, in a
// process group of its own. Start wraps Run for a test: the process is
// stopped in t.Cleanup and its log tail printed when the test failed;
// test/internal/driverproc and test/internal/attacherproc build on it, and
// test/bench runs external-attacher through it too, so that both attachers
// are measured alike.
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
	"time"
)

// defaultGrace is how long Stop waits after SIGTERM when the Spec sets no
// Grace.
const defaultGrace = 30 * time.Second

// Spec describes a process for Run.
type Spec struct {
	// Name tells processes apart in messages, and names the log file
	// <LogDir>/<Name>.log.
	Name string
	// Bin is the executable's path, Args its arguments.
	Bin  string
	Args []string
	// LogDir is the directory of the log file, which collects the
	// process's stdout and stderr. A process started again under the
	// same name and directory appends to it.
	LogDir string
	// Dir is the working directory; empty means this process's.
	Dir string
	// Env is added to this process's environment.
	Env []string
	// Group puts the process in a process group of its own, as a daemon
	// that starts children of its own: Stop and Kill then signal the
	// whole group, and Stop kills what is left of the group once the
	// process has ended. It also keeps a terminal's ^C from reaching the
	// process before its parent decides to stop it.
	Group bool
	// Grace is how long Stop waits after SIGTERM before it sends SIGKILL;
	// zero means 30 s.
	Grace time.Duration
	// Marks writes a line to the log when the process starts (with its
	// arguments) and when it ends, so that the runs a log collects can
	// be told apart. Without it the log holds the process's output only.
	Marks bool
}

// Process is one running (or ended) process.
type Process struct {
	// Name is Spec.Name.
	Name string
	// LogPath is the file that collects the process's stdout and stderr.
	LogPath string

	cmd     *exec.Cmd
	group   bool
	grace   time.Duration
	done    chan struct{}
	waitErr error
}

// Run starts the process s describes and returns at once. The caller must
// call Stop (or Kill) when done with it.
func Run(s Spec) (*Process, error) {
	p := &Process{
		Name:    s.Name,
		LogPath: filepath.Join(s.LogDir, s.Name+".log"),
		group:   s.Group,
		grace:   s.Grace,
		done:    make(chan struct{}),
	}
	if p.grace == 0 {
		p.grace = defaultGrace
	}
	logFile, err := os.OpenFile(p.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	if s.Marks {
		fmt.Fprintf(logFile, "=== proc: starting %s at %s: %s\n", s.Name, time.Now().Format(time.RFC3339Nano), strings.Join(s.Args, " "))
	}
	p.cmd = exec.Command(s.Bin, s.Args...)
	p.cmd.Stdout, p.cmd.Stderr = logFile, logFile
	p.cmd.Dir = s.Dir
	if s.Env != nil {
		p.cmd.Env = append(os.Environ(), s.Env...)
	}
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: s.Group, Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("start %s: %w", s.Name, err)
	}
	go func() {
		p.waitErr = p.cmd.Wait()
		if s.Marks {
			fmt.Fprintf(logFile, "=== proc: %s ended: %v\n", s.Name, p.waitErr)
		}
		logFile.Close()
		close(p.done)
	}()
	return p, nil
}

// TB is the part of testing.TB that Start uses. proc does not import
// testing: hack/demo runs the cluster's daemons through Run and should not
// link it.
type TB interface {
	Helper()
	Fatal(args ...any)
	Logf(format string, args ...any)
	Failed() bool
	Cleanup(func())
}

// Start runs bin with args for a test and returns at once. The log goes to
// dir/<name>.log (appended to, after a line that marks the start). The
// process is stopped (SIGTERM, then SIGKILL after 30 s) in tb.Cleanup, and
// its log tail is printed when the test has failed.
func Start(tb TB, bin, dir, name string, args ...string) *Process {
	tb.Helper()
	p, err := Run(Spec{Name: name, Bin: bin, Args: args, LogDir: dir, Marks: true})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		p.Stop()
		if tb.Failed() {
			tb.Logf("%s log %s (last 8 KiB):\n%s", name, p.LogPath, p.Tail(8192))
		}
	})
	return p
}

// Pid is the process ID (and, with Spec.Group, the process group ID).
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Done is closed when the process has ended.
func (p *Process) Done() <-chan struct{} { return p.done }

// Running reports whether the process has not ended yet.
func (p *Process) Running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Stop sends SIGTERM and waits up to Spec.Grace for the process to end,
// then kills it. It returns the process's exit error: nil after a clean
// exit, and also when the process died of the SIGTERM (external-attacher
// does not handle it). Stopping an ended process returns how it ended.
func (p *Process) Stop() error {
	if !p.Running() {
		p.killGroup()
		return p.waitErr
	}
	p.signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(p.grace):
		p.signal(syscall.SIGKILL)
		<-p.done
		p.killGroup()
		return p.waitErr
	}
	p.killGroup()
	var exit *exec.ExitError
	if errors.As(p.waitErr, &exit) {
		if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGTERM {
			return nil
		}
	}
	return p.waitErr
}

// Err is how the process ended (nil while it runs or after a clean exit).
func (p *Process) Err() error {
	if p.Running() {
		return nil
	}
	return p.waitErr
}

// Kill sends SIGKILL, as a node or container crash would, and waits for the
// process to end.
func (p *Process) Kill() {
	if !p.Running() {
		return
	}
	p.signal(syscall.SIGKILL)
	<-p.done
}

// signal sends sig to the process, or to its group with Spec.Group.
func (p *Process) signal(sig syscall.Signal) {
	if p.group {
		_ = syscall.Kill(-p.Pid(), sig)
		return
	}
	_ = p.cmd.Process.Signal(sig)
}

// killGroup kills what is left of the process's group once the process has
// ended: children it started that did not end with it (none expected).
func (p *Process) killGroup() {
	if p.group {
		_ = syscall.Kill(-p.Pid(), syscall.SIGKILL)
	}
}

// PeakRSS returns the process's peak resident set size in bytes (VmHWM in
// /proc/<pid>/status). It fails once the process has ended.
func (p *Process) PeakRSS() (int64, error) {
	if !p.Running() {
		return 0, fmt.Errorf("%s has ended", p.Name)
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", p.Pid()))
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
	return 0, fmt.Errorf("no VmHWM in /proc/%d/status", p.Pid())
}

// Log returns the whole log file so far.
func (p *Process) Log() string {
	data, _ := os.ReadFile(p.LogPath)
	return string(bytes.ToValidUTF8(data, []byte("?")))
}

// Tail returns the last n bytes of the log.
func (p *Process) Tail(n int) string {
	s := p.Log()
	if len(s) > n {
		s = s[len(s)-n:]
	}
	return s
}
