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

// HostLockPath is the lock every cluster of this package holds from Up to
// the end of Down. Two clusters on one host would share what no directory
// separates: the apiserver's port, the kubepods cgroups (Down kills and
// removes them all), /run/containerd and kubelet's device-plugins
// directory. A second Up (another `make demo`, a test run in another
// clone) waits for the first one's Down instead of breaking it.
const HostLockPath = "/run/lock/loopvol-cluster.lock"

// hostLock is a held HostLockPath.
type hostLock struct{ f *os.File }

// lockHost takes HostLockPath, waiting while another cluster holds it
// (saying who, once) until ctx ends. flock(2) rather than a pid file: the
// kernel releases it when its holder dies, however it dies, so a killed
// run never leaves the host locked.
func lockHost(ctx context.Context, path string, say func(string, ...any)) (*hostLock, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("host lock: %w", err)
	}
	told := false
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
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
	// Who holds it, for the message of the next one that waits.
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

// release gives the lock up; a nil or released lock is a no-op.
func (l *hostLock) release() {
	if l == nil || l.f == nil {
		return
	}
	_ = l.f.Truncate(0)
	_ = l.f.Close() // closing the last descriptor releases the flock
	l.f = nil
}
