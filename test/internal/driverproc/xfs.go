package driverproc

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// MountReflinkXFS makes an xfs with reflink=1 in a sparse file image of
// size bytes and loop-mounts it on dir until the test ends. Registered
// before the drivers start, its cleanup runs after they stopped; a mount
// another cleanup already took away is no error.
func MountReflinkXFS(tb testing.TB, image, dir string, size int64) {
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
	if out, err := exec.Command("mkfs.xfs", "-q", "-m", "reflink=1", image).CombinedOutput(); err != nil {
		tb.Fatalf("mkfs.xfs -m reflink=1 %s: %v: %s", image, err, out)
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
