package cluster

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/loopvol/loopvol/internal/harness/testenv"
)

// TestFreezeNode: a stand-in node (a process holding a network namespace
// of its own, with a child there, and a process of this machine's network
// moved into the node's cgroup root, as a Pod's container is) is frozen
// whole, and thawed whole; a process outside both, as the control plane's
// are, is never stopped.
func TestFreezeNode(t *testing.T) {
	testenv.RequireRoot(t)
	root := "/loopvol-freeze-test-" + strconv.Itoa(os.Getpid())
	if err := makeCgroupRoot(root); err != nil {
		t.Skipf("cgroups: %v", err)
	}
	var roots []string
	for _, h := range cgroupHierarchies() {
		roots = append(roots, filepath.Join(h, root))
	}
	t.Cleanup(func() {
		_ = killCgroups(roots)
		if err := removeCgroups(roots); err != nil {
			t.Error(err)
		}
	})
	start := func(t *testing.T, attr *syscall.SysProcAttr, args ...string) *exec.Cmd {
		t.Helper()
		cmd := exec.Command(args[0], args[1:]...)
		cmd.SysProcAttr = attr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Signal(syscall.SIGCONT)
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
		return cmd
	}
	// The holder's shell starts a child in its namespace, as kubelet's
	// nsenter does a daemon.
	holder := start(t, &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}, "/bin/sh", "-c", "sleep 1000 & wait")
	pod := start(t, nil, "sleep", "1000")
	for _, r := range roots {
		if err := os.WriteFile(filepath.Join(r, "cgroup.procs"), []byte(strconv.Itoa(pod.Process.Pid)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	host := start(t, nil, "sleep", "1000")

	n := &node{Node: Node{Name: "stand-in", PID: holder.Process.Pid}, ns: &nodeNS{cmd: holder}, cgroupRoot: root}
	c := &Cluster{cfg: Config{Out: io.Discard}, nodes: []*node{n}}
	var pids []int
	for deadline := time.Now().Add(10 * time.Second); len(pids) < 3; time.Sleep(20 * time.Millisecond) {
		var err error
		if pids, err = c.nodePIDs(n); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the stand-in node's processes: %v, want the holder, its child and the pod's", pids)
		}
	}
	if len(pids) != 3 || !slices.Contains(pids, holder.Process.Pid) || !slices.Contains(pids, pod.Process.Pid) || slices.Contains(pids, host.Process.Pid) {
		t.Fatalf("the stand-in node's processes: %v; want the holder %d, its child and the pod's %d, not the host's %d", pids, holder.Process.Pid, pod.Process.Pid, host.Process.Pid)
	}

	if err := c.FreezeNode(n.Name); err != nil {
		t.Fatal(err)
	}
	for _, pid := range pids {
		if !processStopped(pid) {
			t.Errorf("process %d of the node runs after FreezeNode", pid)
		}
	}
	if processStopped(host.Process.Pid) {
		t.Errorf("the host's process %d was stopped", host.Process.Pid)
	}

	if err := c.ThawNode(n.Name); err != nil {
		t.Fatal(err)
	}
	for _, pid := range pids {
		// SIGCONT takes effect at once; the state shows it when the
		// process is next scheduled.
		for deadline := time.Now().Add(5 * time.Second); processStopped(pid); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Errorf("process %d still stopped after ThawNode", pid)
				break
			}
		}
	}
	if n.frozen || n.stopped != nil {
		t.Errorf("after ThawNode: frozen %t, %d processes recorded", n.frozen, len(n.stopped))
	}
}
