package cluster

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/loopvol/loopvol/internal/harness/proc"
)

// daemonStopGrace is how long Down waits after SIGTERM before it kills a
// daemon; kubelet gets kubeletStopGrace.
const daemonStopGrace = 10 * time.Second

// start runs the control plane's daemon name from BinDir (startOn runs a
// node's).
func (c *Cluster) start(name string, env []string, args ...string) (*proc.Process, error) {
	return c.run(name, name, filepath.Join(c.cfg.BinDir, name), env, args...)
}

// run runs bin through internal/harness/proc as the daemon name (of the
// binary daemon), in a process group of its own (Stop reaches what it
// started that stayed in the group), its output in <LogDir>/<name>.log,
// and adds it to procs, which poll watches.
func (c *Cluster) run(name, daemon, bin string, env []string, args ...string) (*proc.Process, error) {
	grace := daemonStopGrace
	if daemon == "kubelet" {
		grace = kubeletStopGrace
	}
	p, err := proc.Run(proc.Spec{
		Name:   name,
		Bin:    bin,
		Args:   args,
		LogDir: c.LogDir,
		Dir:    c.cfg.Dir,
		Env:    env,
		Group:  true,
		Grace:  grace,
	})
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.procs = append(c.procs, p)
	c.mu.Unlock()
	return p, nil
}

// exited returns an error naming p's log if p has ended.
func exited(p *proc.Process) error {
	if p.Running() {
		return nil
	}
	return fmt.Errorf("%s exited (%v); its log: %s", p.Name, p.Err(), p.LogPath)
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
		if err := exited(p); err != nil {
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
