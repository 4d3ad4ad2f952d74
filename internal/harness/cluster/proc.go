package cluster

import (
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

// process is one daemon of the cluster, in a process group of its own, its
// output in <Dir>/logs/<name>.log.
type process struct {
	name string
	log  string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

func (c *Cluster) start(name string, env []string, args ...string) (*process, error) {
	logPath := filepath.Join(c.LogDir, name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	cmd := exec.Command(filepath.Join(c.cfg.BinDir, name), args...)
	cmd.Stdout = f
	cmd.Stderr = f
	cmd.Dir = c.cfg.Dir
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &process{name: name, log: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	c.mu.Lock()
	c.procs = append(c.procs, p)
	c.mu.Unlock()
	return p, nil
}

// exited returns an error naming the log if p has ended.
func (p *process) exited() error {
	select {
	case <-p.done:
		return fmt.Errorf("%s exited (%v); its log: %s", p.name, p.err, p.log)
	default:
		return nil
	}
}

// stop ends p's process group: SIGTERM, then SIGKILL after grace.
func (p *process) stop(grace time.Duration) {
	pgid := p.cmd.Process.Pid
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-p.done
	}
	// Children left in the group (none expected).
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
}

// pidsWithArg lists the processes whose command line has arg, e.g. the
// containerd shims of our containerd (-address <our socket>): they run in
// sessions of their own and outlive containerd.
func pidsWithArg(arg string) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		for _, a := range strings.Split(string(b), "\x00") {
			if a == arg {
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids
}

// killPIDs sends SIGKILL to pids and waits (up to timeout) until they are gone.
func killPIDs(pids []int, timeout time.Duration) error {
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	deadline := time.Now().Add(timeout)
	for _, pid := range pids {
		for syscall.Kill(pid, 0) == nil {
			if stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil && zombie(string(stat)) {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("process %d still alive", pid)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return nil
}

func zombie(stat string) bool {
	i := strings.LastIndexByte(stat, ')')
	return i >= 0 && i+2 < len(stat) && stat[i+2] == 'Z'
}

var errNotReady = errors.New("not ready")

// exitedProcess returns the error of the first process of the cluster
// that has ended, or nil.
func (c *Cluster) exitedProcess() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range c.procs {
		if err := p.exited(); err != nil {
			return err
		}
	}
	return nil
}

// poll calls f every interval until it returns nil, or timeout passes (the
// last error), or a process of the cluster exits.
func (c *Cluster) poll(what string, timeout time.Duration, f func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return nil
		}
		if perr := c.exitedProcess(); perr != nil {
			return fmt.Errorf("%s: %w", what, perr)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not within %s: %w", what, timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
