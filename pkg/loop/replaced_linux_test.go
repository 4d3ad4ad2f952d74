package loop_test

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/loopvol/loopvol/pkg/loop"
	"github.com/loopvol/loopvol/pkg/loop/looptest"
)

// replaceImage renames a copy of image over it, as a fence does (pkg/pool
// FenceImage): a device of image keeps the old inode, which no name reaches.
func replaceImage(t *testing.T, image string) {
	t.Helper()
	in, err := os.Open(image)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	tmp := image + ".fence"
	out, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, image); err != nil {
		t.Fatal(err)
	}
}

// wantReplaced checks what d's FindReplaced returns for image.
func wantReplaced(t *testing.T, d loop.Devices, image string, want ...string) {
	t.Helper()
	got, err := d.FindReplaced(image)
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("FindReplaced(%s) as %q = %q, %v; want %q", image, d.Owner(), got, err, want)
	}
}

// TestFindReplaced: a copy renamed over an attached image (a fence) leaves
// the device on the old inode. Its owner finds it with FindReplaced, not with
// Find; no other owner does, nor the owner an untagged device; and the new
// image's own device is never a replaced one.
func TestFindReplaced(t *testing.T) {
	looptest.RequireRoot(t)
	dir := looptest.DirectIODir(t)
	image := newImage(t, dir, "vol.img", 8*mib)
	a, b := loop.New(loop.Owner(ownerA)), loop.New(loop.Owner(ownerB))

	old := attach(t, a, image)
	untagged := attach(t, loop.New(), image)
	wantReplaced(t, a, image) // nothing replaced yet
	writeBlock(t, old, 'x')

	replaceImage(t, image)
	if got := readImageByte(t, image); got != 'x' {
		t.Errorf("the new image reads %q, want the 'x' written before the replacement", got)
	}
	wantFind(t, a, image, "")
	wantReplaced(t, a, image, old)
	wantReplaced(t, b, image)
	if devs, err := b.List(); err != nil || slices.Contains(devs, old) {
		t.Errorf("List as B = %v, %v; want no %s (A's)", devs, err, old)
	}
	wantReplaced(t, loop.New(), image, old, untagged) // the machine's view: every device
	if st, err := a.Status(old); err != nil || !st.Deleted || st.BackingFile != image {
		t.Errorf("Status of the replaced device = %+v, %v; want deleted %s", st, err, image)
	}
	// The device writes the old inode only.
	writeBlock(t, old, 'y')
	if got := readImageByte(t, image); got != 'x' {
		t.Errorf("the new image reads %q after a write to the replaced device, want 'x'", got)
	}

	current := attach(t, a, image)
	wantFind(t, a, image, current)
	wantReplaced(t, a, image, old)

	if err := a.Detach(old); err != nil {
		t.Fatalf("Detach of the replaced device: %v", err)
	}
	wantReplaced(t, a, image)
	wantFind(t, a, image, current)

	// No file at the path: nothing replaced it (Find has the deleted one).
	if err := os.Remove(image); err != nil {
		t.Fatal(err)
	}
	wantReplaced(t, a, image)
	wantFind(t, a, image, current)
}

// TestFindReplacedAfterItsMountIsGone: the device was attached through a
// mount that is gone since (a restarted plugin's container), so the kernel
// prints its path relative to that mount's root; it is still found as
// replaced, by its name and the filesystem it is on.
func TestFindReplacedAfterItsMountIsGone(t *testing.T) {
	looptest.RequireRoot(t)
	dir := looptest.DirectIODir(t)
	pool, view := filepath.Join(dir, "pool"), filepath.Join(dir, "container-view")
	for _, d := range []string{pool, view} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	image := newImage(t, pool, "vol.img", 8*mib)
	other := newImage(t, pool, "other.img", 8*mib) // another name, never replaced
	if err := unix.Mount(pool, view, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	mounted := true
	t.Cleanup(func() {
		if mounted {
			_ = unix.Unmount(view, unix.MNT_DETACH)
		}
	})
	a := loop.New(loop.Owner(ownerA))
	dev, err := a.Attach(context.Background(), filepath.Join(view, "vol.img"), false)
	if err != nil {
		t.Fatalf("Attach: %v", err)
	}
	t.Cleanup(func() { _ = a.Detach(dev) })
	if err := unix.Unmount(view, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	mounted = false
	wantReplaced(t, a, image)
	replaceImage(t, image)
	st, err := a.Status(dev)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("backing file after its mount went and the image was replaced: %q (deleted %v)", st.BackingFile, st.Deleted)
	wantFind(t, a, image, "")
	wantReplaced(t, a, image, dev)
	wantReplaced(t, a, other)
}
