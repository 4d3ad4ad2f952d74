package pool

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func newTestPool(t *testing.T) *Pool {
	t.Helper()
	p, err := Open(Options{Name: "test", Zone: "z1", Path: filepath.Join(t.TempDir(), "pool")})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func spec(name string, size int64) VolumeSpec {
	return VolumeSpec{Name: name, SizeBytes: size, AccessType: AccessMount, FsType: "ext4", AccessModes: []string{"SINGLE_NODE_WRITER"}}
}

func TestOpenRefusesAnotherPoolsDirectory(t *testing.T) {
	dir := t.TempDir()
	if _, err := Open(Options{Name: "one", Zone: "z", Path: dir}); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(Options{Name: "one", Zone: "z", Path: dir}); err != nil {
		t.Fatalf("reopening the same pool: %v", err)
	}
	if _, err := Open(Options{Name: "two", Zone: "z", Path: dir}); !errors.Is(err, ErrPoolMismatch) {
		t.Fatalf("Open with another name = %v, want ErrPoolMismatch", err)
	}
	if _, err := Open(Options{Name: "Bad_Name", Zone: "z", Path: dir}); !errors.Is(err, ErrInvalidID) {
		t.Fatalf("Open with a bad name = %v, want ErrInvalidID", err)
	}
}

func TestCreateReadDelete(t *testing.T) {
	p := newTestPool(t)
	v, err := p.CreateVolume(t.Context(), spec("pvc-1", 1<<20))
	if err != nil {
		t.Fatal(err)
	}
	id, _ := ParseVolumeID(v.ID)
	got, err := p.ReadVolume(id)
	if err != nil {
		t.Fatal(err)
	}
	if got.Name != "pvc-1" || got.SizeBytes != 1<<20 || got.Generation != 1 {
		t.Fatalf("read back %+v", got)
	}
	if size, err := p.ImageSize(id); err != nil || size != 1<<20 {
		t.Fatalf("image size = %d, %v", size, err)
	}
	if err := p.DeleteVolume(id); err != nil {
		t.Fatal(err)
	}
	if err := p.DeleteVolume(id); err != nil {
		t.Fatalf("second delete: %v", err)
	}
	if _, err := p.ReadVolume(id); !errors.Is(err, ErrNotFound) {
		t.Fatalf("read after delete = %v, want ErrNotFound", err)
	}
	left, _ := os.ReadDir(filepath.Join(p.Path, volumesDir))
	if len(left) != 0 {
		t.Fatalf("files left after delete: %v", left)
	}
}

func TestCreateAfterCrashReplacesHalfMadeImage(t *testing.T) {
	p := newTestPool(t)
	id := DeriveVolumeID(p.Name, "pvc-crash")
	// A crash after the image was started but before the record was written.
	if err := os.WriteFile(p.ImagePath(id), []byte("partial"), 0o600); err != nil {
		t.Fatal(err)
	}
	v, err := p.CreateVolume(t.Context(), spec("pvc-crash", 2<<20))
	if err != nil {
		t.Fatal(err)
	}
	if v.ID != id.String() {
		t.Fatalf("retried create gave ID %s, want %s", v.ID, id)
	}
	if size, _ := p.ImageSize(id); size != 2<<20 {
		t.Fatalf("image size = %d", size)
	}
}

func TestCorruptRecordIsReportedNotPanicked(t *testing.T) {
	p := newTestPool(t)
	v, err := p.CreateVolume(t.Context(), spec("pvc-2", 1<<20))
	if err != nil {
		t.Fatal(err)
	}
	id, _ := ParseVolumeID(v.ID)
	// Half of the record, as if the process died mid-write without the
	// rename protocol.
	data, _ := os.ReadFile(filepath.Join(p.Path, volumesDir, recordName(id)))
	if err := os.WriteFile(filepath.Join(p.Path, volumesDir, recordName(id)), data[:len(data)/2], 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := p.ReadVolume(id); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("ReadVolume = %v, want ErrCorrupt", err)
	}
	if n, err := p.CountAttachments("n1"); err != nil || n != 0 {
		t.Fatalf("CountAttachments = %d, %v", n, err)
	}
	if err := p.DeleteVolume(id); err != nil {
		t.Fatalf("deleting a corrupt volume: %v", err)
	}
}

func TestLockIsExclusive(t *testing.T) {
	p := newTestPool(t)
	id := DeriveVolumeID(p.Name, "pvc-lock")
	unlock, err := p.Lock(id)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Lock(id); !errors.Is(err, ErrBusy) {
		t.Fatalf("second Lock = %v, want ErrBusy", err)
	}
	// Another "process" (another Pool value on the same directory) is
	// stopped by flock.
	other, err := Open(Options{Name: p.Name, Zone: p.Zone, Path: p.Path})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Lock(id); !errors.Is(err, ErrBusy) {
		t.Fatalf("Lock from another pool handle = %v, want ErrBusy", err)
	}
	unlock()
	unlock2, err := other.Lock(id)
	if err != nil {
		t.Fatalf("Lock after unlock: %v", err)
	}
	unlock2()
	if _, err := p.Lock(VolumeID{Pool: "elsewhere", Hash: id.Hash}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Lock of another pool's volume = %v", err)
	}
}

func TestCapacityAccounting(t *testing.T) {
	p := newTestPool(t)
	before, err := p.Usage()
	if err != nil {
		t.Fatal(err)
	}
	if before.AvailableBytes <= 0 || before.AvailableBytes > before.TotalBytes {
		t.Fatalf("usage %+v", before)
	}
	// A sparse image promises its unallocated bytes.
	id := DeriveVolumeID(p.Name, "sparse")
	f, err := os.Create(p.ImagePath(id))
	if err != nil {
		t.Fatal(err)
	}
	f.Truncate(64 << 20)
	f.Close()
	u, _ := p.Usage()
	if u.PromisedBytes != 64<<20 {
		t.Fatalf("promised = %d, want %d", u.PromisedBytes, 64<<20)
	}
	p.ReserveBytes = u.FreeBytes
	if avail, _ := p.Available(); avail != 0 {
		t.Fatalf("available with everything reserved = %d", avail)
	}
	if _, err := p.CreateVolume(t.Context(), spec("too-big", 1<<20)); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("create in a full pool = %v, want ErrNoSpace", err)
	}
}

func TestExpandVolume(t *testing.T) {
	p := newTestPool(t)
	v, err := p.CreateVolume(t.Context(), spec("grow", 1<<20))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.ExpandVolume(t.Context(), v, 3<<20); err != nil {
		t.Fatal(err)
	}
	id, _ := ParseVolumeID(v.ID)
	got, _ := p.ReadVolume(id)
	if got.SizeBytes != 3<<20 || got.Generation != 2 {
		t.Fatalf("after expand: %+v", got)
	}
	if size, _ := p.ImageSize(id); size != 3<<20 {
		t.Fatalf("image size %d", size)
	}
	if err := p.ExpandVolume(t.Context(), got, 1<<20); err != nil {
		t.Fatalf("shrink request should be a no-op: %v", err)
	}
}

func TestNodeRecords(t *testing.T) {
	p := newTestPool(t)
	if err := p.WriteNode(NodeRecord{ID: "node-a", Zone: "z1", MaxVolumes: 3}); err != nil {
		t.Fatal(err)
	}
	rec, err := p.ReadNode("node-a")
	if err != nil || rec.MaxVolumes != 3 {
		t.Fatalf("ReadNode = %+v, %v", rec, err)
	}
	if _, err := p.ReadNode("node-b"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown node = %v", err)
	}
	if _, err := p.ReadNode("../x"); !errors.Is(err, ErrInvalidID) {
		t.Fatalf("bad node = %v", err)
	}
	if err := p.WriteNode(NodeRecord{ID: "../evil"}); !errors.Is(err, ErrInvalidID) {
		t.Fatalf("WriteNode bad ID = %v", err)
	}
	nodes, _ := p.ListNodes()
	if len(nodes) != 1 || nodes[0] != "node-a" {
		t.Fatalf("ListNodes = %v", nodes)
	}
}
