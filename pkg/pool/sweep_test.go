package pool

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// TestSweep: temporaries of killed writers go (a volume's only when its
// lock is free), lock files of deleted volumes go, orphan images are
// counted, and only those past the grace that hold no data are reclaimed,
// never one whose lock is held.
func TestSweep(t *testing.T) {
	p := newTestPool(t)
	now := time.Now()
	old := now.Add(-time.Hour)
	kept, err := p.CreateVolume(t.Context(), spec("kept", 1<<20))
	must(t, err)
	keptID := mustParse(t, kept.ID)

	plant := func(path string, data []byte, mtime time.Time) {
		t.Helper()
		must(t, os.WriteFile(path, data, 0o600))
		must(t, os.Chtimes(path, mtime, mtime))
	}
	// A writer killed mid-write of the kept volume's record, and one of a
	// locked volume (its writer is alive).
	deadTemp := tempPrefix(recordName(keptID)) + "dead"
	plant(volPath(p, deadTemp), []byte(`{"id": "te`), now)
	busyID := DeriveVolumeID(p.Name, "busy")
	busyTemp := tempPrefix(recordName(busyID)) + "live"
	plant(volPath(p, busyTemp), []byte(`{`), old)
	unlockBusy, err := p.Lock(busyID)
	must(t, err)
	defer unlockBusy()
	// Node record temporaries: one old, one being written now.
	nodeOld := filepath.Join(p.Path, nodesDir, tempPrefix("n1.json")+"old")
	nodeNew := filepath.Join(p.Path, nodesDir, tempPrefix("n2.json")+"new")
	plant(nodeOld, nil, old)
	plant(nodeNew, nil, now)
	// A lock file of a volume deleted by a process killed before it
	// removed the lock.
	goneID := DeriveVolumeID(p.Name, "gone")
	plant(volPath(p, lockName(goneID)), nil, old)

	// Orphans: a create that died long ago (fallocated, never written), a
	// recent one, one that holds data (its record was lost), and one a
	// CreateVolume is working on right now.
	orphan := func(name string, mtime time.Time, data bool) VolumeID {
		v, err := p.CreateVolume(t.Context(), spec(name, 1<<20))
		must(t, err)
		id := mustParse(t, v.ID)
		must(t, os.Remove(volPath(p, recordName(id))))
		if data {
			f, err := os.OpenFile(volPath(p, imageName(id)), os.O_WRONLY, 0)
			must(t, err)
			f.WriteAt([]byte("ext4 superblock"), 1024)
			f.Close()
		}
		must(t, os.Chtimes(volPath(p, imageName(id)), mtime, mtime))
		return id
	}
	dead := orphan("dead", old, false)
	young := orphan("young", now, false)
	lost := orphan("lost", old, true)
	creating := orphan("creating", old, false)
	unlockCreating, err := p.Lock(creating)
	must(t, err)
	defer unlockCreating()

	u, err := p.Usage()
	must(t, err)
	if u.OrphanImages != 4 || u.OrphanBytes != 4<<20 {
		t.Errorf("Usage counts %d orphans of %d bytes, want 4 of %d", u.OrphanImages, u.OrphanBytes, 4<<20)
	}

	r, err := p.Sweep(now, 15*time.Minute)
	must(t, err)
	if len(r.Errors) != 0 {
		t.Errorf("errors: %v", r.Errors)
	}
	slices.Sort(r.Temporaries)
	if want := []string{deadTemp, filepath.Base(nodeOld)}; !slices.Equal(r.Temporaries, want) {
		t.Errorf("temporaries removed: %v, want %v", r.Temporaries, want)
	}
	if len(r.Reclaimed) != 1 || r.Reclaimed[0].ID != dead {
		t.Errorf("reclaimed %v, want only %s", r.Reclaimed, dead)
	}
	var orphans []VolumeID
	for _, o := range r.Orphans {
		orphans = append(orphans, o.ID)
		if o.HasData != (o.ID == lost) {
			t.Errorf("orphan %s: HasData %t", o.ID, o.HasData)
		}
	}
	if !slices.Contains(orphans, young) || !slices.Contains(orphans, lost) || len(orphans) != 2 {
		t.Errorf("orphans kept and reported: %v, want %s and %s", orphans, young, lost)
	}
	if !slices.Contains(r.LockFiles, lockName(goneID)) {
		t.Errorf("lock files removed: %v, want %s", r.LockFiles, lockName(goneID))
	}
	for _, path := range []string{volPath(p, busyTemp), nodeNew, volPath(p, imageName(young)), volPath(p, imageName(lost)), volPath(p, imageName(creating)), volPath(p, imageName(keptID)), volPath(p, recordName(keptID))} {
		if _, err := os.Stat(path); err != nil {
			t.Errorf("%s should have been kept: %v", filepath.Base(path), err)
		}
	}
	for _, path := range []string{volPath(p, deadTemp), nodeOld, volPath(p, imageName(dead)), volPath(p, lockName(dead)), volPath(p, lockName(goneID))} {
		if _, err := os.Lstat(path); !os.IsNotExist(err) {
			t.Errorf("%s should have been removed: %v", filepath.Base(path), err)
		}
	}
	if _, err := p.ReadVolume(keptID); err != nil {
		t.Errorf("the kept volume: %v", err)
	}
}

// TestUnlockRemovesUnusedLockFile: looking up a volume that does not exist
// leaves no lock file.
func TestUnlockRemovesUnusedLockFile(t *testing.T) {
	p := newTestPool(t)
	id := DeriveVolumeID(p.Name, "nothing")
	unlock, err := p.Lock(id)
	must(t, err)
	if _, err := os.Stat(volPath(p, lockName(id))); err != nil {
		t.Fatal(err)
	}
	unlock()
	if _, err := os.Stat(volPath(p, lockName(id))); !os.IsNotExist(err) {
		t.Fatalf("lock file after unlock: %v", err)
	}
}
