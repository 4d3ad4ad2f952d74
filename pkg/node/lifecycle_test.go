package node

import (
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	mount "k8s.io/mount-utils"

	"github.com/loopvol/loopvol/pkg/pool"
	"github.com/loopvol/loopvol/pkg/volspec/volspectest"
)

func TestMountLifecycleIsIdempotent(t *testing.T) {
	for _, fsType := range []string{"", "ext4", "xfs"} {
		t.Run("fsType="+fsType, func(t *testing.T) {
			f := newFixture(t)
			id := f.volume("vol", pool.AccessMount, fsType, pool.Attachment{Node: testNode})
			c := volspectest.Mount(fsType, snw, "noatime")
			stage, publish := f.stageReq(id, c), f.publishReq(id, c, "pod1")

			for i := range 2 {
				if _, err := f.srv.NodeStageVolume(f.ctx, stage); err != nil {
					t.Fatalf("NodeStageVolume #%d: %v", i+1, err)
				}
			}
			if n := len(f.loop.Attached()); n != 1 {
				t.Errorf("%d loop devices after staging twice, want 1", n)
			}
			wantFS := fsType
			if wantFS == "" {
				wantFS = "ext4"
			}
			mkfs := f.exec.ran("mkfs.")
			if len(mkfs) != 1 || !strings.HasPrefix(mkfs[0], "mkfs."+wantFS) || !strings.Contains(mkfs[0], formatOptions[wantFS][0]) {
				t.Errorf("mkfs calls = %q, want one mkfs.%s with %v", mkfs, wantFS, formatOptions[wantFS])
			}
			if mps := f.mountsAt(stage.StagingTargetPath); len(mps) != 1 || mps[0].Type != wantFS || !slices.Contains(mps[0].Opts, "noatime") {
				t.Errorf("staging mounts = %+v, want one %s mount with noatime", mps, wantFS)
			}

			for i := range 2 {
				if _, err := f.srv.NodePublishVolume(f.ctx, publish); err != nil {
					t.Fatalf("NodePublishVolume #%d: %v", i+1, err)
				}
			}
			mps := f.mountsAt(publish.TargetPath)
			if len(mps) != 1 || !slices.Contains(mps[0].Opts, "bind") || !slices.Contains(mps[0].Opts, "noatime") {
				t.Errorf("target mounts = %+v, want one bind mount with noatime", mps)
			}
			// The same target read-only is incompatible with the read-write publish.
			ro := f.publishReq(id, c, "pod1")
			ro.Readonly = true
			_, err := f.srv.NodePublishVolume(f.ctx, ro)
			wantCode(t, err, codes.AlreadyExists)

			// Unstaging while published would strand the pod's mount.
			_, err = f.srv.NodeUnstageVolume(f.ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id.String(), StagingTargetPath: stage.StagingTargetPath})
			wantCode(t, err, codes.FailedPrecondition)

			for i := range 2 {
				if _, err := f.srv.NodeUnpublishVolume(f.ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id.String(), TargetPath: publish.TargetPath}); err != nil {
					t.Fatalf("NodeUnpublishVolume #%d: %v", i+1, err)
				}
			}
			if _, err := os.Stat(publish.TargetPath); !os.IsNotExist(err) {
				t.Errorf("target path still exists after unpublish: %v", err)
			}
			for i := range 2 {
				if _, err := f.srv.NodeUnstageVolume(f.ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id.String(), StagingTargetPath: stage.StagingTargetPath}); err != nil {
					t.Fatalf("NodeUnstageVolume #%d: %v", i+1, err)
				}
			}
			if n := len(f.loop.Attached()); n != 0 {
				t.Errorf("%d loop devices left after unstage", n)
			}
			if mps, _ := f.mounter.List(); len(mps) != 0 {
				t.Errorf("mounts left after unstage: %+v", mps)
			}

			// Stage again: the filesystem is there, so no second mkfs.
			if _, err := f.srv.NodeStageVolume(f.ctx, stage); err != nil {
				t.Fatalf("NodeStageVolume again: %v", err)
			}
			if n := len(f.exec.ran("mkfs.")); n != 1 {
				t.Errorf("%d mkfs runs after staging again, want still 1", n)
			}
		})
	}
}

func TestBlockLifecycle(t *testing.T) {
	f := newFixture(t)
	id := f.volume("raw", pool.AccessBlock, "", pool.Attachment{Node: testNode})
	c := volspectest.Block(snw)
	stage, publish := f.stageReq(id, c), f.publishReq(id, c, "pod1/dev")

	for range 2 {
		if _, err := f.srv.NodeStageVolume(f.ctx, stage); err != nil {
			t.Fatalf("NodeStageVolume: %v", err)
		}
	}
	devs := f.loop.Attached()
	if len(devs) != 1 {
		t.Fatalf("loop devices = %v, want 1", devs)
	}
	if mps, _ := f.mounter.List(); len(mps) != 0 || len(f.exec.calls) != 0 {
		t.Errorf("block staging mounted %+v or ran %q, want nothing", mps, f.exec.calls)
	}
	for range 2 {
		if _, err := f.srv.NodePublishVolume(f.ctx, publish); err != nil {
			t.Fatalf("NodePublishVolume: %v", err)
		}
	}
	fi, err := os.Stat(publish.TargetPath)
	if err != nil || !fi.Mode().IsRegular() {
		t.Errorf("target = %v, %v; want a file to bind the device onto", fi, err)
	}
	var dev string
	for d := range devs {
		dev = d
	}
	if mps := f.mountsAt(publish.TargetPath); len(mps) != 1 || mps[0].Device != dev {
		t.Errorf("target mounts = %+v, want a bind of %s", mps, dev)
	}
	if _, err := f.srv.NodeUnpublishVolume(f.ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id.String(), TargetPath: publish.TargetPath}); err != nil {
		t.Fatalf("NodeUnpublishVolume: %v", err)
	}
	if _, err := os.Stat(publish.TargetPath); !os.IsNotExist(err) {
		t.Errorf("target file still exists: %v", err)
	}
	if _, err := f.srv.NodeUnstageVolume(f.ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id.String(), StagingTargetPath: stage.StagingTargetPath}); err != nil {
		t.Fatalf("NodeUnstageVolume: %v", err)
	}
	if n := len(f.loop.Attached()); n != 0 {
		t.Errorf("%d loop devices left", n)
	}
}

func TestPathsMountedFromElsewhere(t *testing.T) {
	f := newFixture(t)
	id := f.volume("vol", pool.AccessMount, "", pool.Attachment{Node: testNode})
	c := volspectest.Mount("", snw)
	stage, publish := f.stageReq(id, c), f.publishReq(id, c, "pod1")
	foreign := mount.MountPoint{Device: "/dev/foreign", Path: publish.TargetPath, Type: "ext4"}

	// A staging path that holds someone else's filesystem.
	f.mounter.MountPoints = append(f.mounter.MountPoints, mount.MountPoint{Device: "/dev/foreign", Path: stage.StagingTargetPath, Type: "ext4"})
	_, err := f.srv.NodeStageVolume(f.ctx, stage)
	wantCode(t, err, codes.AlreadyExists)
	if n := len(f.loop.Attached()); n != 0 {
		t.Errorf("a refused stage attached %d devices", n)
	}
	_, err = f.srv.NodeUnstageVolume(f.ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id.String(), StagingTargetPath: stage.StagingTargetPath})
	wantCode(t, err, codes.FailedPrecondition)
	f.mounter.MountPoints = nil

	if _, err := f.srv.NodeStageVolume(f.ctx, stage); err != nil {
		t.Fatal(err)
	}
	f.mounter.MountPoints = append(f.mounter.MountPoints, foreign)
	_, err = f.srv.NodePublishVolume(f.ctx, publish)
	wantCode(t, err, codes.AlreadyExists)
	// Unpublish leaves a foreign mount alone.
	_, err = f.srv.NodeUnpublishVolume(f.ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id.String(), TargetPath: publish.TargetPath})
	wantCode(t, err, codes.FailedPrecondition)
	if len(f.mountsAt(publish.TargetPath)) != 1 {
		t.Errorf("the foreign mount at the target was removed")
	}
}

func TestSingleWriterRefusesSecondTarget(t *testing.T) {
	f := newFixture(t)
	id := f.volume("sw", pool.AccessMount, "", pool.Attachment{Node: testNode})
	c := volspectest.Mount("", snsw)
	if _, err := f.srv.NodeStageVolume(f.ctx, f.stageReq(id, c)); err != nil {
		t.Fatal(err)
	}
	if _, err := f.srv.NodePublishVolume(f.ctx, f.publishReq(id, c, "pod1")); err != nil {
		t.Fatal(err)
	}
	_, err := f.srv.NodePublishVolume(f.ctx, f.publishReq(id, c, "pod2"))
	wantCode(t, err, codes.FailedPrecondition)
	// A multi-writer volume may have two targets on this node.
	mw := f.volume("mw", pool.AccessMount, "", pool.Attachment{Node: testNode})
	mc := volspectest.Mount("", csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER)
	if _, err := f.srv.NodeStageVolume(f.ctx, f.stageReq(mw, mc)); err != nil {
		t.Fatal(err)
	}
	for _, pod := range []string{"pod3", "pod4"} {
		if _, err := f.srv.NodePublishVolume(f.ctx, f.publishReq(mw, mc, pod)); err != nil {
			t.Errorf("publish multi-writer at %s: %v", pod, err)
		}
	}
}

func TestReadOnlyAttachment(t *testing.T) {
	f := newFixture(t)
	id := f.volume("ro", pool.AccessMount, "", pool.Attachment{Node: testNode, ReadOnly: true})
	c := volspectest.Mount("", mnro)
	f.exec.formatted["/dev/loop0"] = "ext4" // made earlier by a writer
	if _, err := f.srv.NodeStageVolume(f.ctx, f.stageReq(id, c)); err != nil {
		t.Fatal(err)
	}
	if mps := f.mountsAt(f.stageReq(id, c).StagingTargetPath); len(mps) != 1 || !slices.Contains(mps[0].Opts, "ro") {
		t.Errorf("staging mounts = %+v, want read-only", mps)
	}
	if _, err := f.srv.NodePublishVolume(f.ctx, f.publishReq(id, c, "pod1")); err != nil {
		t.Fatal(err)
	}
	if mps := f.mountsAt(f.publishReq(id, c, "pod1").TargetPath); len(mps) != 1 || !slices.Contains(mps[0].Opts, "ro") {
		t.Errorf("target mounts = %+v, want read-only", mps)
	}
	// A blank read-only volume cannot be formatted.
	blank := f.volume("blank", pool.AccessMount, "", pool.Attachment{Node: testNode, ReadOnly: true})
	_, err := f.srv.NodeStageVolume(f.ctx, f.stageReq(blank, c))
	wantCode(t, err, codes.FailedPrecondition)
}

func TestBusyVolumeIsAborted(t *testing.T) {
	f := newFixture(t)
	id := f.volume("vol", pool.AccessMount, "", pool.Attachment{Node: testNode})
	unlock, err := f.srv.lock(id)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.srv.NodeStageVolume(f.ctx, f.stageReq(id, volspectest.Mount("", snw)))
	wantCode(t, err, codes.Aborted)
	_, err = f.srv.NodeUnpublishVolume(f.ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id.String(), TargetPath: f.path("pods", "x")})
	wantCode(t, err, codes.Aborted)
	// Stats only read and take no lock.
	_, err = f.srv.NodeGetVolumeStats(f.ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: id.String(), VolumePath: f.path("pods", "x")})
	wantCode(t, err, codes.NotFound)
	unlock()
	if _, err := f.srv.NodeStageVolume(f.ctx, f.stageReq(id, volspectest.Mount("", snw))); err != nil {
		t.Errorf("stage after unlock: %v", err)
	}
}

// TestRestartFindsState builds a second server on the same system (fake
// devices and mounts) and pool: it must carry on from what it finds.
func TestRestartFindsState(t *testing.T) {
	f := newFixture(t)
	id := f.volume("vol", pool.AccessMount, "", pool.Attachment{Node: testNode})
	stage, publish := f.stageAndPublish(id, volspectest.Mount("", snw), "pod1")
	restarted, err := New(f.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := restarted.NodeStageVolume(f.ctx, stage); err != nil {
		t.Errorf("stage after restart: %v", err)
	}
	if _, err := restarted.NodePublishVolume(f.ctx, publish); err != nil {
		t.Errorf("publish after restart: %v", err)
	}
	if n := len(f.loop.Attached()); n != 1 {
		t.Errorf("%d devices after restart, want the 1 found again", n)
	}
	if _, err := restarted.NodeUnpublishVolume(f.ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id.String(), TargetPath: publish.TargetPath}); err != nil {
		t.Errorf("unpublish after restart: %v", err)
	}
	if _, err := restarted.NodeUnstageVolume(f.ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id.String(), StagingTargetPath: stage.StagingTargetPath}); err != nil {
		t.Errorf("unstage after restart: %v", err)
	}
	if n := len(f.loop.Attached()); n != 0 {
		t.Errorf("%d devices left", n)
	}
}

func TestExpand(t *testing.T) {
	f := newFixture(t)
	id := f.volume("vol", pool.AccessMount, "", pool.Attachment{Node: testNode})
	_, publish := f.stageAndPublish(id, volspectest.Mount("", snw), "pod1")
	v, err := f.pool.ReadVolume(id)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.pool.ExpandVolume(f.ctx, v, 32*mib); err != nil {
		t.Fatal(err)
	}
	_, err = f.srv.NodeExpandVolume(f.ctx, &csi.NodeExpandVolumeRequest{VolumeId: id.String(), VolumePath: publish.TargetPath,
		CapacityRange: &csi.CapacityRange{RequiredBytes: 64 * mib}})
	wantCode(t, err, codes.OutOfRange)
	resp, err := f.srv.NodeExpandVolume(f.ctx, &csi.NodeExpandVolumeRequest{VolumeId: id.String(), VolumePath: publish.TargetPath,
		CapacityRange: &csi.CapacityRange{RequiredBytes: 32 * mib}})
	if err != nil {
		t.Fatalf("NodeExpandVolume: %v", err)
	}
	if resp.GetCapacityBytes() != 32*mib {
		t.Errorf("capacity = %d, want %d", resp.GetCapacityBytes(), 32*mib)
	}
	if !slices.ContainsFunc(f.loop.Calls, func(s string) bool { return strings.HasPrefix(s, "Resize ") }) {
		t.Errorf("loop device not resized: %v", f.loop.Calls)
	}
	if len(f.exec.ran("resize2fs")) != 1 {
		t.Errorf("resize2fs calls = %q, want 1", f.exec.ran("resize2fs"))
	}
}

func TestStatsAndHealth(t *testing.T) {
	f := newFixture(t)
	id := f.volume("vol", pool.AccessMount, "", pool.Attachment{Node: testNode})
	stage, publish := f.stageAndPublish(id, volspectest.Mount("", snw), "pod1")
	stats, err := f.srv.NodeGetVolumeStats(f.ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: id.String(), VolumePath: publish.TargetPath})
	if err != nil {
		t.Fatalf("NodeGetVolumeStats: %v", err)
	}
	units := map[csi.VolumeUsage_Unit]*csi.VolumeUsage{}
	for _, u := range stats.GetUsage() {
		units[u.GetUnit()] = u
	}
	if b := units[csi.VolumeUsage_BYTES]; b == nil || b.GetTotal() <= 0 || b.GetAvailable() > b.GetTotal() {
		t.Errorf("bytes usage = %v", b)
	}
	if i := units[csi.VolumeUsage_INODES]; i == nil || i.GetTotal() <= 0 {
		t.Errorf("inode usage = %v", i)
	}

	healthReq := &csi.NodeGetVolumeHealthRequest{VolumeId: id.String(), VolumePublishPath: publish.TargetPath, StagingTargetPath: stage.StagingTargetPath}
	reasons := func() []string {
		t.Helper()
		resp, err := f.srv.NodeGetVolumeHealth(f.ctx, healthReq)
		if err != nil {
			t.Fatalf("NodeGetVolumeHealth: %v", err)
		}
		if resp.GetVolumeHealth().GetVolumeId() != id.String() {
			t.Errorf("health of %q, want %s", resp.GetVolumeHealth().GetVolumeId(), id)
		}
		var rs []string
		for _, e := range resp.GetVolumeHealth().GetHealthStatuses() {
			rs = append(rs, e.GetReason())
		}
		return rs
	}
	if rs := reasons(); len(rs) != 0 {
		t.Errorf("healthy volume reports %v", rs)
	}

	// The pod's mount disappears behind our back.
	if err := f.mounter.Unmount(publish.TargetPath); err != nil {
		t.Fatal(err)
	}
	if rs := reasons(); !slices.Equal(rs, []string{reasonNotMounted}) {
		t.Errorf("reasons = %v, want [%s]", rs, reasonNotMounted)
	}
	_, err = f.srv.NodeGetVolumeStats(f.ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: id.String(), VolumePath: publish.TargetPath})
	wantCode(t, err, codes.NotFound)

	// A half-written record and a deleted image.
	if err := os.WriteFile(f.pool.ImagePath(id)[:len(f.pool.ImagePath(id))-len(".img")]+".json", []byte(`{"id": "p1.`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(f.pool.ImagePath(id)); err != nil {
		t.Fatal(err)
	}
	rs := reasons()
	for _, want := range []string{reasonRecordCorrupt, reasonImageMissing, reasonNotMounted} {
		if !slices.Contains(rs, want) {
			t.Errorf("reasons = %v, want %s among them", rs, want)
		}
	}
}

// TestSELinuxMountOption: with CSIDriver seLinuxMount, kubelet stages a
// volume with context="<the Pod's label>", whose category list has a comma
// inside the quotes. It is one option and reaches the staging mount
// verbatim (so the filesystem is mounted with the Pod's label, not
// relabelled file by file), and the publish bind mount is of that mount.
func TestSELinuxMountOption(t *testing.T) {
	const context = `context="system_u:object_r:container_file_t:s0:c12,c731"`
	f := newFixture(t)
	id := f.volume("vol", pool.AccessMount, "ext4", pool.Attachment{Node: testNode})
	c := volspectest.Mount("ext4", snsw, context)
	stage, publish := f.stageAndPublish(id, c, "pod1")
	mps := f.mountsAt(stage.StagingTargetPath)
	if len(mps) != 1 || !slices.Contains(mps[0].Opts, context) {
		t.Fatalf("staging mounts = %+v, want one mount with the option %s", mps, context)
	}
	if mps := f.mountsAt(publish.TargetPath); len(mps) != 1 || !slices.Contains(mps[0].Opts, "bind") {
		t.Errorf("target mounts = %+v, want one bind mount", mps)
	}
}
