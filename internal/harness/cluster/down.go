package cluster

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Down stops the cluster and removes its state but the logs: a frozen node
// is thawed and a cut link put up, then pods are deleted (so kubelet
// unpublishes and unstages their volumes through the node plugin), then
// kubelet, the containers and their shims, the controllers, containerd,
// the apiserver and etcd; then what is left of the mounts under Dir, the loop devices of files under Dir, the kubepods
// cgroups, and the directories outside Dir that Up made. It returns what it
// could not clean up.
func (c *Cluster) Down(ctx context.Context) error {
	start := time.Now()
	var errs []error
	// A kubelet left stopped (StopKubelet, by a disruptive spec that
	// failed half-way) is started again, so that it deletes the pods and
	// unmounts their volumes through the driver; so is a node's cut link.
	running := c.Client != nil
	for _, n := range c.nodes {
		// A frozen node (a test that failed before ThawNode) first runs
		// again: its kubelet must unmount, and its processes take
		// SIGTERM only once continued.
		if err := c.thaw(n); err != nil {
			c.say("cluster: teardown: %v (going on)", err)
		}
		if n.Link != "" && n.ns != nil {
			if err := ip("link", "set", n.Link, "up"); err != nil {
				c.say("cluster: teardown: %v (going on)", err)
			}
		}
		if c.Client != nil && n.kubeletArgs != nil && !c.kubeletRunning(n) {
			if err := c.startKubelet(n); err != nil {
				c.say("cluster: teardown: %v (going on)", err)
			}
		}
		running = running && c.kubeletRunning(n)
	}
	if running {
		if err := c.deletePods(ctx, 90*time.Second); err != nil {
			c.say("cluster: teardown: %v (going on)", err)
		}
	}
	for _, n := range c.nodes {
		if n.kubelet != nil {
			n.kubelet.Stop()
		}
		if n.containerd != nil && n.containerd.Running() {
			if err := c.killTasks(n); err != nil {
				c.say("cluster: teardown: %v (going on)", err)
			}
		}
	}
	// Everything but the apiserver and etcd, newest first.
	for i := len(c.procs) - 1; i >= 0; i-- {
		if p := c.procs[i]; p.Name != "kube-apiserver" && p.Name != "etcd" {
			p.Stop()
		}
	}
	for _, n := range c.nodes {
		if err := killPIDs(pidsWithArg(n.ContainerdSocket), 10*time.Second); err != nil {
			errs = append(errs, fmt.Errorf("node %s: containerd shims: %w", n.Name, err))
		}
	}
	roots := c.cgroupRoots()
	if err := killCgroups(roots); err != nil {
		errs = append(errs, err)
	}
	// A node's mounts go with its mount namespace, once its holder (the
	// last process in it) has.
	for _, n := range c.nodes {
		if err := n.stopNodeNS(); err != nil {
			errs = append(errs, err)
		}
	}
	if c.multi() {
		if err := c.nodeBridgeDown(); err != nil {
			errs = append(errs, err)
		}
	}
	// Loop devices of volumes first: their images may lie on a node's
	// pool disk (NodePoolBytes), which unmountAll would only detach while
	// they hold it; then the disks' own.
	if err := c.detachLoops(); err != nil {
		errs = append(errs, err)
	}
	if err := c.unmountAll(); err != nil {
		errs = append(errs, err)
	}
	if err := c.detachLoops(); err != nil {
		errs = append(errs, err)
	}
	if err := removeCgroups(roots); err != nil {
		errs = append(errs, err)
	}
	for i := len(c.procs) - 1; i >= 0; i-- {
		c.procs[i].Stop()
	}
	c.procs = nil
	for _, d := range stateDirs {
		if err := c.removeTree(filepath.Join(c.cfg.Dir, d)); err != nil {
			errs = append(errs, err)
		}
	}
	if c.dirsLock.alone() {
		for _, d := range c.created {
			if err := c.removeTree(d); err != nil {
				errs = append(errs, err)
			}
		}
	} else if len(c.created) > 0 {
		c.say("cluster: teardown: %s left in place: another cluster on this host is up and may use them", strings.Join(c.created, ", "))
	}
	c.created = nil
	if c.sysfs != nil {
		c.sysfs.Close()
		c.sysfs = nil
	}
	err := errors.Join(errs...)
	if err != nil {
		c.say("cluster: down in %s, left behind: %v", since(start), err)
	} else {
		c.say("cluster: down in %s, nothing left behind (logs kept in %s)", since(start), c.LogDir)
	}
	// Released even when something was left behind, as the kernel would
	// if this process died: the next cluster is told what by its own Up.
	c.dirsLock.release()
	c.hostLock.release()
	return err
}

// deletePods deletes every pod but loopvol's own (whose node plugin must
// still unstage the others' volumes) and waits until they are gone, then
// loopvol's.
func (c *Cluster) deletePods(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	gone := func(keep func(ns string) bool) error {
		nss, err := c.Client.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, ns := range nss.Items {
			if !keep(ns.Name) {
				// Their controllers would bring deleted pods back (a
				// Deployment's in kube-system kept teardown waiting out
				// the whole timeout): the workloads go first.
				_, _ = c.Kubectl(ctx, "delete", "--ignore-not-found", "--wait=false", "-n", ns.Name,
					"deployments,replicasets,statefulsets,daemonsets,jobs", "--all")
				if err := c.Client.CoreV1().Pods(ns.Name).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
					return err
				}
			}
		}
		for {
			pods, err := c.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
			if err != nil {
				return err
			}
			left := 0
			for _, p := range pods.Items {
				if !keep(p.Namespace) {
					left++
				}
			}
			if left == 0 {
				return nil
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("%d pods not gone: %w", left, ctx.Err())
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
	if err := gone(func(ns string) bool { return ns == "loopvol" }); err != nil {
		return fmt.Errorf("deleting the pods: %w", err)
	}
	if err := gone(func(string) bool { return false }); err != nil {
		return fmt.Errorf("deleting loopvol's pods: %w", err)
	}
	return nil
}

// killTasks kills and removes every container task and container of n's
// containerd's k8s.io namespace.
func (c *Cluster) killTasks(n *node) error {
	out, err := c.ctr(n, "tasks", "ls", "-q")
	if err != nil {
		return err
	}
	ids := strings.Fields(out)
	for _, id := range ids {
		_, _ = c.ctr(n, "tasks", "kill", "-a", "-s", "SIGKILL", id)
	}
	var errs []error
	for _, id := range ids {
		deadline := time.Now().Add(10 * time.Second)
		for {
			if _, err := c.ctr(n, "tasks", "rm", "-f", id); err == nil || time.Now().After(deadline) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	out, err = c.ctr(n, "containers", "ls", "-q")
	if err != nil {
		return err
	}
	for _, id := range strings.Fields(out) {
		if _, err := c.ctr(n, "containers", "rm", id); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// mountsUnder lists the mount points at or below dir, deepest first.
func mountsUnder(dir string) ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMount(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out, sc.Err()
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// unmountAll unmounts everything under Dir (kubelet mounts its root dir
// onto itself, pods' volumes, containerd's rootfs and shm mounts).
func (c *Cluster) unmountAll() error {
	for round := 0; round < 5; round++ {
		mps, err := mountsUnder(c.cfg.Dir)
		if err != nil {
			return err
		}
		if len(mps) == 0 {
			return nil
		}
		for _, mp := range mps {
			if err := syscall.Unmount(mp, 0); err != nil {
				_ = syscall.Unmount(mp, syscall.MNT_DETACH)
			}
		}
	}
	mps, err := mountsUnder(c.cfg.Dir)
	if err == nil && len(mps) > 0 {
		err = fmt.Errorf("still mounted: %s", strings.Join(mps, " "))
	}
	return err
}

// detachLoops detaches the loop devices whose backing files lie under Dir
// (volumes the node plugin staged and never unstaged): by path, or, for a
// device the node plugin attached in its container, by device and inode
// of a file under Dir/pools.
func (c *Cluster) detachLoops() error {
	under := c.filesUnder(filepath.Join(c.cfg.Dir, "pools"))
	// A node's own pools (Config.NodePools).
	for id := range c.filesUnder(filepath.Join(c.cfg.Dir, "nodes")) {
		under[id] = true
	}
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	var errs []error
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		back := strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)")
		dev := "/dev/" + filepath.Base(filepath.Dir(filepath.Dir(f)))
		if back != c.cfg.Dir && !strings.HasPrefix(back, c.cfg.Dir+"/") && !backedByOneOf(dev, under) {
			continue
		}
		if out, err := exec.Command("losetup", "-d", dev).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("losetup -d %s (%s): %w: %s", dev, back, err, strings.TrimSpace(string(out))))
		}
	}
	return errors.Join(errs...)
}

// fileID is a file's device and inode.
type fileID struct{ dev, ino uint64 }

// filesUnder are the regular files below dir (no link followed). A loop
// device attached by a node plugin in its container prints its backing
// file by the container's path ("/volumes/<hash>.img"), so the path alone
// does not tell that it is one of this cluster's: its device and inode do.
func (c *Cluster) filesUnder(dir string) map[fileID]bool {
	ids := map[fileID]bool{}
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		var st unix.Stat_t
		if unix.Lstat(p, &st) == nil {
			ids[fileID{uint64(st.Dev), st.Ino}] = true
		}
		return nil
	})
	return ids
}

// backedByOneOf reports whether the loop device dev's backing file is one
// of ids (LOOP_GET_STATUS64).
func backedByOneOf(dev string, ids map[fileID]bool) bool {
	if len(ids) == 0 {
		return false
	}
	f, err := os.OpenFile(dev, os.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer f.Close()
	info, err := unix.IoctlLoopGetStatus64(int(f.Fd()))
	if err != nil {
		return false
	}
	return ids[fileID{info.Device, info.Inode}]
}

// removeTree removes dir unless something is still mounted below it
// (RemoveAll would descend into the mounted file system).
func (c *Cluster) removeTree(dir string) error {
	mps, err := mountsUnder(dir)
	if err != nil {
		return err
	}
	if len(mps) > 0 {
		return fmt.Errorf("not removing %s: still mounted: %s", dir, strings.Join(mps, " "))
	}
	return os.RemoveAll(dir)
}
