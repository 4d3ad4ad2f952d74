package driver

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/loopvol/loopvol/test/internal/driverproc"

	"github.com/loopvol/loopvol/internal/harness/testfs"
)

// snapPool is a driver (--mode=all, node "node-a") over one pool directory.
type snapPool struct {
	dir, pool, kubelet string
	d                  *driverproc.Driver
	ctrl               csi.ControllerClient
	node               csi.NodeClient
}

// newSnapPool starts a driver on a pool in dir/pool: on the test's own
// filesystem (ext4 here: the copy path) or, with reflink, on an xfs made
// with reflink=1 in a sparse file and loop-mounted there (the reflink path).
func newSnapPool(t testing.TB, reflink bool) *snapPool {
	t.Helper()
	driverproc.RequireRoot(t)
	s := &snapPool{dir: t.TempDir()}
	s.pool = filepath.Join(s.dir, "pool")
	s.kubelet = filepath.Join(s.dir, "kubelet")
	for _, d := range []string{s.pool, s.kubelet, filepath.Join(s.dir, "a")} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		if tt, ok := t.(*testing.T); ok {
			forceCleanup(tt, s.dir)
			return
		}
		for _, line := range driverproc.Mounts(s.dir) {
			if f := strings.Fields(line); len(f) > 4 {
				exec.Command("umount", "-l", f[4]).Run()
			}
		}
	})
	if reflink {
		testfs.MountReflinkXFS(t, filepath.Join(s.dir, "pool.xfs"), s.pool, 32*gib) // sparse: room for the 10 GiB benchmark
	}
	s.start(t)
	return s
}

func (s *snapPool) start(t testing.TB) {
	t.Helper()
	s.d = driverproc.Start(t, filepath.Join(s.dir, "a"), "--mode=all", "--node-id=node-a", "--zone=z1",
		"--pool=p1="+s.pool, "--kubelet-dir="+s.kubelet)
	s.ctrl, s.node = csi.NewControllerClient(s.d.Conn), csi.NewNodeClient(s.d.Conn)
}

func (s *snapPool) createFrom(t testing.TB, name string, size int64, cap *csi.VolumeCapability, src *csi.VolumeContentSource) *csi.Volume {
	t.Helper()
	resp, err := s.ctrl.CreateVolume(bg(), &csi.CreateVolumeRequest{Name: name, CapacityRange: &csi.CapacityRange{RequiredBytes: size},
		VolumeCapabilities: []*csi.VolumeCapability{cap}, VolumeContentSource: src})
	if err != nil {
		t.Fatalf("CreateVolume %s: %v", name, err)
	}
	return resp.GetVolume()
}

func (s *snapPool) attach(t *testing.T, id string, cap *csi.VolumeCapability) string {
	t.Helper()
	if _, err := s.ctrl.ControllerPublishVolume(bg(), &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "node-a", VolumeCapability: cap}); err != nil {
		t.Fatalf("ControllerPublishVolume: %v", err)
	}
	c := &cluster{}
	return c.stagePublish(t, s.node, s.kubelet, id, cap, false)
}

func (s *snapPool) detach(t *testing.T, id string) {
	t.Helper()
	c := &cluster{}
	c.unpublishUnstage(t, s.node, s.kubelet, id)
	if _, err := s.ctrl.ControllerUnpublishVolume(bg(), &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: "node-a"}); err != nil {
		t.Fatalf("ControllerUnpublishVolume: %v", err)
	}
}

// snapshotRecord reads a snapshot's record from the pool, as a test of
// what is on disk.
func (s *snapPool) snapshotRecord(t *testing.T, id string) map[string]any {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(s.pool, "volumes", id[strings.LastIndex(id, ".")+1:]+".json"))
	if err != nil {
		t.Fatal(err)
	}
	var rec map[string]any
	if err := json.Unmarshal(data, &rec); err != nil {
		t.Fatal(err)
	}
	return rec
}

// TestSnapshotRestoreAndClone snapshots a mounted volume with data,
// restores the snapshot to a larger volume and clones the volume, stages
// both through the real node service and finds the data; the source is
// deleted while its snapshot stays. On ext4 the snapshot is a copy, on xfs
// with reflink=1 a reflink.
func TestSnapshotRestoreAndClone(t *testing.T) {
	for _, tc := range []struct {
		name    string
		reflink bool
		method  string
	}{{"copy on ext4", false, "copy"}, {"reflink on xfs", true, "reflink"}} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSnapPool(t, tc.reflink)
			cap := mountCap(snw, "ext4")
			src := s.createFrom(t, "pvc-src", 64*mib, cap, nil)
			target := s.attach(t, src.GetVolumeId(), cap)
			want := writeRandom(t, filepath.Join(target, "data"), 8<<20)

			// Crash-consistent: the volume stays mounted.
			snap, err := s.ctrl.CreateSnapshot(bg(), &csi.CreateSnapshotRequest{Name: "snap-1", SourceVolumeId: src.GetVolumeId()})
			if err != nil {
				t.Fatalf("CreateSnapshot: %v", err)
			}
			sid := snap.GetSnapshot().GetSnapshotId()
			if !snap.GetSnapshot().GetReadyToUse() || snap.GetSnapshot().GetSizeBytes() != 64*mib {
				t.Fatalf("snapshot %v", snap.GetSnapshot())
			}
			if got := s.snapshotRecord(t, sid)["method"]; got != tc.method {
				t.Fatalf("snapshot made by %v, want %s", got, tc.method)
			}
			// Data written after the snapshot is not in it.
			writeRandom(t, filepath.Join(target, "later"), 1<<20)

			restored := s.createFrom(t, "pvc-restored", 128*mib, cap, &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
				Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: sid}}})
			if restored.GetCapacityBytes() != 128*mib {
				t.Fatalf("restored volume is %d bytes", restored.GetCapacityBytes())
			}
			rt := s.attach(t, restored.GetVolumeId(), cap)
			if got := checksum(t, filepath.Join(rt, "data")); !bytes.Equal(got, want) {
				t.Fatal("the restored volume does not hold the data of the snapshot")
			}
			if _, err := os.Stat(filepath.Join(rt, "later")); err == nil {
				t.Fatal("the restored volume holds a file written after the snapshot")
			}
			s.detach(t, restored.GetVolumeId())
			// The restored image's filesystem checks clean.
			img := filepath.Join(s.pool, "volumes", restored.GetVolumeId()[strings.LastIndex(restored.GetVolumeId(), ".")+1:]+".img")
			if out, err := exec.Command("fsck.ext4", "-n", "-f", img).CombinedOutput(); err != nil {
				t.Fatalf("fsck.ext4 -n of the restored image: %v\n%s", err, out)
			}

			s.detach(t, src.GetVolumeId())
			clone := s.createFrom(t, "pvc-clone", 64*mib, cap, &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{
				Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: src.GetVolumeId()}}})
			ct := s.attach(t, clone.GetVolumeId(), cap)
			if got := checksum(t, filepath.Join(ct, "data")); !bytes.Equal(got, want) {
				t.Fatal("the clone does not hold the source's data")
			}
			s.detach(t, clone.GetVolumeId())

			// The source goes; the snapshot stands alone and restores.
			if _, err := s.ctrl.DeleteVolume(bg(), &csi.DeleteVolumeRequest{VolumeId: src.GetVolumeId()}); err != nil {
				t.Fatalf("DeleteVolume of a volume with a snapshot: %v", err)
			}
			again := s.createFrom(t, "pvc-again", 64*mib, cap, &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
				Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: sid}}})
			at := s.attach(t, again.GetVolumeId(), cap)
			if got := checksum(t, filepath.Join(at, "data")); !bytes.Equal(got, want) {
				t.Fatal("a restore after the source was deleted lost the data")
			}
			s.detach(t, again.GetVolumeId())
			for _, id := range []string{again.GetVolumeId(), clone.GetVolumeId(), restored.GetVolumeId()} {
				if _, err := s.ctrl.DeleteVolume(bg(), &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := s.ctrl.DeleteSnapshot(bg(), &csi.DeleteSnapshotRequest{SnapshotId: sid}); err != nil {
				t.Fatal(err)
			}
			if left := poolEntries(t, s.pool); len(left) != 0 {
				t.Fatalf("files left in the pool after every volume and snapshot was deleted: %v", left)
			}
		})
	}
}

// poolEntries lists what is left in the pool's volumes directory.
func poolEntries(t *testing.T, pool string) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(pool, "volumes"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// TestSnapshotKilledDuringCopy kills the driver with SIGKILL while it
// copies a snapshot (ext4: the copy path), restarts it, and retries: the
// retry finds its half-made snapshot, makes it whole, and after the delete
// nothing is left in the pool.
func TestSnapshotKilledDuringCopy(t *testing.T) {
	s := newSnapPool(t, false)
	cap := blockCap(snw)
	src := s.createFrom(t, "pvc-big", 2*gib, cap, nil)
	img := filepath.Join(s.pool, "volumes", src.GetVolumeId()[strings.LastIndex(src.GetVolumeId(), ".")+1:]+".img")
	// Data in the whole image, so that the copy has 2 GiB to do.
	if out, err := exec.Command("dd", "if=/dev/urandom", "of="+img, "bs=4M", "count=512", "conv=notrunc,fsync", "status=none").CombinedOutput(); err != nil {
		t.Fatalf("dd: %v: %s", err, out)
	}
	snapID := ""
	rec := ""
	done := make(chan error, 1)
	go func() {
		_, err := s.ctrl.CreateSnapshot(bg(), &csi.CreateSnapshotRequest{Name: "snap-big", SourceVolumeId: src.GetVolumeId()})
		done <- err
	}()
	// Wait for the record that says not ready, then kill.
	deadline := time.Now().Add(60 * time.Second)
	for rec == "" {
		for _, name := range poolEntries(t, s.pool) {
			if strings.HasPrefix(name, "snap-") && strings.HasSuffix(name, ".json") {
				rec = name
			}
		}
		select {
		case err := <-done:
			t.Fatalf("CreateSnapshot finished (%v) before the test saw its record", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("no snapshot record appeared")
		}
		time.Sleep(time.Millisecond)
	}
	s.d.Kill()
	<-done
	data, err := os.ReadFile(filepath.Join(s.pool, "volumes", rec))
	if err != nil {
		t.Fatal(err)
	}
	var half map[string]any
	if err := json.Unmarshal(data, &half); err != nil {
		t.Fatal(err)
	}
	if half["readyToUse"] != false {
		t.Fatalf("the snapshot was whole before the kill (%v): the test did not test a crash", half["readyToUse"])
	}
	snapID = half["id"].(string)

	s.start(t)
	// The half-made snapshot is listed as not ready.
	list, err := s.ctrl.ListSnapshots(bg(), &csi.ListSnapshotsRequest{SnapshotId: snapID})
	if err != nil || len(list.GetEntries()) != 1 || list.GetEntries()[0].GetSnapshot().GetReadyToUse() {
		t.Fatalf("ListSnapshots after the crash: %v, %v", list, err)
	}
	snap, err := s.ctrl.CreateSnapshot(bg(), &csi.CreateSnapshotRequest{Name: "snap-big", SourceVolumeId: src.GetVolumeId()})
	if err != nil {
		t.Fatalf("retried CreateSnapshot: %v", err)
	}
	if snap.GetSnapshot().GetSnapshotId() != snapID || !snap.GetSnapshot().GetReadyToUse() {
		t.Fatalf("retried snapshot %v, want %s ready", snap.GetSnapshot(), snapID)
	}
	snapImg := filepath.Join(s.pool, "volumes", strings.TrimSuffix(rec, ".json")+".img")
	if !bytes.Equal(checksum(t, snapImg), checksum(t, img)) {
		t.Fatal("the finished snapshot differs from its volume")
	}
	if _, err := s.ctrl.DeleteSnapshot(bg(), &csi.DeleteSnapshotRequest{SnapshotId: snapID}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ctrl.DeleteVolume(bg(), &csi.DeleteVolumeRequest{VolumeId: src.GetVolumeId()}); err != nil {
		t.Fatal(err)
	}
	if left := poolEntries(t, s.pool); len(left) != 0 {
		t.Fatalf("files left in the pool: %v", left)
	}
}

// TestXFSCopiesBesideSource stages an xfs volume, then its restored
// snapshot and its clone, all three at once on the same node: a copy has
// its source's filesystem UUID, which xfs refuses to mount twice unless
// told nouuid (the node does so for every xfs mount). Without it the
// restore's stage failed with "invalid argument" (the upstream e2e suite's
// multiVolume "concurrently access the volume and its clone" specs).
func TestXFSCopiesBesideSource(t *testing.T) {
	s := newSnapPool(t, true)
	cap := mountCap(snw, "xfs")
	src := s.createFrom(t, "pvc-src", 300*mib, cap, nil)
	target := s.attach(t, src.GetVolumeId(), cap)
	want := writeRandom(t, filepath.Join(target, "data"), 4<<20)
	snap, err := s.ctrl.CreateSnapshot(bg(), &csi.CreateSnapshotRequest{Name: "snap-xfs", SourceVolumeId: src.GetVolumeId()})
	if err != nil {
		t.Fatalf("CreateSnapshot: %v", err)
	}
	sid := snap.GetSnapshot().GetSnapshotId()
	restored := s.createFrom(t, "pvc-restored", 300*mib, cap, &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
		Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: sid}}})
	clone := s.createFrom(t, "pvc-clone", 300*mib, cap, &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{
		Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: src.GetVolumeId()}}})
	for _, v := range []*csi.Volume{restored, clone} {
		dir := s.attach(t, v.GetVolumeId(), cap)
		if got := checksum(t, filepath.Join(dir, "data")); !bytes.Equal(got, want) {
			t.Fatalf("volume %s (staged beside its source) does not hold the source's data", v.GetVolumeId())
		}
		// Each is a filesystem of its own: a write to it stays in it.
		writeRandom(t, filepath.Join(dir, "own"), 1<<20)
		if _, err := os.Stat(filepath.Join(target, "own")); err == nil {
			t.Fatalf("a file written to %s appeared in the source", v.GetVolumeId())
		}
	}
	for _, v := range []*csi.Volume{clone, restored, src} {
		s.detach(t, v.GetVolumeId())
	}
	for _, id := range []string{clone.GetVolumeId(), restored.GetVolumeId(), src.GetVolumeId()} {
		if _, err := s.ctrl.DeleteVolume(bg(), &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.ctrl.DeleteSnapshot(bg(), &csi.DeleteSnapshotRequest{SnapshotId: sid}); err != nil {
		t.Fatal(err)
	}
}
