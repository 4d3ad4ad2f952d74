package driver

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/loopvol/loopvol/test/internal/driverproc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/loopvol/loopvol/internal/harness/testfs"
)

// movePools is one driver (--mode=all) serving two pools of one zone,
// slow and fast, in two directories: both on the test's filesystem, or
// fast on a loop-mounted xfs of its own (as a pool on another disk is).
type movePools struct {
	dir, slow, fast, kubelet string
	d                        *driverproc.Driver
	ctrl                     csi.ControllerClient
	node                     csi.NodeClient
}

func newMovePools(t testing.TB, fastXFS bool) *movePools {
	t.Helper()
	driverproc.RequireRoot(t)
	m := &movePools{dir: t.TempDir()}
	m.slow, m.fast, m.kubelet = filepath.Join(m.dir, "slow"), filepath.Join(m.dir, "fast"), filepath.Join(m.dir, "kubelet")
	for _, d := range []string{m.slow, m.fast, m.kubelet, filepath.Join(m.dir, "a")} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		if tt, ok := t.(*testing.T); ok {
			forceCleanup(tt, m.dir)
			return
		}
		for _, line := range driverproc.Mounts(m.dir) {
			if f := strings.Fields(line); len(f) > 4 {
				exec.Command("umount", "-l", f[4]).Run()
			}
		}
	})
	if fastXFS {
		testfs.MountReflinkXFS(t, filepath.Join(m.dir, "fast.xfs"), m.fast, 8*gib) // sparse
	}
	m.start(t)
	return m
}

func (m *movePools) start(t testing.TB) {
	t.Helper()
	m.d = driverproc.Start(t, filepath.Join(m.dir, "a"), "--mode=all", "--node-id=node-a", "--zone=z1",
		"--pool=slow="+m.slow, "--pool=fast="+m.fast, "--kubelet-dir="+m.kubelet)
	m.ctrl, m.node = csi.NewControllerClient(m.d.Conn), csi.NewNodeClient(m.d.Conn)
}

func (m *movePools) create(t testing.TB, name string, size int64, cap *csi.VolumeCapability) string {
	t.Helper()
	resp, err := m.ctrl.CreateVolume(bg(), &csi.CreateVolumeRequest{Name: name, CapacityRange: &csi.CapacityRange{RequiredBytes: size},
		VolumeCapabilities: []*csi.VolumeCapability{cap}, Parameters: map[string]string{"pool": "slow"}})
	if err != nil {
		t.Fatalf("CreateVolume %s: %v", name, err)
	}
	return resp.GetVolume().GetVolumeId()
}

func (m *movePools) modify(id, to string) error {
	_, err := m.ctrl.ControllerModifyVolume(bg(), &csi.ControllerModifyVolumeRequest{VolumeId: id, MutableParameters: map[string]string{"pool": to}})
	return err
}

func (m *movePools) attach(t *testing.T, id string, cap *csi.VolumeCapability) string {
	t.Helper()
	if _, err := m.ctrl.ControllerPublishVolume(bg(), &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "node-a", VolumeCapability: cap}); err != nil {
		t.Fatalf("ControllerPublishVolume: %v", err)
	}
	return (&cluster{}).stagePublish(t, m.node, m.kubelet, id, cap, false)
}

func (m *movePools) detach(t *testing.T, id string) {
	t.Helper()
	(&cluster{}).unpublishUnstage(t, m.node, m.kubelet, id)
	if _, err := m.ctrl.ControllerUnpublishVolume(bg(), &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: "node-a"}); err != nil {
		t.Fatalf("ControllerUnpublishVolume: %v", err)
	}
}

func hashOf(id string) string { return id[strings.LastIndex(id, ".")+1:] }

// wantOnlyIn checks that the pools hold exactly the volume's image and
// record in pool "in" and, if that is not its home (slow), a forwarding
// record at home: no temporary, no old copy.
func (m *movePools) wantOnlyIn(t *testing.T, id, in string) {
	t.Helper()
	h := hashOf(id)
	want := map[string][]string{"slow": nil, "fast": nil}
	want[in] = []string{h + ".img", h + ".json"}
	if in != "slow" {
		want["slow"] = []string{h + ".json"}
	}
	for name, dir := range map[string]string{"slow": m.slow, "fast": m.fast} {
		var got []string
		for _, e := range poolEntries(t, dir) {
			if !strings.HasSuffix(e, ".lock") {
				got = append(got, e)
			}
		}
		slices.Sort(got)
		if !slices.Equal(got, want[name]) {
			t.Errorf("pool %s holds %v, want %v", name, got, want[name])
		}
	}
	v, err := m.ctrl.ControllerGetVolume(bg(), &csi.ControllerGetVolumeRequest{VolumeId: id})
	if err != nil || v.GetVolume().GetVolumeContext()["loopvol.csi.io/pool"] != in {
		t.Errorf("ControllerGetVolume(%s) = %v, %v; want it in pool %s", id, v, err, in)
	}
}

// TestModifyVolumeMovesPool: a filesystem volume written through a real
// mount moves from slow to fast (another filesystem: no reflink, no
// copy_file_range between them) while detached, keeps its ID, and stages
// again from fast with its data; moving it while staged is refused.
func TestModifyVolumeMovesPool(t *testing.T) {
	m := newMovePools(t, true)
	cap := mountCap(snw, "ext4")
	id := m.create(t, "pvc-move", 64<<20, cap)
	target := m.attach(t, id, cap)
	data := []byte("written in slow, read in fast\n")
	if err := os.WriteFile(filepath.Join(target, "data"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("sync", "-f", filepath.Join(target, "data")).CombinedOutput(); err != nil {
		t.Fatalf("sync: %v: %s", err, out)
	}
	err := m.modify(id, "fast")
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "node-a") {
		t.Fatalf("moving a published volume = %v, want FAILED_PRECONDITION naming node-a", err)
	}
	m.detach(t, id)
	if err := m.modify(id, "fast"); err != nil {
		t.Fatalf("ControllerModifyVolume pool=fast: %v", err)
	}
	m.wantOnlyIn(t, id, "fast")
	target = m.attach(t, id, cap)
	got, err := os.ReadFile(filepath.Join(target, "data"))
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("after the move the file reads %q, %v; want %q", got, err, data)
	}
	// The loop device is the image in fast.
	out, err := exec.Command("losetup", "-j", filepath.Join(m.fast, "volumes", hashOf(id)+".img")).CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) == 0 {
		t.Fatalf("no loop device on the image in fast: %s, %v", out, err)
	}
	m.detach(t, id)
	if _, err := m.ctrl.DeleteVolume(bg(), &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{m.slow, m.fast} {
		for _, e := range poolEntries(t, dir) {
			t.Errorf("DeleteVolume left %s in %s", e, dir)
		}
	}
}

// TestModifyVolumeKilledMidMove kills the driver (SIGKILL) while it copies
// a 2 GiB volume from slow to fast, restarts it, and retries the modify:
// the retry converges (the copy was not durable: rolled back, then made
// again), the volume keeps its ID and every byte, and neither pool keeps
// anything else of it. fast is a filesystem of its own, as for a move to
// another disk.
func TestModifyVolumeKilledMidMove(t *testing.T) {
	m := newMovePools(t, true)
	cap := blockCap(snw)
	id := m.create(t, "pvc-kill-move", 2*gib, cap)
	img := filepath.Join(m.slow, "volumes", hashOf(id)+".img")
	// Data in the whole image, so that the copy has 2 GiB to do.
	if out, err := exec.Command("dd", "if=/dev/urandom", "of="+img, "bs=4M", "count=512", "conv=notrunc,fsync", "status=none").CombinedOutput(); err != nil {
		t.Fatalf("dd: %v: %s", err, out)
	}
	sum := checksum(t, img)

	done := make(chan error, 1)
	go func() { done <- m.modify(id, "fast") }()
	// Wait for the copy in fast, then kill.
	temp := "." + hashOf(id) + ".img.moving"
	deadline := time.Now().Add(60 * time.Second)
	for !slices.Contains(poolEntries(t, m.fast), temp) {
		select {
		case err := <-done:
			t.Fatalf("ControllerModifyVolume finished (%v) before the test saw its copy", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("no copy appeared in pool fast")
		}
		time.Sleep(time.Millisecond)
	}
	m.d.Kill()
	<-done
	rec, err := os.ReadFile(filepath.Join(m.slow, "volumes", hashOf(id)+".json"))
	if err != nil {
		t.Fatal(err)
	}
	var half struct {
		Move *struct{ From, To string } `json:"move"`
	}
	if err := json.Unmarshal(rec, &half); err != nil {
		t.Fatal(err)
	}
	if half.Move == nil || half.Move.To != "fast" {
		t.Fatalf("the home record after the kill says %s: the test did not test a crash mid-move", rec)
	}

	m.start(t)
	// Until the retry the volume is in slow, whole.
	if v, err := m.ctrl.ControllerGetVolume(bg(), &csi.ControllerGetVolumeRequest{VolumeId: id}); err != nil || v.GetVolume().GetVolumeContext()["loopvol.csi.io/pool"] != "slow" {
		t.Fatalf("ControllerGetVolume after the restart = %v, %v", v, err)
	}
	if err := m.modify(id, "fast"); err != nil {
		t.Fatalf("retried ControllerModifyVolume: %v", err)
	}
	m.wantOnlyIn(t, id, "fast")
	if got := checksum(t, filepath.Join(m.fast, "volumes", hashOf(id)+".img")); !bytes.Equal(got, sum) {
		t.Fatal("the moved image differs from the volume before the move")
	}
	list, err := m.ctrl.ListVolumes(bg(), &csi.ListVolumesRequest{})
	if err != nil || len(list.GetEntries()) != 1 || list.GetEntries()[0].GetVolume().GetVolumeId() != id {
		t.Fatalf("ListVolumes = %v, %v; want the volume once, by its ID", list, err)
	}
	if _, err := m.ctrl.DeleteVolume(bg(), &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{m.slow, m.fast} {
		for _, e := range poolEntries(t, dir) {
			t.Errorf("DeleteVolume left %s in %s", e, dir)
		}
	}
}

// BenchmarkMove times, through the real driver, ControllerModifyVolume
// moving a 1 GiB block volume whose image is full of random data back and
// forth between two pools, and in the same run the physical baseline on the
// same image between the same directories: cp --sparse=always and an fsync
// of the copy. "ext4": both pools on the ext4 where TMPDIR is (the kernel's
// copy_file_range); "ext4-xfs": one pool on a loop-mounted xfs of its own,
// as on another disk (the copy reads and writes). The page cache is warm
// (the image was just written). MB/s counts the volume's size.
//
//	go test -run '^$' -bench Move -benchtime 4x ./test/driver/
func BenchmarkMove(b *testing.B) {
	const size = gib
	for _, pc := range []struct {
		name string
		xfs  bool
	}{{"ext4", false}, {"ext4-xfs", true}} {
		b.Run(pc.name, func(b *testing.B) {
			if freeBytes(b, os.TempDir()) < 3*size {
				b.Skipf("%s has less than 3 GiB free", os.TempDir())
			}
			m := newMovePools(b, pc.xfs)
			id := m.create(b, "pvc-bench-move", size, blockCap(snw))
			dirs := map[string]string{"slow": m.slow, "fast": m.fast}
			img := filepath.Join(m.slow, "volumes", hashOf(id)+".img")
			if out, err := exec.Command("dd", "if=/dev/urandom", "of="+img, "bs=4M", fmt.Sprint("count=", size/(4<<20)), "conv=notrunc,fsync", "status=none").CombinedOutput(); err != nil {
				b.Fatalf("dd: %v: %s", err, out)
			}
			other := map[string]string{"slow": "fast", "fast": "slow"}
			in := "slow"
			b.Run("ModifyVolume", func(b *testing.B) {
				b.SetBytes(size)
				for i := 0; i < b.N; i++ {
					if err := m.modify(id, other[in]); err != nil {
						b.Fatal(err)
					}
					in = other[in]
				}
			})
			b.Run("cp-sparse", func(b *testing.B) {
				b.SetBytes(size)
				for i := 0; i < b.N; i++ {
					from, to := in, other[in]
					if i%2 == 1 {
						from, to = to, from
					}
					src := filepath.Join(dirs[from], "volumes", hashOf(id)+".img")
					if from != in {
						src = filepath.Join(dirs[from], "cp.img")
					}
					dst := filepath.Join(dirs[to], "cp.img")
					if out, err := exec.Command("cp", "--sparse=always", src, dst).CombinedOutput(); err != nil {
						b.Fatalf("cp: %v: %s", err, out)
					}
					// fsync of the copy only, as the move does
					// (sync -f would flush the whole filesystem).
					f, err := os.OpenFile(dst, os.O_RDWR, 0)
					if err != nil {
						b.Fatal(err)
					}
					err = f.Sync()
					f.Close()
					if err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				os.Remove(filepath.Join(m.slow, "cp.img"))
				os.Remove(filepath.Join(m.fast, "cp.img"))
			})
		})
	}
}

// TestMoveRefusedWhileStagedAfterForceDetach: a ControllerUnpublishVolume
// while the node still has the volume staged and written (what a CO that
// gives up on a node does, and fencing on purpose) leaves the volume
// detached but written. A move then copied the image under the node's
// writes: fsync'd data was lost, and the unstage of the old path failed.
// The node's staged record refuses the move (FAILED_PRECONDITION naming
// the node) until the node unstages; then it moves with every write.
func TestMoveRefusedWhileStagedAfterForceDetach(t *testing.T) {
	m := newMovePools(t, false)
	cap := mountCap(snw, "ext4")
	id := m.create(t, "pvc-forced", 64<<20, cap)
	target := m.attach(t, id, cap)
	write := func(name, text string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(target, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("sync", "-f", filepath.Join(target, name)).CombinedOutput(); err != nil {
			t.Fatalf("sync: %v: %s", err, out)
		}
	}
	write("before", "written before the forced detach\n")
	if _, err := m.ctrl.ControllerUnpublishVolume(bg(), &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: "node-a"}); err != nil {
		t.Fatalf("ControllerUnpublishVolume while staged: %v", err)
	}
	err := m.modify(id, "fast")
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "still staged on node node-a") {
		t.Fatalf("moving a volume detached by force but still staged = %v, want FAILED_PRECONDITION saying it is still staged on node-a", err)
	}
	t.Logf("refused: %v", err)
	// The node keeps writing, and nothing moved under it.
	write("after", "written after the forced detach\n")
	m.wantOnlyIn(t, id, "slow")
	(&cluster{}).unpublishUnstage(t, m.node, m.kubelet, id)
	if err := m.modify(id, "fast"); err != nil {
		t.Fatalf("ControllerModifyVolume pool=fast once unstaged: %v", err)
	}
	m.wantOnlyIn(t, id, "fast")
	target = m.attach(t, id, cap)
	for name, want := range map[string]string{"before": "written before the forced detach\n", "after": "written after the forced detach\n"} {
		if got, err := os.ReadFile(filepath.Join(target, name)); err != nil || string(got) != want {
			t.Errorf("after the move %s reads %q, %v; want %q", name, got, err, want)
		}
	}
	m.detach(t, id)
	if _, err := m.ctrl.DeleteVolume(bg(), &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		t.Fatal(err)
	}
}

// TestKilledWhileFrozenAfterAMove: as TestKilledWhileFrozen, for a volume
// that was moved to another pool first. Its ID names its home pool, not the
// pool its image and snapshot are in, and the restarted driver looked for
// the frozen image by the ID alone: the filesystem stayed frozen, and
// every write of the Pod hung.
func TestKilledWhileFrozenAfterAMove(t *testing.T) {
	m := newMovePools(t, false)
	cap := mountCap(snw, "ext4")
	id := m.create(t, "pvc-moved-frozen", 2*gib, cap)
	if err := m.modify(id, "fast"); err != nil {
		t.Fatalf("ControllerModifyVolume pool=fast: %v", err)
	}
	target := m.attach(t, id, cap)
	// Data, so that the snapshot's copy takes a while.
	if out, err := exec.Command("dd", "if=/dev/urandom", "of="+filepath.Join(target, "data"), "bs=4M", "count=384", "conv=fsync", "status=none").CombinedOutput(); err != nil {
		t.Fatalf("dd: %v: %s", err, out)
	}
	staging, _ := paths(m.kubelet, filepath.Base(id))
	// A failure leaves the filesystem frozen: thawed before the unmounts
	// of newMovePools' cleanup (which runs after this one), or its loop
	// device would outlive the test.
	t.Cleanup(func() { exec.Command("fsfreeze", "-u", staging).Run() })
	done := make(chan error, 1)
	go func() {
		_, err := m.ctrl.CreateSnapshot(bg(), &csi.CreateSnapshotRequest{Name: "snap-moved-frozen", SourceVolumeId: id})
		done <- err
	}()
	// The snapshot is made where the volume lives now: fast.
	for found := false; !found; {
		for _, name := range poolEntries(t, m.fast) {
			found = found || (strings.HasPrefix(name, "snap-") && strings.HasSuffix(name, ".json"))
		}
		select {
		case err := <-done:
			t.Fatalf("CreateSnapshot finished (%v) before the test saw its record", err)
		case <-time.After(time.Millisecond):
		}
	}
	m.d.Kill()
	<-done
	if !isFrozen(t, staging) {
		t.Skip("the copy finished before the kill; nothing was left frozen")
	}
	m.start(t)
	if isFrozen(t, staging) {
		t.Fatal("the restarted driver left the moved volume frozen")
	}
	if err := os.WriteFile(filepath.Join(target, "after"), []byte("writable\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := m.ctrl.CreateSnapshot(bg(), &csi.CreateSnapshotRequest{Name: "snap-moved-frozen", SourceVolumeId: id}); err != nil {
		t.Fatalf("retried CreateSnapshot: %v", err)
	}
	if isFrozen(t, staging) {
		t.Fatal("frozen after the retried snapshot")
	}
	m.detach(t, id)
}
