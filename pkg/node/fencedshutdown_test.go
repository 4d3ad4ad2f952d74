package node

import (
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/loopvol/loopvol/pkg/pool"
)

// shutDownMessage is what the node logs once per fenced device it shut
// down.
const shutDownMessage = "Shut down the filesystem of a fenced volume"

// fenceIn fences this node off volume id of pool p as the controller does
// (fixture.fence, for any pool): the test of local pools needs a fence the
// controller would never make.
func (f *selfFenceFixture) fenceIn(p *pool.Pool, id pool.VolumeID) {
	f.t.Helper()
	unlock, err := p.Lock(id)
	if err != nil {
		f.t.Fatal(err)
	}
	defer unlock()
	if _, err := p.FenceImage(f.ctx, id, nil, nil); err != nil {
		f.t.Fatalf("FenceImage: %v", err)
	}
	if _, err := p.BreakStaged(id, testNode, time.Now()); err != nil {
		f.t.Fatal(err)
	}
}

// TestCheckFencedShutsDown: the periodic check, on a node that was never
// self-fenced, shuts down the filesystem of a shared-pool volume fenced
// under it, logs it once however often it comes back, and leaves alone a
// volume that was not fenced, a fenced raw block volume (nothing mounted)
// and a local pool's volume (never fenced: here replaced all the same). A
// volume another call holds is left to the next check. The unstage then
// cleans the fenced volume up, and the node forgets its device.
func TestCheckFencedShutsDown(t *testing.T) {
	f := newSelfFenceFixture(t)
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
	ctx := klog.NewContext(f.ctx, logger)
	fenced := f.volumeIn(f.pool, "fenced", pool.AccessMount)
	kept := f.volumeIn(f.pool, "kept", pool.AccessMount)
	block := f.volumeIn(f.pool, "block", pool.AccessBlock)
	local := f.volumeIn(f.local, "local", pool.AccessMount)
	fencedStage, keptStage, localStage := f.stage(fenced, false), f.stage(kept, false), f.stage(local, false)
	f.stage(block, true)
	publish := f.publishReq(fenced, f.capability(false), "pod1")
	if _, err := f.srv.NodePublishVolume(f.ctx, publish); err != nil {
		t.Fatal(err)
	}
	if n := f.srv.FencedVolumes(ctx); n != 0 {
		t.Errorf("FencedVolumes before any fence = %d, want 0", n)
	}
	f.fence(fenced)
	f.fence(block)
	f.fenceIn(f.local, local)
	// The raw block volume counts (nothing mounted); the local pool's
	// does not (never fenced).
	if n := f.srv.FencedVolumes(ctx); n != 2 {
		t.Errorf("FencedVolumes after two fences = %d, want 2", n)
	}

	unlock, err := f.srv.lock(fenced)
	if err != nil {
		t.Fatal(err)
	}
	f.srv.checkFenced(ctx)
	if n := f.frozen.shutDowns(fencedStage.StagingTargetPath); n != 0 {
		t.Errorf("a volume another call holds was shut down %d times", n)
	}
	unlock()

	f.srv.checkFenced(ctx)
	f.srv.checkFenced(ctx)
	if n := f.frozen.shutDowns(fencedStage.StagingTargetPath); n != 2 {
		t.Errorf("the fenced volume was shut down %d times by two checks, want 2", n)
	}
	for name, path := range map[string]string{"not fenced": keptStage.StagingTargetPath, "local pool's": localStage.StagingTargetPath} {
		if n := f.frozen.shutDowns(path); n != 0 {
			t.Errorf("the %s volume was shut down %d times", name, n)
		}
	}
	if len(f.frozen.shut) != 1 {
		t.Errorf("shut down: %v, want the fenced volume's staging path only", f.frozen.shut)
	}
	log := logger.GetSink().(ktesting.Underlier).GetBuffer().String()
	if n := strings.Count(log, shutDownMessage); n != 1 {
		t.Errorf("the shutdown was logged %d times, want once:\n%s", n, log)
	}
	for _, want := range []string{fenced.String(), fencedStage.StagingTargetPath, "/dev/"} {
		if !strings.Contains(log, want) {
			t.Errorf("the log lacks %q:\n%s", want, log)
		}
	}

	if _, err := f.srv.NodeUnpublishVolume(f.ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: fenced.String(), TargetPath: publish.TargetPath}); err != nil {
		t.Fatalf("NodeUnpublishVolume of the shut-down volume: %v", err)
	}
	if _, err := f.srv.NodeUnstageVolume(f.ctx, &csi.NodeUnstageVolumeRequest{VolumeId: fenced.String(), StagingTargetPath: fencedStage.StagingTargetPath}); err != nil {
		t.Fatalf("NodeUnstageVolume of the shut-down volume: %v", err)
	}
	if mps := f.mountsAt(fencedStage.StagingTargetPath); len(mps) != 0 {
		t.Errorf("mounts at the staging path after the unstage: %v", mps)
	}
	if devs, err := f.loop.FindReplaced(f.pool.ImagePath(fenced)); err != nil || len(devs) != 0 {
		t.Errorf("fenced devices after the unstage: %v, %v", devs, err)
	}
	if len(f.srv.node.shut.devs) != 0 {
		t.Errorf("devices remembered as shut down after their cleanup: %v", f.srv.node.shut.devs)
	}
	if n := f.srv.FencedVolumes(ctx); n != 1 {
		t.Errorf("FencedVolumes once one of the two fenced volumes is cleaned up = %d, want 1", n)
	}
	f.srv.checkFenced(ctx)
	if n := f.frozen.shutDowns(fencedStage.StagingTargetPath); n != 2 {
		t.Errorf("shut down %d times after the cleanup, want 2 (no more)", n)
	}
}

// TestThawLeftoversShutsDownFenced: a fenced volume's filesystem that an
// earlier run of the plugin left frozen is shut down and thawed by
// ThawLeftovers, also while the node is self-fenced; a volume that was not
// fenced is thawed, and never shut down.
func TestThawLeftoversShutsDownFenced(t *testing.T) {
	f := newSelfFenceFixture(t)
	fenced := f.stage(f.volumeIn(f.pool, "fenced", pool.AccessMount), false)
	kept := f.stage(f.volumeIn(f.pool, "kept", pool.AccessMount), false)
	f.fence(pool.DeriveVolumeID(f.pool.Name, "fenced"))
	f.frozen.frozen[fenced.StagingTargetPath] = true // as a killed plugin left them
	f.frozen.frozen[kept.StagingTargetPath] = true

	f.srv.SelfFence(f.ctx)
	f.srv.ThawLeftovers(f.ctx)
	if n := f.frozen.shutDowns(fenced.StagingTargetPath); n != 1 || f.frozen.isFrozen(fenced.StagingTargetPath) {
		t.Errorf("the fenced volume while self-fenced: shut down %d times, frozen %t; want once, thawed", n, f.frozen.isFrozen(fenced.StagingTargetPath))
	}
	f.srv.EndSelfFence(f.ctx)
	f.srv.ThawLeftovers(f.ctx)
	if f.frozen.isFrozen(kept.StagingTargetPath) {
		t.Error("the volume that was not fenced is still frozen")
	}
	if n := f.frozen.shutDowns(kept.StagingTargetPath); n != 0 {
		t.Errorf("the volume that was not fenced was shut down %d times", n)
	}
}
