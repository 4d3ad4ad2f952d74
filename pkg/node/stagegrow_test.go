package node

import (
	"path/filepath"
	"testing"

	"github.com/loopvol/loopvol/pkg/pool"
	"github.com/loopvol/loopvol/pkg/volspec/volspectest"
)

// TestRealStageGrowsRestoredVolume: a volume restored from another's image
// into a larger size (what CreateVolume from a snapshot or a clone does)
// has a filesystem of its source's size on a larger device; its first
// stage grows the filesystem to the device, and the data is there.
func TestRealStageGrowsRestoredVolume(t *testing.T) {
	for _, fsType := range []string{"ext4", "xfs"} {
		t.Run(fsType, func(t *testing.T) {
			requireTool(t, "mkfs."+fsType)
			f := newRealFixture(t)
			const small, large = 400 * mib, 900 * mib
			src := f.volumeOfSize("source-"+fsType, pool.AccessMount, fsType, small, pool.Attachment{Node: testNode})
			c := volspectest.Mount(fsType, snw)
			stage := f.stageReq(src, c)
			f.stage(stage)
			want := writeRandomFile(t, filepath.Join(stage.StagingTargetPath, "data.bin"), 1<<20)
			f.unstage(src, stage.StagingTargetPath)

			// The controller's part of a clone to a larger size.
			name := "restored-" + fsType
			id := pool.DeriveVolumeID(f.pool.Name, name)
			unlock, err := f.pool.Lock(id)
			if err != nil {
				t.Fatal(err)
			}
			v, err := f.pool.CreateVolume(t.Context(), pool.VolumeSpec{Name: name, SizeBytes: large, AccessType: pool.AccessMount, FsType: fsType,
				Source: &pool.Source{ID: src.String(), SizeBytes: small}})
			if err != nil {
				t.Fatal(err)
			}
			v.Attachments = []pool.Attachment{{Node: testNode}}
			if err := f.pool.WriteVolume(v); err != nil {
				t.Fatal(err)
			}
			unlock()

			restored := f.stageReq(id, c)
			f.stage(restored)
			if total := statfsTotal(t, restored.StagingTargetPath); total < small+(large-small)*8/10 {
				t.Errorf("the restored volume's filesystem has %d bytes; want it grown towards %d (the source had %d)", total, large, small)
			}
			if got := checksum(t, filepath.Join(restored.StagingTargetPath, "data.bin")); got != want {
				t.Error("the restored volume's data differs from its source's")
			}
			// A repeated stage is a no-op.
			f.stage(restored)
			f.unstage(id, restored.StagingTargetPath)
			f.checkGone(id)
		})
	}
}
