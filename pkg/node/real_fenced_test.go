package node

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"github.com/loopvol/loopvol/pkg/loop/looptest"
	"github.com/loopvol/loopvol/pkg/pool"
	"github.com/loopvol/loopvol/pkg/volspec/volspectest"
)

// TestRealFencedVolume: a volume staged and published for real, written, then
// fenced as the controller does (pool.FenceImage, BreakStaged) while the node
// keeps writing. Stats and health say it was fenced; the unstage is refused
// while the Pod's mount is there, then unmounts and detaches the fenced device
// and leaves no staged record. The image holds what was written before the
// fence, the unstage does not change it, and staged again the volume shows
// exactly that.
func TestRealFencedVolume(t *testing.T) {
	for _, tc := range []struct {
		fsType string
		size   int64
	}{{"ext4", 64 * mib}, {"xfs", 320 * mib}} { // xfs needs 300 MiB
		t.Run(tc.fsType, func(t *testing.T) {
			requireTool(t, "mkfs."+tc.fsType)
			f := newRealFixture(t)
			id := f.volumeOfSize("fenced-"+tc.fsType, pool.AccessMount, tc.fsType, tc.size, pool.Attachment{Node: testNode})
			c := volspectest.Mount(tc.fsType, snw)
			stage, publish := f.stageReq(id, c), f.publishReq(id, c, "pod1")
			f.stage(stage)
			f.publish(publish)
			old := f.device(id)
			before := writeRandomFile(t, filepath.Join(publish.TargetPath, "before.bin"), 1<<20)
			unix.Sync()

			f.fence(id)
			image := f.pool.ImagePath(id)
			fencedImage := checksum(t, image)
			// The node goes on writing: to the old inode, never the volume.
			writeRandomFile(t, filepath.Join(publish.TargetPath, "after.bin"), 1<<20)
			unix.Sync()
			if got := checksum(t, image); got != fencedImage {
				t.Fatal("a write on the fenced node changed the volume's image")
			}

			_, err := f.srv.NodeGetVolumeStats(f.ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: id.String(), VolumePath: publish.TargetPath})
			wantError(t, err, codes.NotFound, "was fenced", "no longer reaches the volume", old)
			wantReason(t, f.healthOf(id, stage.StagingTargetPath, publish.TargetPath), reasonFenced, "INACCESSIBLE", "this node stopped answering", old)

			unstage := &csi.NodeUnstageVolumeRequest{VolumeId: id.String(), StagingTargetPath: stage.StagingTargetPath}
			_, err = f.srv.NodeUnstageVolume(f.ctx, unstage)
			wantError(t, err, codes.FailedPrecondition, "was fenced", "still published")
			f.unpublish(id, publish.TargetPath)
			f.unstage(id, stage.StagingTargetPath)
			f.checkGone(id)
			if devs, err := f.cfg.Loop.FindReplaced(image); err != nil || len(devs) != 0 {
				t.Errorf("fenced devices after the unstage: %v, %v", devs, err)
			}
			if devs := looptest.DevicesUnder(t, f.pool.Path); len(devs) != 0 {
				t.Errorf("loop devices of the pool after the unstage: %v", devs)
			}
			if f.stagedHere(id) {
				t.Error("a staged record is left after the unstage")
			}
			if got := checksum(t, image); got != fencedImage {
				t.Error("the unstage of the fenced device changed the volume's image")
			}

			// Staged again: what was written before the fence, nothing after.
			f.stage(stage)
			f.publish(publish)
			if got := checksum(t, filepath.Join(publish.TargetPath, "before.bin")); got != before {
				t.Error("the data written before the fence differs in the fenced volume")
			}
			if _, err := os.Stat(filepath.Join(publish.TargetPath, "after.bin")); !os.IsNotExist(err) {
				t.Errorf("the file written after the fence: %v, want none in the volume", err)
			}
			if dev := f.device(id); !strings.HasPrefix(dev, "/dev/loop") {
				t.Errorf("device of the volume staged again = %q", dev)
			}
			f.unpublish(id, publish.TargetPath)
			f.unstage(id, stage.StagingTargetPath)
			f.checkGone(id)
		})
	}
}
