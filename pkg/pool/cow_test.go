package pool

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/loopvol/loopvol/internal/harness/testfs"
)

// reflinkPool opens a pool on a fresh xfs of size bytes (mkfs.xfs makes it
// with reflink=1), skipping the test where reflinks are not made.
func reflinkPool(t *testing.T, size int64) *Pool {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: mounts an xfs")
	}
	root := t.TempDir()
	mnt := filepath.Join(root, "mnt")
	must(t, os.Mkdir(mnt, 0o700))
	testfs.MountReflinkXFS(t, filepath.Join(root, "xfs.img"), mnt, size)
	p, err := Open(Options{Name: "cow", Zone: "z1", Path: filepath.Join(mnt, "pool")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// overwrite writes size bytes of b over the image at path, as the volume's
// filesystem would, and syncs: the error is what the loop device would see.
func overwrite(path string, size int64, b byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	buf := bytes.Repeat([]byte{b}, 1<<20)
	for off := int64(0); off < size; off += int64(len(buf)) {
		if _, err := f.WriteAt(buf, off); err != nil {
			return err
		}
	}
	return f.Sync()
}

// TestThickVolumeKeepsItsPromiseAfterASnapshot: on a reflink pool a
// snapshot shares the thick volume's blocks; the pool must not offer them
// to other volumes, so that the volume can still write over every block it
// was promised once the pool gave away all it offers. Before the
// copy-on-write reserve the second volume took the shared blocks and the
// overwrite failed with ENOSPC (a journal abort in the Pod's filesystem).
func TestThickVolumeKeepsItsPromiseAfterASnapshot(t *testing.T) {
	p := reflinkPool(t, 512<<20)
	const size = 96 << 20
	v, err := p.CreateVolume(t.Context(), spec("thick", size))
	if err != nil {
		t.Fatal(err)
	}
	id, _ := ParseVolumeID(v.ID)
	must(t, overwrite(p.ImagePath(id), size, 'a'))
	before, err := p.Usage()
	if err != nil {
		t.Fatal(err)
	}
	s, err := p.CreateSnapshot(t.Context(), "snap", v, nil)
	if err != nil {
		t.Fatal(err)
	}
	if s.Method != CopyReflink {
		t.Skipf("the snapshot was made by %s, not by a reflink: this xfs has no reflink", s.Method)
	}
	after, err := p.Usage()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("before the snapshot: %+v; after: %+v", before, after)
	if after.CowReserveBytes < size {
		t.Fatalf("copy-on-write reserve %d after a reflinked snapshot of a %d-byte thick volume, want at least its size", after.CowReserveBytes, size)
	}
	if lost := before.AvailableBytes - after.AvailableBytes; lost < size {
		t.Fatalf("available fell by %d bytes with the snapshot, want at least %d (the shared blocks)", lost, size)
	}

	// Another volume takes everything the pool offers now...
	if after.AvailableBytes > 1<<20 {
		if _, err := p.CreateVolume(t.Context(), spec("filler", after.AvailableBytes&^(1<<20-1))); err != nil {
			t.Fatalf("a volume of what the pool offers (%d bytes): %v", after.AvailableBytes, err)
		}
	}
	// ...and the thick volume can still write over all of its data.
	if err := overwrite(p.ImagePath(id), size, 'b'); err != nil {
		t.Fatalf("the thick volume could not write over its own blocks after a snapshot: %v", err)
	}
	// Its blocks are its own again: the reserve is gone.
	final, err := p.Usage()
	if err != nil {
		t.Fatal(err)
	}
	if final.CowReserveBytes != 0 {
		t.Errorf("copy-on-write reserve %d after the volume wrote over every shared block, want 0", final.CowReserveBytes)
	}
}

// TestSnapshotRefusedWithoutRoomForCopyOnWrite: a reflinked snapshot of a
// thick volume in a pool that cannot hold the volume's blocks a second time
// is refused with ErrNoSpace, and leaves nothing: taking it would break the
// volume's promise.
func TestSnapshotRefusedWithoutRoomForCopyOnWrite(t *testing.T) {
	p := reflinkPool(t, 512<<20)
	u, err := p.Usage()
	if err != nil {
		t.Fatal(err)
	}
	// The volume takes a bit more than half of the pool: its blocks fit
	// only once.
	size := (u.AvailableBytes/2 + 32<<20) &^ (1<<20 - 1)
	v, err := p.CreateVolume(t.Context(), spec("big", size))
	if err != nil {
		t.Fatal(err)
	}
	id, _ := ParseVolumeID(v.ID)
	must(t, overwrite(p.ImagePath(id), size, 'a'))
	_, err = p.CreateSnapshot(t.Context(), "snap", v, nil)
	if !errors.Is(err, ErrNoSpace) {
		t.Fatalf("a snapshot the pool cannot keep the copy-on-write reserve of = %v, want ErrNoSpace", err)
	}
	t.Logf("refused: %v", err)
	if _, err := p.ReadSnapshot(DeriveSnapshotID(p.Name, "snap")); !errors.Is(err, ErrNotFound) {
		t.Fatalf("the refused snapshot left a record: %v", err)
	}
	if _, err := os.Stat(p.SnapshotImagePath(DeriveSnapshotID(p.Name, "snap"))); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the refused snapshot left an image: %v", err)
	}
	// xfs frees the blocks of an unlinked file in the background (its
	// inode garbage collection): the volume's blocks stay shared until
	// then. syncfs flushes it.
	var after Usage
	for i := 0; i < 50; i++ {
		must(t, unix.Syncfs(p.vols.fd()))
		if after, err = p.Usage(); err != nil || after.CowReserveBytes == 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil || after.CowReserveBytes != 0 {
		t.Fatalf("after the refusal: %+v, %v; want no copy-on-write reserve", after, err)
	}
	if err := overwrite(p.ImagePath(id), size, 'b'); err != nil {
		t.Fatalf("the volume could not write over its blocks: %v", err)
	}
}
