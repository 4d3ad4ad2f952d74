package node

import (
	"errors"
	"io/fs"
	"slices"
	"strings"
	"testing"

	"github.com/loopvol/loopvol/pkg/pool"
	"github.com/loopvol/loopvol/pkg/volspec/volspectest"
)

// TestStageTunes: every stage tunes the volume's loop device, also a
// repeated one after a restart (a device found, not attached); a device
// that cannot be tuned (read-only /sys) is staged all the same.
func TestStageTunes(t *testing.T) {
	for _, tc := range []struct {
		name  string
		block bool
	}{{name: "mount"}, {name: "block", block: true}} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			access, fsType, c := pool.AccessMount, "ext4", volspectest.Mount("ext4", snw)
			if tc.block {
				access, fsType, c = pool.AccessBlock, "", volspectest.Block(snw)
			}
			id := f.volume("v", access, fsType, pool.Attachment{Node: testNode})
			stage := f.stageReq(id, c)
			if _, err := f.srv.NodeStageVolume(f.ctx, stage); err != nil {
				t.Fatal(err)
			}
			dev, ok, err := f.loop.Find(f.pool.ImagePath(id))
			if err != nil || !ok {
				t.Fatalf("no device: %v", err)
			}
			if !f.loop.Tuned(dev) {
				t.Errorf("%s not tuned after stage; calls %v", dev, f.loop.Calls)
			}

			srv, err := New(f.cfg)
			if err != nil {
				t.Fatal(err)
			}
			f.loop.Calls = nil
			if _, err := srv.NodeStageVolume(f.ctx, stage); err != nil {
				t.Fatal(err)
			}
			if !slices.Contains(f.loop.Calls, "Tune "+dev) || slices.ContainsFunc(f.loop.Calls, func(c string) bool { return strings.HasPrefix(c, "Attach ") }) {
				t.Errorf("stage after restart: calls %v, want a Tune of the device found and no Attach", f.loop.Calls)
			}
		})
	}

	t.Run("read-only sysfs", func(t *testing.T) {
		f := newFixture(t)
		f.loop.TuneErr = &fs.PathError{Op: "open", Path: "/sys/block/loop0/queue/scheduler", Err: errors.New("read-only file system")}
		id := f.volume("v", pool.AccessBlock, "", pool.Attachment{Node: testNode})
		if _, err := f.srv.NodeStageVolume(f.ctx, f.stageReq(id, volspectest.Block(snw))); err != nil {
			t.Fatalf("stage with a device that cannot be tuned = %v, want success", err)
		}
	})
}
