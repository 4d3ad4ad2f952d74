package controller

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/loopvol/loopvol/pkg/loop"
	"github.com/loopvol/loopvol/pkg/loop/looptest"
	"github.com/loopvol/loopvol/pkg/pool"
	"github.com/loopvol/loopvol/pkg/volspec/volspectest"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
)

// frozen reports whether the filesystem mounted at dir is frozen: a freeze
// of a frozen filesystem is EBUSY. One that was not is thawed again.
func frozen(t *testing.T, dir string) bool {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	err = unix.IoctlSetInt(fd, ioctlFIFREEZE, 0)
	if errors.Is(err, unix.EBUSY) {
		return true
	}
	if err != nil {
		t.Fatalf("FIFREEZE %s: %v", dir, err)
	}
	if err := unix.IoctlSetInt(fd, ioctlFITHAW, 0); err != nil {
		t.Fatalf("FITHAW %s: %v", dir, err)
	}
	return false
}

// mountedVolume makes a volume with the server, attaches its image to a
// real loop device, makes fsType on it and mounts it, as a node that staged
// it would; everything is undone when the test ends (a frozen filesystem is
// thawed first).
func mountedVolume(t *testing.T, s *Server, p *pool.Pool, name, fsType string) (volumeID, dir string) {
	t.Helper()
	c := ctx(t)
	resp, err := s.CreateVolume(c, createReq(name, 320*mib, volspectest.Mount(fsType, snw)))
	if err != nil {
		t.Fatal(err)
	}
	id, _ := pool.ParseVolumeID(resp.Volume.VolumeId)
	dev, err := loop.New().Attach(c, p.ImagePath(id), false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := loop.New().Detach(dev); err != nil {
			t.Errorf("detach %s: %v", dev, err)
		}
	})
	if out, err := exec.Command("mkfs."+fsType, "-q", dev).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.%s: %v: %s", fsType, err, out)
	}
	dir = t.TempDir()
	if err := unix.Mount(dev, dir, fsType, 0, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0); err == nil {
			unix.IoctlSetInt(fd, ioctlFITHAW, 0) // EINVAL when not frozen
			unix.Close(fd)
		}
		if err := unix.Unmount(dir, 0); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return resp.Volume.VolumeId, dir
}

func TestFreezeAroundSnapshot(t *testing.T) {
	looptest.RequireRoot(t)
	p, err := pool.Open(pool.Options{Name: "p1", Zone: "z1", Path: filepath.Join(t.TempDir(), "pool")})
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{Pools: []*pool.Pool{p}, Loop: loop.New()})
	if err != nil {
		t.Fatal(err)
	}
	c := ctx(t)
	for _, fsType := range []string{"ext4", "xfs"} {
		t.Run(fsType, func(t *testing.T) {
			vol, dir := mountedVolume(t, s, p, "pvc-freeze-"+fsType, fsType)
			// Written, not synced: only the freeze puts it in the image.
			if err := os.WriteFile(filepath.Join(dir, "data"), []byte("before the snapshot\n"), 0o600); err != nil {
				t.Fatal(err)
			}

			var frozenDuringClone bool
			s.beforeClone = func() error { frozenDuringClone = frozen(t, dir); return nil }
			t.Cleanup(func() { s.beforeClone = nil })
			resp, err := s.CreateSnapshot(c, &csi.CreateSnapshotRequest{Name: "snap-ok-" + fsType, SourceVolumeId: vol})
			if err != nil {
				t.Fatal(err)
			}
			if !frozenDuringClone {
				t.Error("the filesystem was not frozen during the clone")
			}
			if frozen(t, dir) {
				t.Fatal("the filesystem is still frozen after the snapshot")
			}
			// The snapshot is a clean filesystem (no journal to replay)
			// that holds the unsynced file.
			sid, _ := pool.ParseSnapshotID(resp.Snapshot.SnapshotId)
			img := p.SnapshotImagePath(sid)
			checkClean(t, fsType, img)

			// A failure while frozen (here injected before the clone)
			// fails the snapshot and thaws the filesystem.
			s.beforeClone = func() error { return errors.New("injected clone failure") }
			_, err = s.CreateSnapshot(c, &csi.CreateSnapshotRequest{Name: "snap-fail-" + fsType, SourceVolumeId: vol})
			wantCode(t, err, codes.Internal)
			if frozen(t, dir) {
				t.Fatal("the filesystem is still frozen after a failed snapshot")
			}
			if err := os.WriteFile(filepath.Join(dir, "after"), []byte("writable\n"), 0o600); err != nil {
				t.Fatal(err)
			}
		})
	}
	// A volume attached but not mounted (raw block) is not frozen and
	// snapshots as before.
	t.Run("block", func(t *testing.T) {
		resp, err := s.CreateVolume(c, createReq("pvc-freeze-block", 4*mib, volspectest.Block(snw)))
		if err != nil {
			t.Fatal(err)
		}
		id, _ := pool.ParseVolumeID(resp.Volume.VolumeId)
		dev, err := loop.New().Attach(c, p.ImagePath(id), false)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { loop.New().Detach(dev) })
		if _, err := s.CreateSnapshot(c, &csi.CreateSnapshotRequest{Name: "snap-block", SourceVolumeId: resp.Volume.VolumeId}); err != nil {
			t.Fatal(err)
		}
	})
}

// checkClean checks a snapshot image as a restore would find it and reads
// the file written (not synced) before the snapshot: it is there only if
// the freeze flushed it. A frozen ext4 has a clean journal, so e2fsck -n
// passes on the snapshot itself, which is then mounted read-only. A frozen
// xfs has its metadata in place but leaves the records that cover its log
// to replay (xfs_repair -n reports the superblock counters they hold), so a
// writable copy is mounted first, which replays them, and checked after.
func checkClean(t *testing.T, fsType, img string) {
	t.Helper()
	fsck := func(img string) {
		t.Helper()
		check := exec.Command("e2fsck", "-fn", img)
		if fsType == "xfs" {
			check = exec.Command("xfs_repair", "-n", "-f", img)
		}
		if out, err := check.CombinedOutput(); err != nil {
			t.Errorf("%s of the snapshot: %v\n%s", check.Args[0], err, out)
		}
	}
	readOnly, opts := true, ""
	if fsType == "ext4" {
		fsck(img)
	} else {
		cp := filepath.Join(t.TempDir(), "restore.img")
		if out, err := exec.Command("cp", "--sparse=always", img, cp).CombinedOutput(); err != nil {
			t.Fatalf("copy the snapshot: %v: %s", err, out)
		}
		img, readOnly, opts = cp, false, "nouuid" // the source, with the same UUID, is mounted
	}
	dev, err := loop.New().Attach(ctx(t), img, readOnly)
	if err != nil {
		t.Fatal(err)
	}
	defer loop.New().Detach(dev)
	dir := t.TempDir()
	flags := uintptr(0)
	if readOnly {
		flags = unix.MS_RDONLY
	}
	if err := unix.Mount(dev, dir, fsType, flags, opts); err != nil {
		t.Fatalf("mount the snapshot: %v", err)
	}
	got, err := os.ReadFile(filepath.Join(dir, "data"))
	if err != nil || string(got) != "before the snapshot\n" {
		t.Errorf("the snapshot's data file: %q, %v", got, err)
	}
	if err := unix.Unmount(dir, 0); err != nil {
		t.Fatal(err)
	}
	if fsType == "xfs" {
		fsck(img)
	}
}

// TestFreezeGroupSnapshot: a group of three mounted volumes is frozen
// together (all three at once during the clones), thawed together after,
// also when the clone fails, and every member is a clean filesystem with
// the data written before.
func TestFreezeGroupSnapshot(t *testing.T) {
	looptest.RequireRoot(t)
	p, err := pool.Open(pool.Options{Name: "p1", Zone: "z1", Path: filepath.Join(t.TempDir(), "pool")})
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{Pools: []*pool.Pool{p}, Loop: loop.New()})
	if err != nil {
		t.Fatal(err)
	}
	c := ctx(t)
	var vols, dirs []string
	for _, name := range []string{"pvc-db", "pvc-log", "pvc-index"} {
		vol, dir := mountedVolume(t, s, p, name, "ext4")
		if err := os.WriteFile(filepath.Join(dir, "data"), []byte("before the snapshot\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		vols, dirs = append(vols, vol), append(dirs, dir)
	}
	allFrozen := func() (n int) {
		for _, d := range dirs {
			if frozen(t, d) {
				n++
			}
		}
		return n
	}
	var during int
	s.beforeClone = func() error { during = allFrozen(); return nil }
	resp, err := s.CreateVolumeGroupSnapshot(c, groupReq("group-frozen", vols...))
	if err != nil {
		t.Fatal(err)
	}
	if during != 3 {
		t.Errorf("%d of 3 members were frozen during the clones", during)
	}
	if n := allFrozen(); n != 0 {
		t.Fatalf("%d members are still frozen after the group snapshot", n)
	}
	for _, snap := range resp.GroupSnapshot.Snapshots {
		sid, _ := pool.ParseSnapshotID(snap.SnapshotId)
		checkClean(t, "ext4", p.SnapshotImagePath(sid))
	}

	s.beforeClone = func() error { return errors.New("injected clone failure") }
	_, err = s.CreateVolumeGroupSnapshot(c, groupReq("group-failed", vols...))
	wantCode(t, err, codes.Internal)
	if n := allFrozen(); n != 0 {
		t.Fatalf("%d members are still frozen after a failed group snapshot", n)
	}
}

// TestThawAbandonedFreeze: what a controller killed mid-clone leaves (the
// source frozen, the snapshot's record saying not ready, nobody holding its
// lock) is thawed by the restarted controller's Start; a filesystem frozen
// by someone else, with no such record, stays frozen.
func TestThawAbandonedFreeze(t *testing.T) {
	looptest.RequireRoot(t)
	p, err := pool.Open(pool.Options{Name: "p1", Zone: "z1", Path: filepath.Join(t.TempDir(), "pool")})
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{Pools: []*pool.Pool{p}, Loop: loop.New()})
	if err != nil {
		t.Fatal(err)
	}
	abandoned, dir := mountedVolume(t, s, p, "pvc-abandoned", "ext4")
	_, adminDir := mountedVolume(t, s, p, "pvc-admin-frozen", "ext4")
	for _, d := range []string{dir, adminDir} {
		fd, err := unix.Open(d, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			t.Fatal(err)
		}
		err = unix.IoctlSetInt(fd, ioctlFIFREEZE, 0)
		unix.Close(fd)
		if err != nil {
			t.Fatal(err)
		}
	}
	// The record a CreateSnapshot writes before its clone.
	sid := pool.DeriveSnapshotID("p1", "snap-killed")
	rec, err := json.Marshal(map[string]any{"id": sid.String(), "name": "snap-killed", "sourceVolumeID": abandoned,
		"sizeBytes": 320 * mib, "accessType": "mount", "fsType": "ext4", "created": time.Now().UTC(), "readyToUse": false, "generation": 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(p.Path, "volumes", "snap-"+sid.Hash+".json"), rec, 0o600); err != nil {
		t.Fatal(err)
	}

	cctx, cancel := context.WithCancel(ctx(t))
	defer cancel()
	s.Start(cctx)
	if frozen(t, dir) {
		t.Error("the source of a snapshot whose controller was killed is still frozen after Start")
	}
	if !frozen(t, adminDir) {
		t.Error("Start thawed a filesystem frozen by someone else")
	}
}
