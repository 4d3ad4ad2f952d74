package node

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/loopvol/loopvol/pkg/loop/looptest"
	"github.com/loopvol/loopvol/pkg/pool"
	"github.com/loopvol/loopvol/pkg/volspec/volspectest"
)

// peer returns the fake node server of another node on f's machine: the
// same fake kernel (f's loop devices through looptest's Peer, f's mount
// table and commands) and the same pool directory, opened anew, with a
// kubelet directory of its own.
func (f *fixture) peer(nodeID string) *fixture {
	f.t.Helper()
	g := *f
	g.kubelet = filepath.Join(filepath.Dir(f.kubelet), "kubelet-"+nodeID)
	if err := os.MkdirAll(g.kubelet, 0o750); err != nil {
		f.t.Fatal(err)
	}
	p, err := pool.Open(pool.Options{Name: f.pool.Name, Zone: f.pool.Zone, Path: f.pool.Path})
	if err != nil {
		f.t.Fatal(err)
	}
	g.pool = p
	g.loop = f.loop.Peer(nodeID)
	g.cfg.NodeID = nodeID
	g.cfg.KubeletDir = g.kubelet
	g.cfg.Pools = map[string]*pool.Pool{p.Name: p}
	g.cfg.Loop = g.loop
	if g.srv, err = New(g.cfg); err != nil {
		f.t.Fatal(err)
	}
	return &g
}

// calledOn lists the calls of fake that named dev.
func calledOn(fake *looptest.Fake, dev string) []string {
	var calls []string
	for _, c := range fake.Calls {
		if strings.HasSuffix(c, " "+dev) {
			calls = append(calls, c)
		}
	}
	return calls
}

// TestPeerNodeOwnsItsDevices: two node plugins on one (fake) kernel. Node
// B's stage of the image node A staged gets a device of its own; B's
// unstage, expand and restart never call on A's devices, which stay
// attached, also that of a volume A staged alone.
func TestPeerNodeOwnsItsDevices(t *testing.T) {
	a := newFixture(t)
	b := a.peer(peerNode)
	shared := a.volume("shared", pool.AccessBlock, "", pool.Attachment{Node: testNode}, pool.Attachment{Node: peerNode})
	own := a.volume("a-only", pool.AccessBlock, "", pool.Attachment{Node: testNode})
	c := volspectest.Block(mnmw)
	a.stageAndPublish(shared, c, "pod-a/dev")
	if _, err := a.srv.NodeStageVolume(a.ctx, a.stageReq(own, volspectest.Block(snw))); err != nil {
		t.Fatalf("A's NodeStageVolume: %v", err)
	}
	devShared, _, _ := a.loop.Find(a.pool.ImagePath(shared))
	devOwn, _, _ := a.loop.Find(a.pool.ImagePath(own))

	stageB, publishB := b.stageAndPublish(shared, c, "pod-b/dev")
	devB, ok, err := b.loop.Find(b.pool.ImagePath(shared))
	if err != nil || !ok || devB == devShared {
		t.Fatalf("B's device of the shared volume = %q, %v, %v; want one of its own, not A's %s", devB, ok, err, devShared)
	}
	if owner, _ := a.loop.OwnerOf(devB); owner != peerNode {
		t.Errorf("B's device %s is owned by %q, want %q", devB, owner, peerNode)
	}
	if _, err := b.srv.NodeUnpublishVolume(b.ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: shared.String(), TargetPath: publishB.TargetPath}); err != nil {
		t.Fatalf("B's NodeUnpublishVolume: %v", err)
	}
	b.restart(t)
	for _, v := range []struct {
		id      pool.VolumeID
		staging string
	}{{shared, stageB.StagingTargetPath}, {own, b.stageReq(own, c).StagingTargetPath}} {
		if _, err := b.srv.NodeUnstageVolume(b.ctx, &csi.NodeUnstageVolumeRequest{VolumeId: v.id.String(), StagingTargetPath: v.staging}); err != nil {
			t.Errorf("B's NodeUnstageVolume of %s: %v", v.id, err)
		}
	}
	// The controller grew the shared volume; B has no device to grow.
	unlock, err := a.pool.Lock(shared)
	if err != nil {
		t.Fatal(err)
	}
	v, err := a.pool.ReadVolume(shared)
	if err == nil {
		err = a.pool.ExpandVolume(a.ctx, v, 32*mib)
	}
	unlock()
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.srv.NodeExpandVolume(b.ctx, &csi.NodeExpandVolumeRequest{VolumeId: shared.String(), VolumePath: publishB.TargetPath})
	wantCode(t, err, codes.FailedPrecondition)

	for _, dev := range []string{devShared, devOwn} {
		if calls := calledOn(b.loop, dev); len(calls) != 0 {
			t.Errorf("B called %q on A's device", calls)
		}
		if owner, ok := a.loop.OwnerOf(dev); !ok || owner != testNode {
			t.Errorf("A's device %s: attached %v, owner %q; want still A's", dev, ok, owner)
		}
	}
	if _, ok := a.loop.OwnerOf(devB); ok {
		t.Errorf("B's device %s is still attached after B's unstage", devB)
	}
}

// restart replaces f's server with a new one on the same configuration.
func (f *fixture) restart(t *testing.T) {
	t.Helper()
	srv, err := New(f.cfg)
	if err != nil {
		t.Fatal(err)
	}
	f.srv = srv
}

// TestUntaggedDeviceIsFound: a device an older plugin attached, without
// an owner tag, is found by the node that has the volume staged after an
// upgrade, and detached by its unstage.
func TestUntaggedDeviceIsFound(t *testing.T) {
	f := newFixture(t)
	id := f.volume("old", pool.AccessBlock, "", pool.Attachment{Node: testNode})
	old, err := f.loop.Peer("").Attach(context.Background(), f.pool.ImagePath(id), false)
	if err != nil {
		t.Fatal(err)
	}
	stage := f.stageReq(id, volspectest.Block(snw))
	if _, err := f.srv.NodeStageVolume(f.ctx, stage); err != nil {
		t.Fatalf("NodeStageVolume: %v", err)
	}
	if devs := f.loop.Attached(); len(devs) != 1 {
		t.Errorf("devices after the stage: %v, want only the old %s", devs, old)
	}
	if !f.loop.Tuned(old) {
		t.Errorf("the old device %s was not tuned", old)
	}
	if _, err := f.srv.NodeUnstageVolume(f.ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id.String(), StagingTargetPath: stage.StagingTargetPath}); err != nil {
		t.Fatalf("NodeUnstageVolume: %v", err)
	}
	if devs := f.loop.Attached(); len(devs) != 0 {
		t.Errorf("devices after the unstage: %v", devs)
	}
}

// TestLoopOwnerIsNodeID: a node server refuses loop devices that act for
// no owner or for another node.
func TestLoopOwnerIsNodeID(t *testing.T) {
	f := newFixture(t)
	for _, owner := range []string{"", peerNode} {
		cfg := f.cfg
		cfg.Loop = looptest.New(owner)
		_, err := New(cfg)
		if err == nil || !strings.Contains(err.Error(), "loop.Owner(NodeID)") {
			t.Errorf("New with loop devices of owner %q = %v, want refused", owner, err)
		}
	}
}
