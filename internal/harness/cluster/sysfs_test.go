package cluster

import (
	"bufio"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/loopvol/loopvol/internal/harness/testenv"
)

// In network namespaces of their own (the kernel's, real mounts): a pod's
// read-only mount of sysfs made first makes the namespace's sysfs
// read-only for every later mount; after holdSysfs, a read-only mount is
// read-only on its own and the superblock stays writable.
func TestHoldSysfs(t *testing.T) {
	testenv.RequireRoot(t)
	for _, tc := range []struct {
		name   string
		hold   bool
		wantRO bool
	}{
		{name: "a read-only mount first", hold: false, wantRO: true},
		{name: "held first", hold: true, wantRO: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			pod := filepath.Join(dir, "pod-sys")
			if err := os.Mkdir(pod, 0o755); err != nil {
				t.Fatal(err)
			}
			type result struct {
				superRO bool
				err     error
			}
			done := make(chan result)
			go func() {
				// The thread gets a network namespace of its own and is
				// never given back (no UnlockOSThread): it ends with the
				// goroutine. The inner function's deferred unmount runs
				// before the result is sent, so nothing is mounted in dir
				// when the test removes it.
				runtime.LockOSThread()
				done <- func() result {
					if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
						return result{err: err}
					}
					if tc.hold {
						f, err := holdSysfs(dir)
						if err != nil {
							return result{err: err}
						}
						defer f.Close()
					}
					if err := unix.Mount("sysfs", pod, "sysfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
						return result{err: err}
					}
					defer unix.Unmount(pod, 0)
					ro, err := superReadOnly(pod)
					return result{superRO: ro, err: err}
				}()
			}()
			r := <-done
			if r.err != nil {
				t.Fatal(r.err)
			}
			if r.superRO != tc.wantRO {
				t.Errorf("the sysfs superblock read-only %t, want %t", r.superRO, tc.wantRO)
			}
			if _, err := os.Stat(filepath.Join(dir, "sysfs")); !os.IsNotExist(err) {
				t.Errorf("holdSysfs left its mount point: %v", err)
			}
		})
	}
}

// superReadOnly reads the superblock options of the mount at path from
// /proc/thread-self/mountinfo (the field after the filesystem's source).
func superReadOnly(path string) (bool, error) {
	f, err := os.Open("/proc/thread-self/mountinfo")
	if err != nil {
		return false, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 || fields[4] != path {
			continue
		}
		for i, fld := range fields {
			if fld == "-" && i+3 < len(fields) {
				for _, o := range strings.Split(fields[i+3], ",") {
					if o == "ro" {
						return true, nil
					}
				}
				return false, nil
			}
		}
	}
	return false, sc.Err()
}
