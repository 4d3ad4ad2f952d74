package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// The locks a cluster holds from Up to the end of Down. Two clusters run
// side by side only where no host resource would be theirs both (each in a
// network namespace of its own, as the tests and the demo run, has its own
// apiserver port and addresses); a second Up (another `make demo`, a test
// run in another clone) waits for the first one's Down instead of breaking
// it.
const (
	// HostLockPath is held by a one-node cluster, which uses the host's
	// own kubepods cgroups (Down kills and removes them all),
	// /run/containerd and kubelet's device-plugins directory.
	HostLockPath = "/run/lock/loopvol-cluster.lock"
	// NodesLockPath is held by a cluster of nodes, whose nodes' cgroup
	// roots are named after the host (/loopvol-<host>-1 …); each node has
	// its own /run/containerd and device-plugins directory in its mount
	// namespace, so one cluster of each kind can run at once.
	NodesLockPath = "/run/lock/loopvol-cluster-nodes.lock"
	// DirsLockPath is held shared by every cluster that is up. Down
	// removes the directories outside Dir that its Up made
	// (/run/containerd …) only when it can hold this lock alone: another
	// cluster may run on them, and removing a directory that a node's
	// mount namespace has a bind mount on would take the mount away.
	DirsLockPath = "/run/lock/loopvol-cluster-dirs.lock"
)

// clusterLockPath is the lock of a cluster of that many nodes.
func clusterLockPath(nodes int) string {
	if nodes > 1 {
		return NodesLockPath
	}
	return HostLockPath
}

// hostLock is a held lock of the host.
type hostLock struct{ f *os.File }

// lockHost takes the lock at path, exclusive or (shared) shared with
// others that take it shared, waiting while another cluster holds it
// otherwise (saying who, once) until ctx ends. flock(2) rather than a pid
// file: the kernel releases it when its holder dies, however it dies, so a
// killed run never leaves the host locked.
func lockHost(ctx context.Context, path string, shared bool, say func(string, ...any)) (*hostLock, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("host lock: %w", err)
	}
	how := unix.LOCK_EX
	if shared {
		how = unix.LOCK_SH
	}
	told := false
	for {
		err := unix.Flock(int(f.Fd()), how|unix.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("host lock %s: %w", path, err)
		}
		if !told {
			say("cluster: waiting for another cluster on this host to go down (%s: %s)", path, holder(path))
			told = true
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("waiting for the host lock %s (%s): %w", path, holder(path), ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
	// Who holds it, for the message of the next one that waits (of
	// several that share it, none is named).
	if shared {
		return &hostLock{f: f}, nil
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(fmt.Sprintf("pid %d, %s\n", os.Getpid(), strings.Join(os.Args, " "))), 0)
	}
	return &hostLock{f: f}, nil
}

// holder is what the lock's holder wrote into it.
func holder(path string) string {
	b := make([]byte, 512)
	f, err := os.Open(path)
	if err != nil {
		return "holder unknown"
	}
	defer f.Close()
	n, _ := f.Read(b)
	if s := strings.TrimSpace(string(b[:n])); s != "" {
		return "held by " + s
	}
	return "holder unknown"
}

// alone reports whether the held shared lock can be made exclusive at
// once, and makes it so if it can: no other holder shares it. Only on the
// way out: flock(2) may drop the shared lock when it cannot convert it.
func (l *hostLock) alone() bool {
	return l != nil && l.f != nil && unix.Flock(int(l.f.Fd()), unix.LOCK_EX|unix.LOCK_NB) == nil
}

// release gives the lock up; a nil or released lock is a no-op.
func (l *hostLock) release() {
	if l == nil || l.f == nil {
		return
	}
	_ = l.f.Truncate(0)
	_ = l.f.Close() // closing the last descriptor releases the flock
	l.f = nil
}
