package cluster

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/loopvol/loopvol/internal/harness/testenv"
)

// TestDetachLoopsByInode: a loop device whose backing file the kernel
// names by another path (a node plugin's container sees the pool at
// /volumes; here a hard link outside the cluster's directory) is still
// found by its file's device and inode and detached; one of a file that is
// not the cluster's is left alone.
func TestDetachLoopsByInode(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireLoopDevices(t)
	dir := t.TempDir()
	c := &Cluster{cfg: Config{Dir: filepath.Join(dir, "cluster")}}
	image := filepath.Join(c.PoolDir(), "volumes", "a.img")
	other := filepath.Join(dir, "elsewhere")
	for _, d := range []string{filepath.Dir(image), other} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{image, filepath.Join(other, "b.img")} {
		if err := os.WriteFile(f, make([]byte, 1<<20), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	link := filepath.Join(other, "a.img")
	if err := os.Link(image, link); err != nil {
		t.Fatal(err)
	}
	attach := func(f string) string {
		out, err := exec.Command("losetup", "-f", "--show", f).CombinedOutput()
		if err != nil {
			t.Fatalf("losetup %s: %v: %s", f, err, out)
		}
		dev := strings.TrimSpace(string(out))
		t.Cleanup(func() { _ = exec.Command("losetup", "-d", dev).Run() })
		return dev
	}
	ours, theirs := attach(link), attach(filepath.Join(other, "b.img"))
	if err := c.detachLoops(); err != nil {
		t.Fatal(err)
	}
	attached := func(dev string) bool {
		_, err := os.Stat(filepath.Join("/sys/block", filepath.Base(dev), "loop", "backing_file"))
		return err == nil
	}
	if attached(ours) {
		t.Errorf("%s (backed by the cluster's %s through a hard link) still attached", ours, image)
	}
	if !attached(theirs) {
		t.Errorf("%s (backed by a file that is not the cluster's) was detached", theirs)
	}
}
