package cluster

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/loopvol/loopvol/internal/harness/proc"
)

// freezeTimeout bounds FreezeNode's scans: a process in uninterruptible
// sleep stops only once it leaves it, which a loop device's I/O does within
// seconds.
const freezeTimeout = 30 * time.Second

// FreezeNode stops every process of the node name with SIGSTOP, as when a
// node hangs (a kernel stall, a paused VM): its daemons (kubelet,
// containerd, kube-proxy), the containerd shims and every process of its
// Pods, hostNetwork or not, including loopvol's node plugin; nothing of it
// answers, renews a lease or writes until ThawNode. Its link stays up and
// the kernel's own work for it (the loop devices' I/O, the page cache's
// writeback) goes on, as on a hung machine whose disks still run.
//
// A node's processes are those in its network namespace (every daemon the
// harness starts there, the shims, the hostNetwork Pods) and those in its
// cgroup root, in every hierarchy (the Pods with a network of their own);
// never one of the control plane's, which run in this process's
// namespaces and cgroups. The scan repeats until it finds no process of
// the node still running, so that one started while the freeze went on (a
// container kubelet was starting) is caught too. Down thaws a frozen node
// first. Only on a cluster of nodes.
func (c *Cluster) FreezeNode(name string) error {
	n := c.node(name)
	if n == nil || n.ns == nil {
		return fmt.Errorf("freeze node %q: not a node of its own namespaces (only a cluster of nodes has them)", name)
	}
	start := time.Now()
	// Marked first, so that Down thaws a freeze that failed half-way.
	c.mu.Lock()
	n.frozen = true
	if n.stopped == nil {
		n.stopped = map[int]bool{}
	}
	c.mu.Unlock()
	// The daemons first, so that kubelet starts no container while the
	// shims are being stopped; the scans catch what it started anyway.
	var first []int
	c.mu.Lock()
	for _, p := range []*proc.Process{n.kubelet, n.containerd} {
		if p != nil && p.Running() {
			first = append(first, p.Pid())
		}
	}
	c.mu.Unlock()
	for _, pid := range first {
		c.stopPID(n, pid)
	}
	deadline := time.Now().Add(freezeTimeout)
	for {
		pids, err := c.nodePIDs(n)
		if err != nil {
			return fmt.Errorf("freeze node %s: %w", name, err)
		}
		var running []int
		for _, pid := range pids {
			c.stopPID(n, pid)
			if !processStopped(pid) {
				running = append(running, pid)
			}
		}
		if len(running) == 0 {
			c.mu.Lock()
			count := len(n.stopped)
			c.mu.Unlock()
			c.say("cluster: node %s frozen: %d processes stopped in %s", name, count, since(start))
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("freeze node %s: processes %v still running after %s", name, running, freezeTimeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stopPID sends SIGSTOP to pid (again, if it was: harmless) and remembers
// it for ThawNode.
func (c *Cluster) stopPID(n *node, pid int) {
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		return // gone
	}
	c.mu.Lock()
	n.stopped[pid] = true
	c.mu.Unlock()
}

// ThawNode continues every process of the node name that FreezeNode
// stopped (SIGCONT), and any process of the node found stopped now: the
// node runs on as if the time had not passed, its kubelet noticing late
// that its Pods were deleted, its writers writing on. Thawing a node that
// is not frozen does nothing.
func (c *Cluster) ThawNode(name string) error {
	n := c.node(name)
	if n == nil {
		return fmt.Errorf("thaw node %q: no such node", name)
	}
	return c.thaw(n)
}

func (c *Cluster) thaw(n *node) error {
	c.mu.Lock()
	if !n.frozen {
		c.mu.Unlock()
		return nil
	}
	pids := make([]int, 0, len(n.stopped))
	for pid := range n.stopped {
		pids = append(pids, pid)
	}
	c.mu.Unlock()
	// The scan, in case a process was stopped that the record missed; a
	// node whose namespace holder is gone has nothing more to scan.
	var errs []error
	if n.ns != nil {
		found, err := c.nodePIDs(n)
		if err != nil {
			errs = append(errs, err)
		}
		pids = append(pids, found...)
	}
	slices.Sort(pids)
	pids = slices.Compact(pids)
	for _, pid := range pids {
		if err := syscall.Kill(pid, syscall.SIGCONT); err != nil && !errors.Is(err, syscall.ESRCH) {
			errs = append(errs, fmt.Errorf("thaw node %s: process %d: %w", n.Name, pid, err))
		}
	}
	c.mu.Lock()
	n.frozen, n.stopped = false, nil
	c.mu.Unlock()
	c.say("cluster: node %s thawed: %d processes continued", n.Name, len(pids))
	return errors.Join(errs...)
}

// nodePIDs lists the processes of n: in its network namespace or in its
// cgroup root (the cgroupRoots of one node), never this process.
func (c *Cluster) nodePIDs(n *node) ([]int, error) {
	var want syscall.Stat_t
	if err := syscall.Stat(fmt.Sprintf("/proc/%d/ns/net", n.PID), &want); err != nil {
		return nil, fmt.Errorf("node %s: its network namespace: %w", n.Name, err)
	}
	seen := map[int]bool{}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		var st syscall.Stat_t
		if syscall.Stat(filepath.Join("/proc", e.Name(), "ns", "net"), &st) == nil && st.Dev == want.Dev && st.Ino == want.Ino {
			seen[pid] = true
		}
	}
	if n.cgroupRoot != "" {
		var roots []string
		for _, h := range cgroupHierarchies() {
			roots = append(roots, filepath.Join(h, n.cgroupRoot))
		}
		for _, d := range cgroupsUnder(roots) {
			b, err := os.ReadFile(filepath.Join(d, "cgroup.procs"))
			if err != nil {
				continue
			}
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil && pid != os.Getpid() {
					seen[pid] = true
				}
			}
		}
	}
	pids := make([]int, 0, len(seen))
	for pid := range seen {
		pids = append(pids, pid)
	}
	slices.Sort(pids)
	return pids, nil
}

// processStopped tells whether every thread of pid is stopped (T, or t
// for a traced one), or the process is gone or a zombie: a group stop
// reaches the threads one by one, and one in uninterruptible sleep stops
// only when it wakes.
func processStopped(pid int) bool {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return true // gone
	}
	for _, t := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, t.Name()))
		if err != nil {
			continue
		}
		if s := taskState(string(b)); s != 'T' && s != 't' && s != 'Z' && s != 'X' && s != 0 {
			return false
		}
	}
	return true
}

// taskState is the state letter of a /proc stat line (after the command's
// closing parenthesis, which the command itself may contain).
func taskState(stat string) byte {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 || i+2 >= len(stat) {
		return 0
	}
	return stat[i+2]
}
