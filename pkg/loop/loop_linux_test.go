package loop_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/loopvol/loopvol/pkg/loop"
	"github.com/loopvol/loopvol/pkg/loop/looptest"
)

const mib = 1 << 20

// newImage makes a fallocate'd image of size bytes in dir, as the controller does.
func newImage(t *testing.T, dir, name string, size int64) string {
	t.Helper()
	path := filepath.Join(dir, name)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Fallocate(int(f.Fd()), 0, 0, size); err != nil {
		t.Fatalf("fallocate %s: %v", path, err)
	}
	return path
}

func TestDeviceNameValidation(t *testing.T) {
	d := loop.New()
	for _, p := range []string{"", "/etc/passwd", "/dev/loop", "/dev/loop1/../sda", "/dev/loop-control", "loop0", "/dev/sda"} {
		if err := d.Detach(p); !errors.Is(err, loop.ErrInvalidDevice) {
			t.Errorf("Detach(%q) = %v, want ErrInvalidDevice", p, err)
		}
		if _, err := d.Size(p); !errors.Is(err, loop.ErrInvalidDevice) {
			t.Errorf("Size(%q) = %v, want ErrInvalidDevice", p, err)
		}
	}
}

func TestAttachFindDetach(t *testing.T) {
	looptest.RequireRoot(t)
	dir := looptest.DirectIODir(t)
	image := newImage(t, dir, "vol.img", 64*mib)
	d := loop.New()

	if _, ok, err := d.Find(image); err != nil || ok {
		t.Fatalf("Find before attach = %v, %v; want not found", ok, err)
	}
	dev, err := d.Attach(context.Background(), image, false)
	if err != nil {
		t.Fatalf("Attach: %v", err)
	}
	st, err := d.Status(dev)
	if err != nil {
		t.Fatalf("Status: %v", err)
	}
	if !st.DirectIO {
		t.Errorf("Status.DirectIO = false on %s, want direct I/O", fsType(t, dir))
	}
	if st.ReadOnly || st.Deleted || st.BackingFile != image {
		t.Errorf("Status = %+v, want writable device of %s", st, image)
	}
	if size, err := d.Size(dev); err != nil || size != 64*mib {
		t.Errorf("Size = %d, %v; want %d", size, err, 64*mib)
	}
	// A relative or unclean path names the same image.
	rel, err := filepath.Rel(mustGetwd(t), image)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{image, filepath.Join(dir, ".", "x", "..", "vol.img"), rel} {
		got, ok, err := d.Find(p)
		if err != nil || !ok || got != dev {
			t.Errorf("Find(%q) = %q, %v, %v; want %q", p, got, ok, err, dev)
		}
	}
	// The device really stores data in the image, with direct I/O.
	writeBlock(t, dev, 'x')
	if got := readImageByte(t, image); got != 'x' {
		t.Errorf("image byte = %q after writing the device, want 'x'", got)
	}

	if err := d.Detach(dev); err != nil {
		t.Fatalf("Detach: %v", err)
	}
	if _, ok, err := d.Find(image); err != nil || ok {
		t.Errorf("Find after detach = %v, %v; want not found", ok, err)
	}
	if err := d.Detach(dev); err != nil {
		t.Errorf("second Detach = %v, want nil (idempotent)", err)
	}
	if _, err := d.Size(dev); !errors.Is(err, loop.ErrNotAttached) {
		t.Errorf("Size after detach = %v, want ErrNotAttached", err)
	}
	if _, err := d.Status(dev); !errors.Is(err, loop.ErrNotAttached) {
		t.Errorf("Status after detach = %v, want ErrNotAttached", err)
	}
}

func TestAttachReadOnly(t *testing.T) {
	looptest.RequireRoot(t)
	dir := looptest.DirectIODir(t)
	image := newImage(t, dir, "ro.img", 8*mib)
	d := loop.New()
	dev, err := d.Attach(context.Background(), image, true)
	if err != nil {
		t.Fatalf("Attach: %v", err)
	}
	if st, err := d.Status(dev); err != nil || !st.ReadOnly {
		t.Errorf("Status = %+v, %v; want read-only", st, err)
	}
	// Depending on the kernel, opening for writing or the write itself fails.
	if f, err := os.OpenFile(dev, os.O_WRONLY, 0); err == nil {
		_, err = f.WriteAt(make([]byte, loop.BlockSize), 0)
		if err == nil {
			err = f.Sync()
		}
		f.Close()
		if err == nil {
			t.Errorf("writing a read-only device succeeded")
		}
	}
	if err := d.Detach(dev); err != nil {
		t.Errorf("Detach: %v", err)
	}
}

func TestResizeAfterGrow(t *testing.T) {
	looptest.RequireRoot(t)
	dir := looptest.DirectIODir(t)
	image := newImage(t, dir, "grow.img", 16*mib)
	d := loop.New()
	dev, err := d.Attach(context.Background(), image, false)
	if err != nil {
		t.Fatalf("Attach: %v", err)
	}
	f, err := os.OpenFile(image, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	err = unix.Fallocate(int(f.Fd()), 0, 0, 48*mib)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	if size, _ := d.Size(dev); size != 16*mib {
		t.Errorf("Size before Resize = %d, want the old %d", size, 16*mib)
	}
	if err := d.Resize(dev); err != nil {
		t.Fatalf("Resize: %v", err)
	}
	if size, err := d.Size(dev); err != nil || size != 48*mib {
		t.Errorf("Size after Resize = %d, %v; want %d", size, err, 48*mib)
	}
	if err := d.Detach(dev); err != nil {
		t.Errorf("Detach: %v", err)
	}
	if err := d.Resize(dev); !errors.Is(err, loop.ErrNotAttached) {
		t.Errorf("Resize after detach = %v, want ErrNotAttached", err)
	}
}

func TestFindDeletedImage(t *testing.T) {
	looptest.RequireRoot(t)
	dir := looptest.DirectIODir(t)
	image := newImage(t, dir, "gone.img", 8*mib)
	d := loop.New()
	dev, err := d.Attach(context.Background(), image, false)
	if err != nil {
		t.Fatalf("Attach: %v", err)
	}
	if err := os.Remove(image); err != nil {
		t.Fatal(err)
	}
	// With no file at the path, the device of the deleted image is found, so
	// that it can be cleaned up.
	if got, ok, err := d.Find(image); err != nil || !ok || got != dev {
		t.Errorf("Find(deleted) = %q, %v, %v; want %q", got, ok, err, dev)
	}
	if st, err := d.Status(dev); err != nil || !st.Deleted || st.BackingFile != image {
		t.Errorf("Status = %+v, %v; want deleted %s", st, err, image)
	}
	// A new image at the same path is another volume: the old device is not its.
	newImage(t, dir, "gone.img", 8*mib)
	if got, ok, err := d.Find(image); err != nil || ok {
		t.Errorf("Find(re-created) = %q, %v, %v; want not found", got, ok, err)
	}
	if err := d.Detach(dev); err != nil {
		t.Errorf("Detach: %v", err)
	}
}

func TestDetachBusy(t *testing.T) {
	looptest.RequireRoot(t)
	dir := looptest.DirectIODir(t)
	image := newImage(t, dir, "busy.img", 8*mib)
	d := loop.New()
	dev, err := d.Attach(context.Background(), image, false)
	if err != nil {
		t.Fatalf("Attach: %v", err)
	}
	holder, err := os.Open(dev)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Detach(dev); !errors.Is(err, loop.ErrBusy) {
		t.Errorf("Detach of an open device = %v, want ErrBusy", err)
	}
	holder.Close()
	// The kernel detaches it on the last close; Detach confirms.
	if err := d.Detach(dev); err != nil {
		t.Errorf("Detach after close = %v, want nil", err)
	}
	if _, ok, _ := d.Find(image); ok {
		t.Errorf("device still attached after the last close")
	}
}

func TestConcurrentAttach(t *testing.T) {
	looptest.RequireRoot(t)
	dir := looptest.DirectIODir(t)
	const n = 8
	images := make([]string, n)
	for i := range images {
		images[i] = newImage(t, dir, fmt.Sprintf("c%d.img", i), 4*mib)
	}
	d := loop.New()
	devs := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range images {
		wg.Go(func() { devs[i], errs[i] = d.Attach(context.Background(), images[i], false) })
	}
	wg.Wait()
	seen := map[string]bool{}
	for i := range images {
		if errs[i] != nil {
			t.Errorf("Attach %s: %v", images[i], errs[i])
			continue
		}
		if seen[devs[i]] {
			t.Errorf("device %s handed out twice", devs[i])
		}
		seen[devs[i]] = true
		if got, ok, err := d.Find(images[i]); err != nil || !ok || got != devs[i] {
			t.Errorf("Find(%s) = %q, %v, %v; want %q", images[i], got, ok, err, devs[i])
		}
	}
	for _, dev := range devs {
		if dev == "" {
			continue
		}
		if err := d.Detach(dev); err != nil {
			t.Errorf("Detach %s: %v", dev, err)
		}
	}
}

func TestAttachCanceled(t *testing.T) {
	looptest.RequireRoot(t)
	dir := looptest.DirectIODir(t)
	image := newImage(t, dir, "cancel.img", 4*mib)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if dev, err := loop.New().Attach(ctx, image, false); !errors.Is(err, context.Canceled) {
		t.Errorf("Attach with a canceled context = %q, %v; want context.Canceled", dev, err)
	}
}

func fsType(t *testing.T, dir string) string {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	switch st.Type {
	case unix.EXT4_SUPER_MAGIC:
		return "ext4"
	case unix.XFS_SUPER_MAGIC:
		return "xfs"
	case unix.TMPFS_MAGIC:
		return "tmpfs"
	}
	return fmt.Sprintf("filesystem 0x%x", st.Type)
}

func mustGetwd(t *testing.T) string {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return wd
}

// writeBlock writes one block of b at offset 0 of dev with O_DIRECT and syncs it.
func writeBlock(t *testing.T, dev string, b byte) {
	t.Helper()
	f, err := os.OpenFile(dev, os.O_WRONLY|unix.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// O_DIRECT needs an aligned buffer: an mmap'd page is.
	buf, err := unix.Mmap(-1, 0, loop.BlockSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(buf)
	for i := range buf {
		buf[i] = b
	}
	if _, err := f.WriteAt(buf, 0); err != nil {
		t.Fatalf("write %s: %v", dev, err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
}

func readImageByte(t *testing.T, image string) byte {
	t.Helper()
	f, err := os.Open(image)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, 0); err != nil {
		t.Fatal(err)
	}
	return b[0]
}

// TestFindAfterItsMountIsGone: a node plugin in a container attaches an
// image through its bind mount of the pool. When the container restarts,
// that mount is gone and the kernel prints the backing file relative to the
// mount's root ("/img"). The new plugin must still find the device by the
// image's device and inode — and not take another image of the same name.
func TestFindAfterItsMountIsGone(t *testing.T) {
	looptest.RequireRoot(t)
	dir := looptest.DirectIODir(t)
	pool, view := filepath.Join(dir, "pool"), filepath.Join(dir, "container-view")
	for _, d := range []string{pool, view} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	image := newImage(t, pool, "vol.img", 8*mib)
	other := newImage(t, dir, "vol.img", 8*mib) // same name, another file
	if err := unix.Mount(pool, view, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	mounted := true
	t.Cleanup(func() {
		if mounted {
			_ = unix.Unmount(view, unix.MNT_DETACH)
		}
	})
	d := loop.New()
	dev, err := d.Attach(context.Background(), filepath.Join(view, "vol.img"), false)
	if err != nil {
		t.Fatalf("Attach: %v", err)
	}
	t.Cleanup(func() { _ = d.Detach(dev) })
	if err := unix.Unmount(view, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	mounted = false
	st, err := d.Status(dev)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("backing file after its mount went: %q", st.BackingFile)
	if got, ok, err := d.Find(image); err != nil || !ok || got != dev {
		t.Errorf("Find(image) = %q, %v, %v; want %q (same device and inode)", got, ok, err, dev)
	}
	if got, ok, err := d.Find(other); err != nil || ok {
		t.Errorf("Find(another file of the same name) = %q, %v, %v; want not found", got, ok, err)
	}
}
