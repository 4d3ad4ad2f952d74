package cluster

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cgroupFS is where the cgroup hierarchies are mounted.
const cgroupFS = "/sys/fs/cgroup"

// cgroupHierarchies are the mounted cgroup hierarchies: cgroupFS itself
// on a machine of cgroup v2 alone, each hierarchy below it on cgroup v1
// (with the hybrid layout's unified one).
func cgroupHierarchies() []string {
	if _, err := os.Stat(filepath.Join(cgroupFS, "cgroup.controllers")); err == nil {
		return []string{cgroupFS}
	}
	var out []string
	entries, _ := os.ReadDir(cgroupFS)
	for _, e := range entries {
		h := filepath.Join(cgroupFS, e.Name())
		if _, err := os.Stat(filepath.Join(h, "cgroup.procs")); err == nil && e.IsDir() {
			out = append(out, h)
		}
	}
	return out
}

// cgroupRoots are the cgroups, in every hierarchy, that hold the
// cluster's pods: kubepods on a one-node cluster (kubelet's default root),
// each node's own root on a cluster of nodes (kubelet makes kubepods below).
func (c *Cluster) cgroupRoots() []string {
	var names []string
	if c.multi() {
		for _, n := range c.nodes {
			names = append(names, n.cgroupRoot)
		}
	} else {
		names = []string{"/kubepods"}
	}
	var roots []string
	for _, h := range cgroupHierarchies() {
		for _, name := range names {
			roots = append(roots, filepath.Join(h, name))
		}
	}
	return roots
}

// makeCgroupRoot makes a node's cgroup root in every hierarchy; kubelet
// refuses a root that does not exist. cpuset's, which starts empty and
// takes no process so, gets its parent's CPUs and memory nodes.
func makeCgroupRoot(root string) error {
	for _, h := range cgroupHierarchies() {
		dir := filepath.Join(h, root)
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("cgroup %s: %w", dir, err)
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			b, err := os.ReadFile(filepath.Join(h, f))
			if err != nil {
				continue // not the cpuset hierarchy
			}
			if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
				return fmt.Errorf("cgroup %s: %s: %w", dir, f, err)
			}
		}
	}
	return nil
}

// cgroupsUnder lists the cgroups at and below roots, deepest first.
func cgroupsUnder(roots []string) []string {
	var dirs []string
	for _, r := range roots {
		_ = filepath.WalkDir(r, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
	}
	sort.SliceStable(dirs, func(i, j int) bool { return strings.Count(dirs[i], "/") > strings.Count(dirs[j], "/") })
	return dirs
}

// killCgroups kills every process left in the cgroups under roots: the
// containers of pods, which only this cluster's kubelets made.
func killCgroups(roots []string) error {
	var pids []int
	seen := map[int]bool{}
	for _, d := range cgroupsUnder(roots) {
		b, err := os.ReadFile(filepath.Join(d, "cgroup.procs"))
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil && !seen[pid] {
				seen[pid] = true
				pids = append(pids, pid)
			}
		}
	}
	if err := killPIDs(pids, 10*time.Second); err != nil {
		return fmt.Errorf("processes in the pods' cgroups: %w", err)
	}
	return nil
}

// removeCgroups removes the cgroups at and below roots.
func removeCgroups(roots []string) error {
	var errs []error
	for _, d := range cgroupsUnder(roots) {
		deadline := time.Now().Add(5 * time.Second)
		for {
			err := syscall.Rmdir(d)
			if err == nil || errors.Is(err, syscall.ENOENT) {
				break
			}
			if time.Now().After(deadline) {
				errs = append(errs, fmt.Errorf("cgroup %s: %w", d, err))
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return errors.Join(errs...)
}
