package looptest

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/loopvol/loopvol/pkg/loop"
)

// RequireRoot skips the test unless it runs as root on a machine with loop
// devices: the real-device tests need both.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for real loop devices")
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skipf("no loop devices: %v", err)
	}
}

// DetachUnder registers a cleanup that detaches every loop device whose
// image lies under dir, so a test leaves no device behind even when it fails
// half-way. Register it after t.TempDir (cleanups run last-in, first-out, so
// the devices go before the directory) and before any mount cleanup.
func DetachUnder(t testing.TB, dir string) {
	t.Helper()
	t.Cleanup(func() {
		for _, dev := range DevicesUnder(t, dir) {
			if err := loop.New().Detach(dev); err != nil {
				t.Errorf("cleanup: detach %s: %v", dev, err)
			}
		}
	})
}

// DevicesUnder lists the loop devices whose image lies under dir.
func DevicesUnder(t testing.TB, dir string) []string {
	t.Helper()
	prefixes := []string{filepath.Clean(dir) + "/"}
	if r, err := filepath.EvalSymlinks(dir); err == nil {
		prefixes = append(prefixes, r+"/")
	}
	entries, err := os.ReadDir("/sys/block")
	if err != nil {
		t.Fatalf("list /sys/block: %v", err)
	}
	var devs []string
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), "loop") {
			continue
		}
		data, err := os.ReadFile(filepath.Join("/sys/block", e.Name(), "loop", "backing_file"))
		if err != nil {
			continue // not attached
		}
		for _, p := range prefixes {
			if strings.HasPrefix(string(data), p) {
				devs = append(devs, "/dev/"+e.Name())
				break
			}
		}
	}
	return devs
}

// DirectIODir returns a fresh directory on a filesystem that supports direct
// I/O. t.TempDir() is used when it is not tmpfs; otherwise a small ext4
// filesystem is made in an image in t.TempDir(), attached and mounted, and
// torn down again by the test's cleanup. Every loop device whose image lies
// in the returned directory is detached by the cleanup (DetachUnder), after
// the cleanups the test registers later, such as its unmounts.
func DirectIODir(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatalf("statfs %s: %v", dir, err)
	}
	if st.Type != unix.TMPFS_MAGIC {
		DetachUnder(t, dir)
		return dir
	}
	image := filepath.Join(dir, "backing.img")
	if err := os.WriteFile(image, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(image, 8<<30); err != nil { // sparse: room for GiB-sized volumes
		t.Fatal(err)
	}
	DetachUnder(t, dir)
	dev, err := loop.New().Attach(context.Background(), image, false)
	if err != nil {
		t.Fatalf("attach backing image: %v", err)
	}
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-E", "nodiscard", dev).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4 %s: %v: %s", dev, err, out)
	}
	mnt := filepath.Join(dir, "fs")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(dev, mnt, "ext4", 0, ""); err != nil {
		t.Fatalf("mount %s: %v", dev, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(mnt, 0); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("cleanup: unmount %s: %v", mnt, err)
		}
	})
	DetachUnder(t, mnt)
	return mnt
}

// Tmpfs mounts a tmpfs of size (a mount option value such as "64m") on a
// fresh directory below t.TempDir() and returns it, for tests that need
// exact free space. The unmount is registered at once, so it runs however the
// test ends, and after the cleanups the test registers later (which stop
// what still uses the mount): a mount still busy then is retried for a few
// seconds, then detached lazily, and reported as a test error, never left
// behind in silence.
func Tmpfs(t testing.TB, size string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a tmpfs")
	}
	dir := filepath.Join(t.TempDir(), "tmpfs")
	if err := os.Mkdir(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size="+size+",mode=0750"); err != nil {
		t.Fatalf("mount a tmpfs at %s: %v", dir, err)
	}
	t.Cleanup(func() { unmountOrReport(t, dir) })
	return dir
}

// unmountOrReport unmounts dir, retrying while it is busy for up to 5 s,
// then detaches it lazily and reports the test as failed.
func unmountOrReport(t testing.TB, dir string) {
	var err error
	for range 50 {
		err = unix.Unmount(dir, 0)
		if err == nil || errors.Is(err, unix.EINVAL) || errors.Is(err, fs.ErrNotExist) {
			return // unmounted, or not mounted (the test did it)
		}
		if !errors.Is(err, unix.EBUSY) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Errorf("cleanup: unmount %s: %v; detached it lazily (something the test started still uses it)", dir, err)
	_ = unix.Unmount(dir, unix.MNT_DETACH)
}

// AllocatedBytes is how much of its filesystem the file takes (st_blocks).
func AllocatedBytes(t testing.TB, path string) int64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}
