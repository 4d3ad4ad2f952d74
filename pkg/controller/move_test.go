package controller

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/loopvol/loopvol/pkg/pool"
	"github.com/loopvol/loopvol/pkg/volspec/volspectest"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

var moveMarks = []struct {
	off  int64
	data string
}{{0, "first block"}, {5 * mib, "after a hole"}, {16*mib - 3, "end"}}

// newMoveVolume makes a 16 MiB volume in pool from with data at three
// places.
func newMoveVolume(t *testing.T, f *fixture, name, from string) pool.VolumeID {
	t.Helper()
	req := createReq(name, 16*mib)
	req.Parameters = map[string]string{ParameterPool: from}
	vol, err := f.s.CreateVolume(ctx(t), req)
	if err != nil {
		t.Fatal(err)
	}
	id, err := pool.ParseVolumeID(vol.Volume.VolumeId)
	if err != nil {
		t.Fatal(err)
	}
	img, err := f.pools[from].OpenImage(id, os.O_RDWR)
	if err != nil {
		t.Fatal(err)
	}
	defer img.Close()
	for _, m := range moveMarks {
		if _, err := img.WriteAt([]byte(m.data), m.off); err != nil {
			t.Fatal(err)
		}
	}
	return id
}

func modifyPool(t *testing.T, f *fixture, id pool.VolumeID, to string) error {
	t.Helper()
	_, err := f.s.ControllerModifyVolume(ctx(t), &csi.ControllerModifyVolumeRequest{VolumeId: id.String(), MutableParameters: map[string]string{MutablePool: to}})
	return err
}

// wantIn checks, through the Controller service, that volume id lives in
// pool want with its data, is listed once, and that the pools hold nothing
// else of it: its image and record in want, a forwarding record at home,
// no temporary, no old copy.
func wantIn(t *testing.T, f *fixture, id pool.VolumeID, want string) {
	t.Helper()
	c := ctx(t)
	got, err := f.s.ControllerGetVolume(c, &csi.ControllerGetVolumeRequest{VolumeId: id.String()})
	if err != nil {
		t.Fatal(err)
	}
	if got.Volume.VolumeId != id.String() || got.Volume.VolumeContext[ContextPool] != want || got.Volume.CapacityBytes != 16*mib {
		t.Fatalf("ControllerGetVolume = %v, want it in pool %s", got.Volume, want)
	}
	list, err := f.s.ListVolumes(c, &csi.ListVolumesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range list.Entries {
		if e.Volume.VolumeId == id.String() {
			n++
		} else if strings.HasSuffix(e.Volume.VolumeId, id.Hash) {
			t.Errorf("ListVolumes lists %s, a second ID of the volume", e.Volume.VolumeId)
		}
	}
	if n != 1 {
		t.Errorf("ListVolumes lists volume %s %d times", id, n)
	}
	h, err := f.s.ControllerGetVolumeHealth(c, &csi.ControllerGetVolumeHealthRequest{VolumeId: id.String()})
	if err != nil || len(h.VolumeHealth.HealthStatuses) != 0 {
		t.Errorf("health = %v, %v", h, err)
	}
	img, err := f.pools[want].OpenImage(id, os.O_RDONLY)
	if err != nil {
		t.Fatal(err)
	}
	defer img.Close()
	for _, m := range moveMarks {
		b := make([]byte, len(m.data))
		if _, err := img.ReadAt(b, m.off); err != nil || !bytes.Equal(b, []byte(m.data)) {
			t.Fatalf("at %d: %q, %v; want %q", m.off, b, err, m.data)
		}
	}
	var left []string
	for _, p := range f.files(t) {
		rel, _ := filepath.Rel(f.root, p)
		if strings.Contains(rel, id.Hash) && !strings.HasSuffix(rel, ".lock") {
			left = append(left, rel)
		}
	}
	expect := []string{want + "/volumes/" + id.Hash + ".img", want + "/volumes/" + id.Hash + ".json"}
	if want != id.Pool {
		expect = append(expect, id.Pool+"/volumes/"+id.Hash+".json")
	}
	slices.Sort(expect)
	slices.Sort(left)
	if !slices.Equal(left, expect) {
		t.Errorf("the pools hold %v of the volume, want %v", left, expect)
	}
}

func TestModifyVolumeMovesBetweenPools(t *testing.T) {
	f := newFixture(t, map[string]string{"slow": "z1", "fast": "z1", "far": "z2"})
	c := ctx(t)
	id := newMoveVolume(t, f, "pvc-move", "slow")
	// A snapshot before the move stays in slow.
	before, err := f.s.CreateSnapshot(c, &csi.CreateSnapshotRequest{Name: "snap-before", SourceVolumeId: id.String()})
	if err != nil {
		t.Fatal(err)
	}

	if err := modifyPool(t, f, id, "fast"); err != nil {
		t.Fatal(err)
	}
	wantIn(t, f, id, "fast")
	if err := modifyPool(t, f, id, "fast"); err != nil {
		t.Fatalf("the same modify again: %v", err)
	}
	wantIn(t, f, id, "fast")

	// Attached: refused, naming the node, nothing changed.
	f.addNode(t, "slow", "node-1", 0)
	f.addNode(t, "fast", "node-1", 0)
	if _, err := f.s.ControllerPublishVolume(c, &csi.ControllerPublishVolumeRequest{VolumeId: id.String(), NodeId: "node-1", VolumeCapability: volspectest.Mount("ext4", snw)}); err != nil {
		t.Fatal(err)
	}
	err = modifyPool(t, f, id, "slow")
	wantCode(t, err, codes.FailedPrecondition)
	if !strings.Contains(err.Error(), "node-1") {
		t.Errorf("message %q does not name the node", err)
	}
	list, err := f.s.ListVolumes(c, &csi.ListVolumesRequest{})
	if err != nil || len(list.Entries) != 1 || !slices.Equal(list.Entries[0].Status.PublishedNodeIds, []string{"node-1"}) {
		t.Fatalf("ListVolumes of the published moved volume = %v, %v", list, err)
	}
	if _, err := f.s.ControllerUnpublishVolume(c, &csi.ControllerUnpublishVolumeRequest{VolumeId: id.String(), NodeId: "node-1"}); err != nil {
		t.Fatal(err)
	}
	wantIn(t, f, id, "fast")

	// A moved volume grows, is snapshotted (in the pool it lives in) and
	// cloned; the snapshot of before the move still restores, in its pool.
	if _, err := f.s.ControllerExpandVolume(c, &csi.ControllerExpandVolumeRequest{VolumeId: id.String(), CapacityRange: &csi.CapacityRange{RequiredBytes: 32 * mib}}); err != nil {
		t.Fatal(err)
	}
	after, err := f.s.CreateSnapshot(c, &csi.CreateSnapshotRequest{Name: "snap-after", SourceVolumeId: id.String()})
	if err != nil {
		t.Fatal(err)
	}
	sb, _ := pool.ParseSnapshotID(before.Snapshot.SnapshotId)
	sa, _ := pool.ParseSnapshotID(after.Snapshot.SnapshotId)
	if sb.Pool != "slow" || sa.Pool != "fast" {
		t.Fatalf("snapshots %s and %s, want one in slow, one in fast", before.Snapshot.SnapshotId, after.Snapshot.SnapshotId)
	}
	if again, err := f.s.CreateSnapshot(c, &csi.CreateSnapshotRequest{Name: "snap-before", SourceVolumeId: id.String()}); err != nil || again.Snapshot.SnapshotId != before.Snapshot.SnapshotId {
		t.Fatalf("CreateSnapshot retried after the move = %v, %v; want the snapshot of before", again, err)
	}
	snaps, err := f.s.ListSnapshots(c, &csi.ListSnapshotsRequest{SourceVolumeId: id.String()})
	if err != nil || len(snaps.Entries) != 2 {
		t.Fatalf("ListSnapshots by the moved volume = %v, %v; want both", snaps, err)
	}
	for _, src := range []*csi.VolumeContentSource{
		{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: before.Snapshot.SnapshotId}}},
		{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: after.Snapshot.SnapshotId}}},
		{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: id.String()}}},
	} {
		req := createReq("pvc-from-"+strings.ReplaceAll(src.String(), " ", ""), 32*mib)
		req.VolumeContentSource = src
		vol, err := f.s.CreateVolume(c, req)
		if err != nil {
			t.Fatalf("CreateVolume from %v: %v", src, err)
		}
		made, _ := pool.ParseVolumeID(vol.Volume.VolumeId)
		img, err := f.pools[made.Pool].OpenImage(made, os.O_RDONLY)
		if err != nil {
			t.Fatal(err)
		}
		b := make([]byte, len(moveMarks[1].data))
		img.ReadAt(b, moveMarks[1].off)
		img.Close()
		if string(b) != moveMarks[1].data {
			t.Errorf("volume from %v reads %q", src, b)
		}
		if _, err := f.s.DeleteVolume(c, &csi.DeleteVolumeRequest{VolumeId: vol.Volume.VolumeId}); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range []string{before.Snapshot.SnapshotId, after.Snapshot.SnapshotId} {
		if _, err := f.s.DeleteSnapshot(c, &csi.DeleteSnapshotRequest{SnapshotId: s}); err != nil {
			t.Fatal(err)
		}
	}

	// A CreateVolume of the same name finds it where it lives.
	req := createReq("pvc-move", 32*mib)
	req.Parameters = map[string]string{ParameterPool: "slow"}
	if vol, err := f.s.CreateVolume(c, req); err != nil || vol.Volume.VolumeId != id.String() || vol.Volume.VolumeContext[ContextPool] != "fast" {
		t.Fatalf("CreateVolume of the moved volume's name = %v, %v", vol, err)
	}
	// Nothing answers to fast's own ID of that hash.
	guest := pool.VolumeID{Pool: "fast", Hash: id.Hash}.String()
	_, err = f.s.ControllerGetVolume(c, &csi.ControllerGetVolumeRequest{VolumeId: guest})
	wantCode(t, err, codes.NotFound)
	if _, err := f.s.DeleteVolume(c, &csi.DeleteVolumeRequest{VolumeId: guest}); err != nil {
		t.Fatal(err)
	}

	// Another zone: refused.
	wantCode(t, modifyPool(t, f, id, "far"), codes.InvalidArgument)
	// Back home.
	if err := modifyPool(t, f, id, "slow"); err != nil {
		t.Fatal(err)
	}
	// The size grew in fast: the data is all there at home.
	if _, err := f.s.DeleteVolume(c, &csi.DeleteVolumeRequest{VolumeId: id.String()}); err != nil {
		t.Fatal(err)
	}
	for _, p := range f.files(t) {
		if strings.Contains(p, id.Hash) {
			t.Errorf("DeleteVolume left %s", p)
		}
	}
}

// TestDeleteMovedVolume: a moved volume's files go where it lives, and
// its forwarding record at home.
func TestDeleteMovedVolume(t *testing.T) {
	f := newFixture(t, map[string]string{"slow": "z1", "fast": "z1"})
	id := newMoveVolume(t, f, "pvc-delete-moved", "slow")
	if err := modifyPool(t, f, id, "fast"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.s.DeleteVolume(ctx(t), &csi.DeleteVolumeRequest{VolumeId: id.String()}); err != nil {
		t.Fatal(err)
	}
	for _, p := range f.files(t) {
		if strings.Contains(p, id.Hash) {
			t.Errorf("DeleteVolume left %s", p)
		}
	}
}

func TestModifyMoveToFullPool(t *testing.T) {
	root := t.TempDir()
	slow, err := pool.Open(pool.Options{Name: "slow", Zone: "z1", Path: filepath.Join(root, "slow")})
	if err != nil {
		t.Fatal(err)
	}
	full, err := pool.Open(pool.Options{Name: "full", Zone: "z1", Path: filepath.Join(root, "full"), ReserveBytes: 1 << 62})
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{Pools: []*pool.Pool{slow, full}})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{s: s, pools: map[string]*pool.Pool{"slow": slow, "full": full}, root: root}
	id := newMoveVolume(t, f, "pvc-full", "slow")
	files := f.files(t)
	wantCode(t, modifyPool(t, f, id, "full"), codes.ResourceExhausted)
	if after := f.files(t); !slices.Equal(files, after) {
		t.Errorf("a refused move changed the pools: %v → %v", files, after)
	}
	wantIn(t, f, id, "slow")
}

var errKilled = errors.New("injected kill")

// TestModifyMoveCrashes: a move stopped after each step, as by a kill, is
// converged by the retried ModifyVolume, or by Sweep when nobody retries
// (finished when the copy was durable, rolled back before), with nothing
// of the volume left anywhere else; and every other RPC meanwhile sees the
// volume in one pool.
func TestModifyMoveCrashes(t *testing.T) {
	for _, step := range pool.MoveSteps {
		for _, recover := range []string{"retry", "sweep", "publish"} {
			t.Run(string(step)+"/"+recover, func(t *testing.T) {
				root := t.TempDir()
				var list []*pool.Pool
				pools := map[string]*pool.Pool{}
				for _, name := range []string{"slow", "fast"} {
					p, err := pool.Open(pool.Options{Name: name, Zone: "z1", Path: filepath.Join(root, name)})
					if err != nil {
						t.Fatal(err)
					}
					list = append(list, p)
					pools[name] = p
				}
				s, err := New(Config{Pools: list, OrphanGrace: 1})
				if err != nil {
					t.Fatal(err)
				}
				f := &fixture{s: s, pools: pools, root: root}
				id := newMoveVolume(t, f, "pvc-crash", "slow")
				s.afterMoveStep = func(got pool.MoveStep) error {
					if got == step {
						return errKilled
					}
					return nil
				}
				wantCode(t, modifyPool(t, f, id, "fast"), codes.Internal)
				s.afterMoveStep = nil
				durable := step != pool.StepIntent && step != pool.StepCopied
				want := "fast"
				switch recover {
				case "retry":
				case "sweep":
					s.Sweep(ctx(t))
					if !durable {
						want = "slow"
					}
					wantIn(t, f, id, want)
				case "publish":
					// Any RPC that takes the volume's lock settles
					// the move first.
					f.addNode(t, "slow", "node-1", 0)
					f.addNode(t, "fast", "node-1", 0)
					c := ctx(t)
					if _, err := s.ControllerPublishVolume(c, &csi.ControllerPublishVolumeRequest{VolumeId: id.String(), NodeId: "node-1", VolumeCapability: volspectest.Mount("ext4", snw)}); err != nil {
						t.Fatal(err)
					}
					if _, err := s.ControllerUnpublishVolume(c, &csi.ControllerUnpublishVolumeRequest{VolumeId: id.String(), NodeId: "node-1"}); err != nil {
						t.Fatal(err)
					}
					if !durable {
						want = "slow"
					}
					wantIn(t, f, id, want)
				}
				if err := modifyPool(t, f, id, "fast"); err != nil {
					t.Fatalf("retried ModifyVolume: %v", err)
				}
				wantIn(t, f, id, "fast")
			})
		}
	}
}

// TestModifyMoveHoldsTheVolume: while a move runs, every other RPC that
// takes the volume's lock is ABORTED, and the lookups that take none find
// the volume in one pool: the one it moves from until the commit, the one
// it moves to after.
func TestModifyMoveHoldsTheVolume(t *testing.T) {
	f := newFixture(t, map[string]string{"slow": "z1", "fast": "z1"})
	f.addNode(t, "slow", "node-1", 0)
	f.addNode(t, "fast", "node-1", 0)
	c := ctx(t)
	id := newMoveVolume(t, f, "pvc-held", "slow")
	var seen []string
	f.s.afterMoveStep = func(step pool.MoveStep) error {
		_, err := f.s.ControllerPublishVolume(c, &csi.ControllerPublishVolumeRequest{VolumeId: id.String(), NodeId: "node-1", VolumeCapability: volspectest.Mount("ext4", snw)})
		if status.Code(err) != codes.Aborted {
			t.Errorf("publish during the move (after %s) = %v, want ABORTED", step, err)
		}
		got, err := f.s.ControllerGetVolume(c, &csi.ControllerGetVolumeRequest{VolumeId: id.String()})
		if err != nil {
			t.Errorf("ControllerGetVolume during the move (after %s): %v", step, err)
			return nil
		}
		seen = append(seen, string(step)+"="+got.Volume.VolumeContext[ContextPool])
		return nil
	}
	if err := modifyPool(t, f, id, "fast"); err != nil {
		t.Fatal(err)
	}
	want := []string{"intent=slow", "copied=slow", "image=slow", "record=slow", "committed=fast", "cleaned=fast"}
	if !slices.Equal(seen, want) {
		t.Errorf("lookups during the move saw %v, want %v", seen, want)
	}
	f.s.afterMoveStep = nil
	wantIn(t, f, id, "fast")
}

// TestModifyMoveWithPreallocate: preallocate and pool in one class: the
// layout changes first, in the pool the volume is in, and the copy keeps
// it (a thin image stays sparse in its new pool).
func TestModifyMoveWithPreallocate(t *testing.T) {
	f := newFixture(t, map[string]string{"slow": "z1", "fast": "z1"})
	c := ctx(t)
	id := newMoveVolume(t, f, "pvc-thin-move", "slow")
	if _, err := f.s.ControllerModifyVolume(c, &csi.ControllerModifyVolumeRequest{VolumeId: id.String(),
		MutableParameters: map[string]string{MutablePool: "fast", MutablePreallocate: "false"}}); err != nil {
		t.Fatal(err)
	}
	wantIn(t, f, id, "fast")
	v, err := f.pools["fast"].ReadVolume(id)
	if err != nil || !v.Thin {
		t.Fatalf("moved volume %+v, %v; want it thin", v, err)
	}
	var st unix.Stat_t
	if err := unix.Stat(f.pools["fast"].ImagePath(id), &st); err != nil {
		t.Fatal(err)
	}
	if st.Blocks*512 >= 4*mib {
		t.Errorf("the thin image in its new pool has %d bytes allocated, more than its data", st.Blocks*512)
	}
}

// TestModifyMoveFinishesAnInterruptedLayout: a change of preallocate that
// a crash interrupted (its intent still in the record) is finished before
// a later class's move, which copies only a settled image.
func TestModifyMoveFinishesAnInterruptedLayout(t *testing.T) {
	f := newFixture(t, map[string]string{"slow": "z1", "fast": "z1"})
	id := newMoveVolume(t, f, "pvc-half-thin", "slow")
	v, err := f.pools["slow"].ReadVolume(id)
	if err != nil {
		t.Fatal(err)
	}
	v.Modifying = map[string]string{MutablePreallocate: "false"} // what a crash in SetLayout leaves
	if err := f.pools["slow"].WriteVolume(v); err != nil {
		t.Fatal(err)
	}
	if err := modifyPool(t, f, id, "fast"); err != nil {
		t.Fatal(err)
	}
	wantIn(t, f, id, "fast")
	if v, err := f.pools["fast"].ReadVolume(id); err != nil || !v.Thin || v.Modifying != nil {
		t.Fatalf("moved volume %+v, %v; want the interrupted change to thin finished", v, err)
	}
}
