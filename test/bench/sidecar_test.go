package bench

import (
	"bufio"
	"bytes"
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

// sidecar is one attacher process, ours or external-attacher, started the
// same way for both so that neither is measured differently: its own pid,
// its log in a file, SIGTERM to stop, SIGKILL if it dies with the benchmark.
// (test/internal/attacherproc runs only our own binary.)
type sidecar struct {
	name    string
	logPath string
	cmd     *exec.Cmd
	done    chan struct{}
	waitErr error
}

// startSidecar runs bin with args, its output in dir/<name>.log, and stops
// it when tb ends (printing the log tail if tb failed).
func startSidecar(tb testing.TB, dir, name, bin string, args ...string) *sidecar {
	tb.Helper()
	s := &sidecar{name: name, logPath: filepath.Join(dir, name+".log"), done: make(chan struct{})}
	logFile, err := os.Create(s.logPath)
	if err != nil {
		tb.Fatal(err)
	}
	s.cmd = exec.Command(bin, args...)
	s.cmd.Stdout, s.cmd.Stderr = logFile, logFile
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		logFile.Close()
		tb.Fatalf("start %s: %v", name, err)
	}
	go func() {
		s.waitErr = s.cmd.Wait()
		logFile.Close()
		close(s.done)
	}()
	tb.Cleanup(func() {
		s.stop()
		if tb.Failed() {
			tb.Logf("%s log %s (last 8 KiB):\n%s", name, s.logPath, s.tail(8192))
		}
	})
	return s
}

func (s *sidecar) running() bool {
	select {
	case <-s.done:
		return false
	default:
		return true
	}
}

// stop sends SIGTERM and waits up to 30 s, then kills.
func (s *sidecar) stop() error {
	if !s.running() {
		return s.waitErr
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(30 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
	return s.waitErr
}

// peakRSS returns the process's peak resident set size in bytes (VmHWM of
// /proc/<pid>/status); the process must still run.
func (s *sidecar) peakRSS() (int64, error) {
	if !s.running() {
		return 0, fmt.Errorf("%s has ended: %v", s.name, s.waitErr)
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", s.cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "VmHWM:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("unexpected line %q", sc.Text())
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		return kb << 10, err
	}
	return 0, fmt.Errorf("no VmHWM in /proc/%d/status", s.cmd.Process.Pid)
}

func (s *sidecar) tail(n int) string {
	data, _ := os.ReadFile(s.logPath)
	if len(data) > n {
		data = data[len(data)-n:]
	}
	return string(bytes.ToValidUTF8(data, []byte("?")))
}
