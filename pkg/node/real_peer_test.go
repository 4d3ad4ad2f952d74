package node

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	mount "k8s.io/mount-utils"
	utilexec "k8s.io/utils/exec"

	"github.com/loopvol/loopvol/pkg/loop"
	"github.com/loopvol/loopvol/pkg/pool"
	"github.com/loopvol/loopvol/pkg/volspec/volspectest"
)

// peerNode is the node ID of the second node plugin of the peer tests.
const peerNode = "node-b"

// peer returns the node server of another node on f's machine: the same
// kernel (loop devices, mounts, page cache) and the same pool directory,
// opened anew as that node's plugin does (the shared pool's stand-in), with
// a kubelet directory of its own; what it mounts is unmounted before f's
// devices are detached.
func (f *realFixture) peer(nodeID string) *realFixture {
	f.t.Helper()
	dir := filepath.Dir(f.kubelet)
	g := &realFixture{fixture{t: f.t, ctx: f.ctx, kubelet: filepath.Join(dir, "kubelet-"+nodeID)}}
	if err := os.MkdirAll(g.kubelet, 0o750); err != nil {
		f.t.Fatal(err)
	}
	unmountUnder(f.t, g.kubelet)
	p, err := pool.Open(pool.Options{Name: f.pool.Name, Zone: f.pool.Zone, Path: f.pool.Path})
	if err != nil {
		f.t.Fatal(err)
	}
	g.pool = p
	g.cfg = f.cfg
	g.cfg.NodeID = nodeID
	g.cfg.KubeletDir = g.kubelet
	g.cfg.Pools = map[string]*pool.Pool{p.Name: p}
	g.cfg.Loop = loop.New(loop.Owner(nodeID))
	g.cfg.Mounter = mount.NewSafeFormatAndMount(mount.New(""), utilexec.New())
	g.restart()
	return g
}

// restart replaces f's server with a new one on the same configuration: a
// node plugin that restarted and learns its state from the system.
func (f *realFixture) restart() {
	f.t.Helper()
	srv, err := New(f.cfg)
	if err != nil {
		f.t.Fatal(err)
	}
	f.srv = srv
}

// attachAlso adds att to the volume's attachments, as ControllerPublish
// of a multi-node volume to a second node does.
func (f *realFixture) attachAlso(id pool.VolumeID, att pool.Attachment) {
	f.t.Helper()
	f.withVolume(id, func(v *pool.Volume) error {
		v.Attachments = append(v.Attachments, att)
		return f.pool.WriteVolume(v)
	})
}

// deviceState is what another node must leave as it is on a node's device.
type deviceState struct {
	status loop.Status
	size   int64
}

// state reads a device of f's.
func (f *realFixture) state(dev string) deviceState {
	f.t.Helper()
	st, err := f.cfg.Loop.Status(dev)
	if err != nil {
		f.t.Fatalf("status of %s: %v", dev, err)
	}
	size, err := f.cfg.Loop.Size(dev)
	if err != nil {
		f.t.Fatalf("size of %s: %v", dev, err)
	}
	return deviceState{status: st, size: size}
}

// checkIntact checks that f's device of the volume is dev, as it was.
func (f *realFixture) checkIntact(when string, id pool.VolumeID, dev string, was deviceState) {
	f.t.Helper()
	got, ok, err := f.cfg.Loop.Find(f.pool.ImagePath(id))
	if err != nil || !ok || got != dev {
		f.t.Fatalf("%s: node %s's device of %s is %q (%v, %v), want its %s still attached", when, f.cfg.NodeID, id, got, ok, err, dev)
	}
	if now := f.state(dev); now != was {
		f.t.Errorf("%s: node %s's device %s is %+v, was %+v", when, f.cfg.NodeID, dev, now, was)
	}
}

// checkNoDevice checks that f has no device of the volume.
func (f *realFixture) checkNoDevice(when string, id pool.VolumeID) {
	f.t.Helper()
	if dev, ok, err := f.cfg.Loop.Find(f.pool.ImagePath(id)); err != nil || ok {
		f.t.Errorf("%s: node %s's device %s of %s (%v) is still attached", when, f.cfg.NodeID, dev, id, err)
	}
}

// TestRealPeerSharedBlockVolume: a multi-writer block volume attached to
// two nodes on one kernel. Node B's stage of the image node A has staged
// and published gets a device of its own; B's publish, stats, unpublish,
// unstage, an expansion while B has no device, and a restart of B's server
// never touch A's device, its publish or its data.
func TestRealPeerSharedBlockVolume(t *testing.T) {
	a := newRealFixture(t)
	b := a.peer(peerNode)
	id := a.volumeOfSize("shared-block", pool.AccessBlock, "", 64*mib, pool.Attachment{Node: testNode})
	a.attachAlso(id, pool.Attachment{Node: peerNode})
	c := volspectest.Block(mnmw)
	stageA, publishA := a.stageReq(id, c), a.publishReq(id, c, "pod-a/dev")
	stageB, publishB := b.stageReq(id, c), b.publishReq(id, c, "pod-b/dev")

	a.stage(stageA)
	a.publish(publishA)
	pattern := []byte(strings.Repeat("node-a!!", loop.BlockSize/8))
	writeAt(t, publishA.TargetPath, pattern, 8*mib)
	devA := a.device(id)
	wasA := a.state(devA)
	if wasA.status.OwnerTag != loop.OwnerTag(testNode) {
		t.Errorf("A's device %s is tagged %q, want %q", devA, wasA.status.OwnerTag, loop.OwnerTag(testNode))
	}

	b.stage(stageB)
	devB := b.device(id)
	if devB == devA {
		t.Fatalf("node B's stage reused node A's device %s", devA)
	}
	if st := b.state(devB); st.status.OwnerTag != loop.OwnerTag(peerNode) || st.status.BackingFile != wasA.status.BackingFile {
		t.Errorf("B's device %s: %+v; want tagged %s, of the image %s", devB, st, loop.OwnerTag(peerNode), wasA.status.BackingFile)
	}
	b.publish(publishB)
	if got := readAt(t, publishB.TargetPath, len(pattern), 8*mib); string(got) != string(pattern) {
		t.Errorf("B's device does not show the data A wrote to the same image")
	}
	stats, err := b.srv.NodeGetVolumeStats(b.ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: id.String(), VolumePath: publishB.TargetPath})
	if err != nil || len(stats.GetUsage()) != 1 || stats.GetUsage()[0].GetTotal() != 64*mib {
		t.Errorf("B's NodeGetVolumeStats = %v, %v; want 64 MiB", stats, err)
	}
	b.unpublish(id, publishB.TargetPath)
	b.unstage(id, stageB.StagingTargetPath)
	b.checkNoDevice("after B's unstage", id)
	a.checkIntact("after B's unstage", id, devA, wasA)

	// The controller grows the image. B, which has no device now, has
	// nothing to expand; A's device keeps its size until A expands.
	a.grow(id, 128*mib)
	_, err = b.srv.NodeExpandVolume(b.ctx, &csi.NodeExpandVolumeRequest{VolumeId: id.String(), VolumePath: publishB.TargetPath})
	wantCode(t, err, codes.FailedPrecondition)
	a.checkIntact("after B's expand", id, devA, wasA)

	// B stages again, restarts, finds its own device again and unstages it.
	b.stage(stageB)
	devB = b.device(id)
	if devB == devA {
		t.Fatalf("node B's second stage reused node A's device %s", devA)
	}
	b.restart()
	b.stage(stageB)
	if got := b.device(id); got != devB {
		t.Errorf("B after its restart found %s, want its %s", got, devB)
	}
	b.unstage(id, stageB.StagingTargetPath)
	b.checkNoDevice("after B's second unstage", id)
	a.checkIntact("after B's restart and unstage", id, devA, wasA)

	if got := readAt(t, publishA.TargetPath, len(pattern), 8*mib); string(got) != string(pattern) {
		t.Errorf("A's data changed")
	}
	resp, err := a.srv.NodeExpandVolume(a.ctx, &csi.NodeExpandVolumeRequest{VolumeId: id.String(), VolumePath: publishA.TargetPath})
	if err != nil || resp.GetCapacityBytes() != 128*mib {
		t.Errorf("A's NodeExpandVolume = %v, %v; want 128 MiB", resp, err)
	}
	a.unpublish(id, publishA.TargetPath)
	a.unstage(id, stageA.StagingTargetPath)
	a.checkGone(id)
}

// TestRealPeerSingleNodeVolumes: volumes attached to node A only, one
// mounted and published, one raw block staged and not published (its device
// has no user another node could see). Node B's stage is refused by the
// record; its unstage, stats, health and expand, before and after a restart
// of B's server, find nothing of B's and leave A's devices, mount and data
// as they were.
func TestRealPeerSingleNodeVolumes(t *testing.T) {
	a := newRealFixture(t)
	b := a.peer(peerNode)
	fsID := a.volumeOfSize("fs-of-a", pool.AccessMount, "ext4", 64*mib, pool.Attachment{Node: testNode})
	blockID := a.volumeOfSize("block-of-a", pool.AccessBlock, "", 16*mib, pool.Attachment{Node: testNode})
	fsCap, blockCap := volspectest.Mount("ext4", snw), volspectest.Block(snw)
	stageFs, publishFs := a.stageReq(fsID, fsCap), a.publishReq(fsID, fsCap, "pod-a")
	stageBlock := a.stageReq(blockID, blockCap)

	a.stage(stageFs)
	a.publish(publishFs)
	file := filepath.Join(publishFs.TargetPath, "data")
	want := writeRandomFile(t, file, 1<<20)
	a.stage(stageBlock)
	devFs, devBlock := a.device(fsID), a.device(blockID)
	wasFs, wasBlock := a.state(devFs), a.state(devBlock)
	a.grow(blockID, 32*mib) // what B's expand must not pass to A's device

	for _, round := range []string{"B", "B after its restart"} {
		if round != "B" {
			b.restart()
		}
		for _, v := range []struct {
			id  pool.VolumeID
			cap *csi.VolumeCapability
		}{{fsID, fsCap}, {blockID, blockCap}} {
			_, err := b.srv.NodeStageVolume(b.ctx, b.stageReq(v.id, v.cap))
			wantCode(t, err, codes.FailedPrecondition) // not attached to B
			// Nothing of B's to unstage: done, and A's device stays.
			if _, err := b.srv.NodeUnstageVolume(b.ctx, &csi.NodeUnstageVolumeRequest{VolumeId: v.id.String(), StagingTargetPath: b.stageReq(v.id, v.cap).StagingTargetPath}); err != nil {
				t.Errorf("%s: NodeUnstageVolume of A's volume %s: %v, want nothing to do", round, v.id, err)
			}
			// A path of B's that exists, so that B looks for a device.
			statsPath := b.path("pods", "stats-"+v.id.Hash)
			if err := os.MkdirAll(statsPath, 0o750); err != nil {
				t.Fatal(err)
			}
			_, err = b.srv.NodeGetVolumeStats(b.ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: v.id.String(), VolumePath: statsPath})
			wantCode(t, err, codes.NotFound)
			_, err = b.srv.NodeExpandVolume(b.ctx, &csi.NodeExpandVolumeRequest{VolumeId: v.id.String(), VolumePath: b.path("staging", v.id.Hash)})
			wantCode(t, err, codes.FailedPrecondition)
			// A volume B does not use is healthy as far as B can tell: A's
			// device is not B's to report "in use here".
			if got := b.healthReasons(v.id, ""); len(got) != 0 {
				t.Errorf("%s: NodeGetVolumeHealth of A's volume %s: %v, want nothing", round, v.id, got)
			}
		}
		a.checkIntact(round, fsID, devFs, wasFs)
		a.checkIntact(round, blockID, devBlock, wasBlock)
	}

	if got := checksum(t, file); got != want {
		t.Errorf("A's data changed")
	}
	if _, err := a.srv.NodeGetVolumeStats(a.ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: fsID.String(), VolumePath: publishFs.TargetPath}); err != nil {
		t.Errorf("A's NodeGetVolumeStats: %v", err)
	}
	a.unpublish(fsID, publishFs.TargetPath)
	a.unstage(fsID, stageFs.StagingTargetPath)
	a.unstage(blockID, stageBlock.StagingTargetPath)
	a.checkGone(fsID)
	a.checkGone(blockID)
}
