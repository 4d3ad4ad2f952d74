package pool

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// writeAt writes data into a volume's image at off.
func writeAt(t *testing.T, p *Pool, id VolumeID, off int64, data []byte) {
	t.Helper()
	f, err := p.OpenImage(id, os.O_RDWR)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(data, off); err != nil {
		t.Fatal(err)
	}
}

func readAt(t *testing.T, path string, off int64, n int) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, n)
	if _, err := f.ReadAt(buf, off); err != nil {
		t.Fatal(err)
	}
	return buf
}

func TestSnapshotAndRestore(t *testing.T) {
	p := newTestPool(t)
	v, err := p.CreateVolume(t.Context(), spec("vol", 64<<20))
	if err != nil {
		t.Fatal(err)
	}
	vid, _ := ParseVolumeID(v.ID)
	data := bytes.Repeat([]byte("loopvol!"), 512)
	writeAt(t, p, vid, 10<<20, data)

	s, err := p.CreateSnapshot(t.Context(), "snap", v, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !s.ReadyToUse || s.SourceVolumeID != v.ID || s.SizeBytes != v.SizeBytes || s.Method == "" {
		t.Fatalf("snapshot %+v", s)
	}
	sid, err := ParseSnapshotID(s.ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ParseVolumeID(s.ID); err == nil {
		t.Fatalf("snapshot ID %s parses as a volume ID", s.ID)
	}
	if _, err := ParseSnapshotID(v.ID); err == nil {
		t.Fatalf("volume ID %s parses as a snapshot ID", v.ID)
	}
	if got := readAt(t, p.SnapshotImagePath(sid), 10<<20, len(data)); !bytes.Equal(got, data) {
		t.Fatal("the snapshot image does not hold the volume's data")
	}
	// Writing the volume afterwards does not change the snapshot.
	writeAt(t, p, vid, 10<<20, bytes.Repeat([]byte("X"), len(data)))
	if got := readAt(t, p.SnapshotImagePath(sid), 10<<20, len(data)); !bytes.Equal(got, data) {
		t.Fatal("the snapshot changed with its volume")
	}
	// Idempotent; another source is ErrExists.
	if again, err := p.CreateSnapshot(t.Context(), "snap", v, nil); err != nil || again.ID != s.ID {
		t.Fatalf("second CreateSnapshot = %v, %v", again, err)
	}
	other, err := p.CreateVolume(t.Context(), spec("other", 16<<20))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.CreateSnapshot(t.Context(), "snap", other, nil); !errors.Is(err, ErrExists) {
		t.Fatalf("snapshot of another volume with the same name: %v, want ErrExists", err)
	}
	// A snapshot promises nothing: its holes will never be written.
	u, err := p.Usage()
	if err != nil {
		t.Fatal(err)
	}
	if u.OrphanImages != 0 {
		t.Fatalf("%d orphan images", u.OrphanImages)
	}
	// Restore, larger: the data is there, the volume is the new size.
	r, err := p.CreateVolume(t.Context(), VolumeSpec{Name: "restored", SizeBytes: 128 << 20, AccessType: AccessMount, FsType: "ext4",
		AccessModes: []string{"SINGLE_NODE_WRITER"}, Source: &Source{ID: s.ID, SizeBytes: s.SizeBytes}})
	if err != nil {
		t.Fatal(err)
	}
	rid, _ := ParseVolumeID(r.ID)
	if got := readAt(t, p.ImagePath(rid), 10<<20, len(data)); !bytes.Equal(got, data) {
		t.Fatal("the restored volume does not hold the snapshot's data")
	}
	if size, err := p.ImageSize(rid); err != nil || size != 128<<20 || r.Source != s.ID {
		t.Fatalf("restored image size %d (%v), source %q", size, err, r.Source)
	}
	// Deleting the source leaves the snapshot standing.
	if err := p.DeleteVolume(vid); err != nil {
		t.Fatal(err)
	}
	if got, err := p.ReadSnapshot(sid); err != nil || !got.ReadyToUse {
		t.Fatalf("snapshot after its volume was deleted: %v, %v", got, err)
	}
	ids, err := p.ListSnapshotIDs()
	if err != nil || len(ids) != 1 || ids[0] != sid {
		t.Fatalf("ListSnapshotIDs = %v, %v", ids, err)
	}
	if vids, _ := p.ListVolumeIDs(); len(vids) != 2 {
		t.Fatalf("ListVolumeIDs = %v, want the other and the restored volume only", vids)
	}
	if err := p.DeleteSnapshot(sid); err != nil {
		t.Fatal(err)
	}
	if _, err := p.ReadSnapshot(sid); !errors.Is(err, ErrNotFound) {
		t.Fatalf("ReadSnapshot after delete: %v", err)
	}
	if p.exists(sid.stem()+imageSuffix) || p.exists(sid.stem()+lockSuffix) {
		t.Fatal("DeleteSnapshot left files")
	}
}

// A CreateSnapshot that died half-way left a record saying not ready and a
// partial image: the retry under the lock makes it whole.
func TestSnapshotCrashRecovery(t *testing.T) {
	p := newTestPool(t)
	v, err := p.CreateVolume(t.Context(), spec("vol", 16<<20))
	if err != nil {
		t.Fatal(err)
	}
	vid, _ := ParseVolumeID(v.ID)
	data := []byte("the data before the crash")
	writeAt(t, p, vid, 4096, data)
	sid := DeriveSnapshotID(p.Name, "snap")
	half := &Snapshot{ID: sid.String(), Name: "snap", SourceVolumeID: v.ID, SizeBytes: v.SizeBytes}
	if err := p.writeSnapshot(half); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p.SnapshotImagePath(sid), []byte("partial"), 0o400); err != nil {
		t.Fatal(err)
	}
	unlock, err := p.LockSnapshot(sid)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.LockSnapshot(sid); !errors.Is(err, ErrBusy) {
		t.Fatalf("second LockSnapshot = %v, want ErrBusy", err)
	}
	s, err := p.CreateSnapshot(t.Context(), "snap", v, nil)
	unlock()
	if err != nil {
		t.Fatal(err)
	}
	if !s.ReadyToUse {
		t.Fatal("the retried snapshot is not ready")
	}
	if got := readAt(t, p.SnapshotImagePath(sid), 4096, len(data)); !bytes.Equal(got, data) {
		t.Fatal("the retried snapshot does not hold the data")
	}
}

func TestParseSnapshotID(t *testing.T) {
	good := DeriveSnapshotID("p1", "x").String()
	if _, err := ParseSnapshotID(good); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"", "p1", "p1.snap-", "p1." + DeriveVolumeID("p1", "x").Hash, "../p1.snap-" + DeriveVolumeID("p1", "x").Hash, "P1.snap-" + DeriveVolumeID("p1", "x").Hash, good + "0"} {
		if _, err := ParseSnapshotID(bad); !errors.Is(err, ErrInvalidID) {
			t.Errorf("ParseSnapshotID(%q) = %v, want ErrInvalidID", bad, err)
		}
	}
	if DeriveSnapshotID("p1", "x").Hash == DeriveVolumeID("p1", "x").Hash {
		t.Fatal("a snapshot and a volume of one name share a hash")
	}
}

// Sweep removes a half-made snapshot nobody retried once it is past the
// grace, never one that is whole, young or locked.
func TestSweepUnfinishedSnapshot(t *testing.T) {
	p := newTestPool(t)
	v, err := p.CreateVolume(t.Context(), spec("vol", 16<<20))
	if err != nil {
		t.Fatal(err)
	}
	whole, err := p.CreateSnapshot(t.Context(), "whole", v, nil)
	if err != nil {
		t.Fatal(err)
	}
	sid := DeriveSnapshotID(p.Name, "half")
	if err := p.writeSnapshot(&Snapshot{ID: sid.String(), Name: "half", SourceVolumeID: v.ID, SizeBytes: v.SizeBytes}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p.SnapshotImagePath(sid), []byte("partial"), 0o400); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	r, err := p.Sweep(now, time.Hour)
	if err != nil || len(r.UnfinishedSnapshots) != 0 {
		t.Fatalf("young: %+v, %v", r, err)
	}
	unlock, err := p.LockSnapshot(sid)
	if err != nil {
		t.Fatal(err)
	}
	r, err = p.Sweep(now.Add(2*time.Hour), time.Hour)
	unlock()
	if err != nil || len(r.UnfinishedSnapshots) != 0 {
		t.Fatalf("locked: %+v, %v", r, err)
	}
	r, err = p.Sweep(now.Add(2*time.Hour), time.Hour)
	if err != nil || len(r.UnfinishedSnapshots) != 1 || r.UnfinishedSnapshots[0] != sid {
		t.Fatalf("old and unlocked: %+v, %v", r, err)
	}
	if p.exists(sid.stem()+imageSuffix) || p.exists(sid.stem()+recordSuffix) {
		t.Fatal("the unfinished snapshot's files are still there")
	}
	wid, _ := ParseSnapshotID(whole.ID)
	if _, err := p.ReadSnapshot(wid); err != nil {
		t.Fatalf("the whole snapshot went too: %v", err)
	}
}

// TestDeleteSnapshotRemovesDeadTemporaries: a call killed while it wrote a
// snapshot's record leaves the record's temporary; DeleteSnapshot (under
// the snapshot's lock, so no writer is live) removes it with the snapshot,
// and leaves another snapshot's alone.
func TestDeleteSnapshotRemovesDeadTemporaries(t *testing.T) {
	p := newTestPool(t)
	v, err := p.CreateVolume(t.Context(), spec("vol", 4<<20))
	if err != nil {
		t.Fatal(err)
	}
	s, err := p.CreateSnapshot(t.Context(), "snap", v, nil)
	if err != nil {
		t.Fatal(err)
	}
	id, _ := ParseSnapshotID(s.ID)
	other := DeriveSnapshotID(p.Name, "other")
	dead := tempPrefix(id.stem()+recordSuffix) + "0123456789abcdef"
	kept := tempPrefix(other.stem()+recordSuffix) + "0123456789abcdef"
	for _, name := range []string{dead, kept} {
		must(t, os.WriteFile(filepath.Join(p.Path, "volumes", name), []byte("{"), 0o600))
	}
	unlock, err := p.LockSnapshot(id)
	if err != nil {
		t.Fatal(err)
	}
	must(t, p.DeleteSnapshot(id))
	unlock()
	names, err := p.vols.names()
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(names, dead) || !slices.Contains(names, kept) {
		t.Fatalf("after DeleteSnapshot the pool holds %v; want %s gone and %s kept", names, dead, kept)
	}
}
