// Package testfs makes the small real filesystems the tests put pools on:
// a sparse file, mkfs, a loop mount that the test's cleanup takes away
// (the unmount releases the loop device), and a filesystem filled to
// ENOSPC as another writer would fill it. Root only.
package testfs

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// Mount makes a filesystem with mkfs (the command and its flags; the image
// is appended) in a sparse file image of size bytes and loop-mounts it on
// dir until the test ends. Registered before the test starts its drivers,
// the cleanup runs after they stopped; a mount another cleanup already
// took away is no error.
func Mount(tb testing.TB, image, dir string, size int64, mkfs ...string) {
	tb.Helper()
	f, err := os.Create(image)
	if err != nil {
		tb.Fatal(err)
	}
	err = f.Truncate(size)
	f.Close()
	if err != nil {
		tb.Fatal(err)
	}
	if out, err := exec.Command(mkfs[0], append(mkfs[1:], image)...).CombinedOutput(); err != nil {
		tb.Fatalf("%s %s: %v: %s", strings.Join(mkfs, " "), image, err, out)
	}
	if out, err := exec.Command("mount", "-o", "loop", image, dir).CombinedOutput(); err != nil {
		tb.Fatalf("mount %s: %v: %s", image, err, out)
	}
	tb.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil && !strings.Contains(string(out), "not mounted") {
			tb.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
}

// MountReflinkXFS mounts an xfs with reflink=1 of size bytes (see Mount).
func MountReflinkXFS(tb testing.TB, image, dir string, size int64) {
	tb.Helper()
	Mount(tb, image, dir, size, "mkfs.xfs", "-q", "-m", "reflink=1")
}

// MountSmallExt4 mounts a 16 MiB ext4 with 64 inodes (see Mount): small
// enough to fill at once.
func MountSmallExt4(tb testing.TB, image, dir string) {
	tb.Helper()
	Mount(tb, image, dir, 16<<20, "mkfs.ext4", "-q", "-N", "64")
}

// FillToENOSPC fills the filesystem mounted on dir as another writer
// would, as root (so into the blocks ext4 reserves for root): one file
// until its blocks run out, then empty files until its inodes do.
func FillToENOSPC(tb testing.TB, dir string) {
	tb.Helper()
	f, err := os.Create(filepath.Join(dir, "filler"))
	if err != nil {
		tb.Fatal(err)
	}
	buf := make([]byte, 64<<10)
	for err == nil {
		_, err = f.Write(buf)
	}
	f.Close()
	if !errors.Is(err, syscall.ENOSPC) {
		tb.Fatalf("filling %s: %v, want ENOSPC", dir, err)
	}
	for i := 0; ; i++ {
		g, err := os.Create(filepath.Join(dir, fmt.Sprintf("filler-%d", i)))
		if err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				tb.Fatalf("filling the inodes of %s: %v, want ENOSPC", dir, err)
			}
			return
		}
		g.Close()
	}
}
