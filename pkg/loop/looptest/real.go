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
