package node

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/loopvol/loopvol/pkg/pool"
	"github.com/loopvol/loopvol/pkg/volspec/volspectest"
)

// fence does the controller's part of fencing this node off volume id, as
// issue 26 has it: under the volume's lock, a copy of the image renamed over
// it (pool.FenceImage), then this node's staged record broken.
func (f *fixture) fence(id pool.VolumeID) {
	f.t.Helper()
	unlock, err := f.pool.Lock(id)
	if err != nil {
		f.t.Fatal(err)
	}
	defer unlock()
	if _, err := f.pool.FenceImage(f.ctx, id, nil, nil); err != nil {
		f.t.Fatalf("FenceImage: %v", err)
	}
	if broken, err := f.pool.BreakStaged(id, testNode, time.Now()); err != nil || !broken {
		f.t.Fatalf("BreakStaged = %v, %v; want this node's record broken", broken, err)
	}
}

// wantError checks an RPC's code and that its message has every part.
func wantError(t *testing.T, err error, code codes.Code, parts ...string) {
	t.Helper()
	wantCode(t, err, code)
	for _, p := range parts {
		if !strings.Contains(status.Convert(err).Message(), p) {
			t.Errorf("error %q lacks %q", status.Convert(err).Message(), p)
		}
	}
}

// healthOf returns the reasons NodeGetVolumeHealth reports for the paths,
// each with its status and message.
func (f *fixture) healthOf(id pool.VolumeID, staging, publish string) map[string]string {
	f.t.Helper()
	resp, err := f.srv.NodeGetVolumeHealth(f.ctx, &csi.NodeGetVolumeHealthRequest{VolumeId: id.String(), StagingTargetPath: staging, VolumePublishPath: publish})
	if err != nil {
		f.t.Fatalf("NodeGetVolumeHealth: %v", err)
	}
	out := map[string]string{}
	for _, e := range resp.GetVolumeHealth().GetHealthStatuses() {
		out[e.GetReason()] = e.GetStatus().String() + ": " + e.GetMessage()
	}
	return out
}

// TestFencedVolumeCleanedUp: a node comes back to a volume it had staged and
// published, fenced meanwhile. Stats and health say so; the unstage is
// refused while the Pod's mount is there, and after the unpublish it
// unmounts and detaches the fenced device and leaves no staged record; the
// image and the volume's record are left alone.
func TestFencedVolumeCleanedUp(t *testing.T) {
	f := newFixture(t)
	id := f.volume("fenced", pool.AccessMount, "", pool.Attachment{Node: testNode})
	stage, publish := f.stageAndPublish(id, volspectest.Mount("", snw), "pod1")
	old, ok, err := f.loop.Find(f.pool.ImagePath(id))
	if err != nil || !ok {
		t.Fatalf("no device after the stage: %v", err)
	}
	f.fence(id)

	_, err = f.srv.NodeGetVolumeStats(f.ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: id.String(), VolumePath: publish.TargetPath})
	wantError(t, err, codes.NotFound, "was fenced", "no longer reaches the volume", old)
	health := f.healthOf(id, stage.StagingTargetPath, publish.TargetPath)
	if msg := health[reasonFenced]; !strings.HasPrefix(msg, "INACCESSIBLE") || !strings.Contains(msg, "this node stopped answering") {
		t.Errorf("health = %v, want %s (INACCESSIBLE, stopped answering)", health, reasonFenced)
	}
	if _, ok := health[reasonBackingFileReplaced]; ok {
		t.Errorf("health = %v: a fence is no image replaced by someone else", health)
	}

	unstage := &csi.NodeUnstageVolumeRequest{VolumeId: id.String(), StagingTargetPath: stage.StagingTargetPath}
	_, err = f.srv.NodeUnstageVolume(f.ctx, unstage)
	wantError(t, err, codes.FailedPrecondition, "was fenced", "still published", publish.TargetPath)
	if _, ok := f.loop.OwnerOf(old); !ok || len(f.mountsAt(stage.StagingTargetPath)) != 1 {
		t.Fatalf("a refused unstage changed something: device %s attached %t, staging mounts %v", old, ok, f.mountsAt(stage.StagingTargetPath))
	}

	for range 2 {
		if _, err := f.srv.NodeUnpublishVolume(f.ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id.String(), TargetPath: publish.TargetPath}); err != nil {
			t.Fatalf("NodeUnpublishVolume of the fenced volume: %v", err)
		}
	}
	for range 2 {
		if _, err := f.srv.NodeUnstageVolume(f.ctx, unstage); err != nil {
			t.Fatalf("NodeUnstageVolume of the fenced volume: %v", err)
		}
	}
	if attached := f.loop.Attached(); len(attached) != 0 {
		t.Errorf("devices left after the unstage: %v", attached)
	}
	if mps, _ := f.mounter.List(); len(mps) != 0 {
		t.Errorf("mounts left after the unstage: %v", mps)
	}
	if _, err := os.Stat(stage.StagingTargetPath); !os.IsNotExist(err) {
		t.Errorf("staging path after the unstage: %v, want it removed", err)
	}
	if f.stagedHere(id) {
		t.Error("a staged record is left after the unstage")
	}
	if _, err := os.Stat(f.pool.ImagePath(id)); err != nil {
		t.Errorf("the image after the unstage: %v", err)
	}
	if _, err := f.pool.ReadVolume(id); err != nil {
		t.Errorf("the volume's record after the unstage: %v", err)
	}
}

// TestFencedBlockVolumeCleanedUp: a raw block volume mounts nothing at the
// staging path; its fenced device is detached by the unstage all the same,
// once the Pod's bind of the device node is gone.
func TestFencedBlockVolumeCleanedUp(t *testing.T) {
	f := newFixture(t)
	id := f.volume("fenced-block", pool.AccessBlock, "", pool.Attachment{Node: testNode})
	stage, publish := f.stageAndPublish(id, volspectest.Block(snw), "pod1")
	f.fence(id)
	unstage := &csi.NodeUnstageVolumeRequest{VolumeId: id.String(), StagingTargetPath: stage.StagingTargetPath}
	_, err := f.srv.NodeUnstageVolume(f.ctx, unstage)
	wantError(t, err, codes.FailedPrecondition, "was fenced", "still in use", publish.TargetPath)
	if _, err := f.srv.NodeUnpublishVolume(f.ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id.String(), TargetPath: publish.TargetPath}); err != nil {
		t.Fatalf("NodeUnpublishVolume of the fenced volume: %v", err)
	}
	if _, err := f.srv.NodeUnstageVolume(f.ctx, unstage); err != nil {
		t.Fatalf("NodeUnstageVolume of the fenced volume: %v", err)
	}
	if attached := f.loop.Attached(); len(attached) != 0 {
		t.Errorf("devices left after the unstage: %v", attached)
	}
}

// TestStageAfterFence: the volume is attached to the node again while the
// node still has it staged from before the fence. The stage cleans up the
// fenced device and stages the image anew; while a Pod still uses the fenced
// device, it is refused and changes nothing.
func TestStageAfterFence(t *testing.T) {
	c := volspectest.Mount("", snw)
	t.Run("unused", func(t *testing.T) {
		f := newFixture(t)
		id := f.volume("again", pool.AccessMount, "", pool.Attachment{Node: testNode})
		stage := f.stageReq(id, c)
		if _, err := f.srv.NodeStageVolume(f.ctx, stage); err != nil {
			t.Fatal(err)
		}
		old, _, _ := f.loop.Find(f.pool.ImagePath(id))
		f.fence(id)
		for range 2 {
			if _, err := f.srv.NodeStageVolume(f.ctx, stage); err != nil {
				t.Fatalf("NodeStageVolume after the fence: %v", err)
			}
		}
		dev, ok, err := f.loop.Find(f.pool.ImagePath(id))
		if err != nil || !ok {
			t.Fatalf("no device of the image after the stage: %v", err)
		}
		if attached := f.loop.Attached(); len(attached) != 1 {
			t.Errorf("devices after the stage: %v, want the image's %s only (the fenced %s detached)", attached, dev, old)
		}
		if mps := f.mountsAt(stage.StagingTargetPath); len(mps) != 1 || mps[0].Device != dev {
			t.Errorf("staging mounts = %+v, want one of %s", mps, dev)
		}
		if !f.stagedHere(id) {
			t.Error("staged again without a staged record")
		}
	})
	t.Run("published", func(t *testing.T) {
		f := newFixture(t)
		id := f.volume("again", pool.AccessMount, "", pool.Attachment{Node: testNode})
		stage, publish := f.stageAndPublish(id, c, "pod1")
		old, _, _ := f.loop.Find(f.pool.ImagePath(id))
		f.fence(id)
		_, err := f.srv.NodeStageVolume(f.ctx, stage)
		wantError(t, err, codes.FailedPrecondition, "was fenced", "still published", publish.TargetPath)
		if attached := f.loop.Attached(); len(attached) != 1 || attached[old] == "" {
			t.Errorf("devices after the refused stage: %v, want the fenced %s only", attached, old)
		}
		if mps := f.mountsAt(stage.StagingTargetPath); len(mps) != 1 || mps[0].Device != old {
			t.Errorf("staging mounts after the refused stage = %+v, want the fenced %s's", mps, old)
		}
		if f.stagedHere(id) {
			t.Error("a refused stage wrote a staged record")
		}
	})
}

// TestFencedDeviceAtRestart: a plugin that restarts with a fenced device
// writes no staged record for it (the fence broke it on purpose), and keeps
// those of its other devices.
func TestFencedDeviceAtRestart(t *testing.T) {
	f := newFixture(t)
	fenced := f.volume("fenced", pool.AccessBlock, "", pool.Attachment{Node: testNode})
	kept := f.volume("kept", pool.AccessBlock, "", pool.Attachment{Node: testNode})
	for _, id := range []pool.VolumeID{fenced, kept} {
		if _, err := f.srv.NodeStageVolume(f.ctx, f.stageReq(id, volspectest.Block(snw))); err != nil {
			t.Fatal(err)
		}
	}
	f.fence(fenced)
	// As an older plugin left it: a device, no record.
	if err := f.pool.RemoveStaged(kept, testNode); err != nil {
		t.Fatal(err)
	}
	f.restart(t)
	f.srv.Start(f.ctx)
	if f.stagedHere(fenced) {
		t.Error("the restart recorded a fenced device as staged")
	}
	if !f.stagedHere(kept) {
		t.Error("the restart did not record a device staged without a record")
	}
	if attached := f.loop.Attached(); len(attached) != 2 {
		t.Errorf("devices after the restart: %v, want both (only NodeUnstageVolume cleans up)", attached)
	}
}

// TestFencedPeerDeviceLeftAlone: two node plugins on one kernel. A fence of
// the volume that both had staged leaves node B a fenced device too; A's
// unstage cleans up its own fenced device only.
func TestFencedPeerDeviceLeftAlone(t *testing.T) {
	f := newFixture(t)
	id := f.volume("shared", pool.AccessBlock, "", pool.Attachment{Node: testNode})
	stage := f.stageReq(id, volspectest.Block(snw))
	if _, err := f.srv.NodeStageVolume(f.ctx, stage); err != nil {
		t.Fatal(err)
	}
	devB, err := f.loop.Peer("node-b").Attach(context.Background(), f.pool.ImagePath(id), false)
	if err != nil {
		t.Fatal(err)
	}
	f.fence(id)
	if _, err := f.srv.NodeUnstageVolume(f.ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id.String(), StagingTargetPath: stage.StagingTargetPath}); err != nil {
		t.Fatalf("NodeUnstageVolume: %v", err)
	}
	if attached := f.loop.Attached(); len(attached) != 1 || attached[devB] == "" {
		t.Errorf("devices after A's unstage: %v, want B's %s only", attached, devB)
	}
}

// TestStageRacingAForcedDetach: the CO forces a detach (and the controller
// fences) while this node is staging the volume, after its staged record
// and its first read of the attachment. The stage reads the attachment
// again once the image is open, finds it gone and refuses: it never
// attaches the image the fence put in place, and leaves no record.
func TestStageRacingAForcedDetach(t *testing.T) {
	f := newFixture(t)
	id := f.volume("raced", pool.AccessMount, "", pool.Attachment{Node: testNode})
	detached := false
	f.loop.OnCall = func(call string) {
		// The first Find is ensureDevice's, after stageFenced's read.
		if detached || !strings.HasPrefix(call, "Find ") {
			return
		}
		detached = true
		unlock, err := f.pool.Lock(id)
		if err != nil {
			t.Error(err)
			return
		}
		defer unlock()
		_, v, err := f.pool.Locate(id, nil)
		if err != nil {
			t.Error(err)
			return
		}
		v.Attachments = nil
		if err := f.pool.WriteVolume(v); err != nil {
			t.Error(err)
		}
	}
	_, err := f.srv.NodeStageVolume(f.ctx, f.stageReq(id, volspectest.Mount("", snw)))
	f.loop.OnCall = nil
	if !detached {
		t.Fatal("the stage never looked for a device: the test raced nothing")
	}
	wantError(t, err, codes.FailedPrecondition, "not attached")
	if devs, _ := f.loop.List(); len(devs) != 0 {
		t.Errorf("the stage attached %v after the detach", devs)
	}
	if _, err := f.pool.ReadStaged(id, testNode); err == nil {
		t.Error("the refused stage left its staged record")
	}
}
