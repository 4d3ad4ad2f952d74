package node

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/loopvol/loopvol/pkg/pool"
	"github.com/loopvol/loopvol/pkg/statusapi"
	"github.com/loopvol/loopvol/pkg/volspec/volspectest"
)

// TestRealNodeStatus: on real loop devices and mounts, NodeStatus names
// each staged volume's device, its staging mount with the mount options and
// every target path, a raw block volume's target, the bytes its image
// holds, and a loop device of this node that belongs to no volume.
func TestRealNodeStatus(t *testing.T) {
	requireTool(t, "mkfs.ext4")
	f := newRealFixture(t)
	fsID := f.volumeOfSize("status-fs", pool.AccessMount, "ext4", 64*mib, pool.Attachment{Node: testNode})
	mc := volspectest.Mount("ext4", snw)
	stage, pub1 := f.stageReq(fsID, mc), f.publishReq(fsID, mc, "pod1")
	pub2 := f.publishReq(fsID, mc, "pod2")
	f.stage(stage)
	f.publish(pub1)
	f.publish(pub2)
	blockID := f.volumeOfSize("status-raw", pool.AccessBlock, "", 32*mib, pool.Attachment{Node: testNode})
	bc := volspectest.Block(snw)
	bstage, bpub := f.stageReq(blockID, bc), f.publishReq(blockID, bc, "pod3/dev")
	f.stage(bstage)
	f.publish(bpub)

	// A device of this node's plugin whose image is no volume.
	stray := filepath.Join(filepath.Dir(f.pool.Path), "stray.img")
	if err := os.WriteFile(stray, make([]byte, 4*mib), 0o600); err != nil {
		t.Fatal(err)
	}
	strayDev, err := f.cfg.Loop.Attach(f.ctx, stray, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.cfg.Loop.Detach(strayDev) })

	st, err := f.srv.NodeStatus(f.ctx, &statusapi.NodeStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Volumes) != 2 {
		t.Fatalf("volumes = %+v, want the two staged", st.Volumes)
	}
	byID := map[string]statusapi.VolumeStatus{}
	for _, v := range st.Volumes {
		byID[v.VolumeID] = v
	}
	fsDev, _, _ := f.cfg.Loop.Find(f.pool.ImagePath(fsID))
	v := byID[fsID.String()]
	if v.Device != fsDev || v.StagingPath != stage.StagingTargetPath || len(v.TargetPaths) != 2 ||
		v.TargetPaths[0] != pub1.TargetPath || v.TargetPaths[1] != pub2.TargetPath ||
		!contains(v.MountOptions, "rw") || v.Health != statusapi.HealthOK || v.AllocatedBytes == 0 || v.SizeBytes != 64*mib {
		t.Errorf("ext4 volume = %+v, want device %s, staging %s, targets %s and %s, healthy", v, fsDev, stage.StagingTargetPath, pub1.TargetPath, pub2.TargetPath)
	}
	blockDev, _, _ := f.cfg.Loop.Find(f.pool.ImagePath(blockID))
	b := byID[blockID.String()]
	if !b.Block || b.Device != blockDev || b.StagingPath != "" || len(b.TargetPaths) != 1 || b.TargetPaths[0] != bpub.TargetPath || b.Health != statusapi.HealthOK {
		t.Errorf("block volume = %+v, want device %s published at %s, no staging mount, healthy", b, blockDev, bpub.TargetPath)
	}
	if len(st.StrayDevices) != 1 || st.StrayDevices[0].Device != strayDev || st.StrayDevices[0].Image != stray {
		t.Errorf("stray devices = %+v, want %s of %s", st.StrayDevices, strayDev, stray)
	}
	if p := st.Pools[0]; p.Volumes != 2 || p.Health != statusapi.HealthOK || p.TotalBytes == 0 {
		t.Errorf("pool = %+v", p)
	}

	f.unpublish(blockID, bpub.TargetPath)
	f.unstage(blockID, bstage.StagingTargetPath)
	f.unpublish(fsID, pub1.TargetPath)
	f.unpublish(fsID, pub2.TargetPath)
	f.unstage(fsID, stage.StagingTargetPath)
	st, err = f.srv.NodeStatus(f.ctx, &statusapi.NodeStatusRequest{})
	if err != nil || len(st.Volumes) != 0 {
		t.Errorf("after unstaging: volumes %+v, %v; want none", st.Volumes, err)
	}
}
