package node

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/loopvol/loopvol/pkg/loop"
	"github.com/loopvol/loopvol/pkg/loop/looptest"
	"github.com/loopvol/loopvol/pkg/pool"
	"github.com/loopvol/loopvol/pkg/volspec/volspectest"
)

// sysAttr reads /sys/block/loopN/<attr>.
func (f *realFixture) sysAttr(dev, attr string) string {
	f.t.Helper()
	data, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), attr))
	if err != nil {
		f.t.Fatal(err)
	}
	return strings.TrimSpace(string(data))
}

func (f *realFixture) device(id pool.VolumeID) string {
	f.t.Helper()
	dev, ok, err := f.cfg.Loop.Find(f.pool.ImagePath(id))
	if err != nil || !ok {
		f.t.Fatalf("no loop device for %s: %v", id, err)
	}
	return dev
}

// checkTuned reads the settings of pkg/loop Tune back from sysfs, with the
// block size and direct I/O that the attach chose; discard says whether
// the device must pass discards (a thin volume's) or refuse them.
func (f *realFixture) checkTuned(when, dev string, blockSize int, discard bool) {
	f.t.Helper()
	if got := f.sysAttr(dev, "queue/scheduler"); !strings.Contains(got, "[none]") {
		f.t.Errorf("%s: %s scheduler = %q, want [none]", when, dev, got)
	}
	if got := f.sysAttr(dev, "queue/wbt_lat_usec"); got != "0" {
		f.t.Errorf("%s: %s wbt_lat_usec = %s, want 0", when, dev, got)
	}
	if got := f.sysAttr(dev, "queue/logical_block_size"); got != strconv.Itoa(blockSize) {
		f.t.Errorf("%s: %s logical_block_size = %s, want %d", when, dev, got, blockSize)
	}
	if got := f.sysAttr(dev, "loop/dio"); got != "1" {
		f.t.Errorf("%s: %s dio = %s, want 1", when, dev, got)
	}
	if got := f.sysAttr(dev, "queue/discard_max_bytes"); (got != "0") != discard {
		f.t.Errorf("%s: %s discard_max_bytes = %s, want discards passed: %v", when, dev, got, discard)
	}
}

// untune puts the kernel's defaults (and a scheduler a udev rule might
// pick) back, as on a device attached before the tuning existed.
func (f *realFixture) untune(dev string) {
	f.t.Helper()
	for attr, val := range map[string]string{"scheduler": "mq-deadline", "wbt_lat_usec": "2000"} {
		if err := os.WriteFile(filepath.Join("/sys/block", filepath.Base(dev), "queue", attr), []byte(val), 0); err != nil {
			f.t.Fatal(err)
		}
	}
}

// TestRealTuning: stage tunes the loop device (mount and block), and a node
// plugin that restarts and is asked to stage again re-tunes a device it
// finds, also one staged before the tuning existed.
func TestRealTuning(t *testing.T) {
	f := newRealFixture(t)
	parent := f.t
	for _, fs := range []string{"ext4", "xfs", "block"} {
		t.Run(fs, func(t *testing.T) {
			f.t = t
			defer func() { f.t = parent }()
			var id pool.VolumeID
			c := volspectest.Block(snw)
			if fs == "block" {
				id = f.volumeOfSize("tune-"+fs, pool.AccessBlock, "", 64*mib, pool.Attachment{Node: testNode})
			} else {
				requireTool(t, "mkfs."+fs)
				id = f.volumeOfSize("tune-"+fs, pool.AccessMount, fs, 320*mib, pool.Attachment{Node: testNode})
				c = volspectest.Mount(fs, snw)
			}
			stage, publish := f.stageReq(id, c), f.publishReq(id, c, "pod-"+fs)
			f.stage(stage)
			dev := f.device(id)
			f.checkTuned("after stage", dev, loop.BlockSize, false)
			f.publish(publish)

			// The device as an older plugin left it; a restarted plugin
			// finds it at the next stage (kubelet repeats it) and tunes it.
			f.untune(dev)
			srv, err := New(f.cfg)
			if err != nil {
				t.Fatal(err)
			}
			f.srv = srv
			f.stage(stage)
			if got := f.device(id); got != dev {
				t.Errorf("device after restart = %s, want the same %s", got, dev)
			}
			f.checkTuned("after restart", dev, loop.BlockSize, false)
			f.unpublish(id, publish.TargetPath)
			f.unstage(id, stage.StagingTargetPath)
			f.checkGone(id)
		})
	}
}

// TestRealDiscards: a thin volume's loop device passes discards, so that
// fstrim in it, or each delete when it is mounted with discard, gives the
// blocks of deleted files back to the pool; a thick volume's refuses them
// (fstrim fails, the discard option does nothing), and its image keeps
// every block.
func TestRealDiscards(t *testing.T) {
	f := newRealFixture(t)
	requireTool(t, "mkfs.ext4")
	requireTool(t, "fstrim")
	parent := f.t
	for _, tc := range []struct {
		name    string
		thin    bool
		flags   []string
		fstrim  bool // trim by hand after the delete
		returns bool // the deleted file's blocks go back to the pool
	}{
		{name: "thin fstrim", thin: true, fstrim: true, returns: true},
		{name: "thin mounted with discard", thin: true, flags: []string{"discard"}, returns: true},
		{name: "thick fstrim", fstrim: true},
		{name: "thick mounted with discard", flags: []string{"discard"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f.t = t
			defer func() { f.t = parent }()
			id := f.volumeOfSpec(pool.VolumeSpec{Name: strings.ReplaceAll(tc.name, " ", "-"), SizeBytes: 128 * mib, AccessType: pool.AccessMount, FsType: "ext4", Thin: tc.thin},
				pool.Attachment{Node: testNode})
			c := volspectest.Mount("ext4", snw, tc.flags...)
			stage, publish := f.stageReq(id, c), f.publishReq(id, c, "pod")
			f.stage(stage)
			f.checkTuned("after stage", f.device(id), loop.BlockSize, tc.thin)
			f.publish(publish)
			file := filepath.Join(publish.TargetPath, "f")
			writeRandomFile(t, file, 32<<20)
			unix.Sync()
			before := looptest.AllocatedBytes(t, f.pool.ImagePath(id))
			if err := os.Remove(file); err != nil {
				t.Fatal(err)
			}
			// ext4 frees (and, mounted with discard, discards) the blocks
			// once the journal commits the delete.
			unix.Sync()
			if tc.fstrim {
				out, err := exec.Command("fstrim", "-v", stage.StagingTargetPath).CombinedOutput()
				if (err == nil) != tc.thin {
					t.Errorf("fstrim: %v (%s); want it to work only in a thin volume", err, out)
				}
			}
			after := looptest.AllocatedBytes(t, f.pool.ImagePath(id))
			// Mounted with discard, ext4 discards the freed blocks from a
			// work queue after the commit: wait for it (up to 30 s).
			for deadline := time.Now().Add(30 * time.Second); tc.returns && !tc.fstrim && after > before-32<<20 && time.Now().Before(deadline); {
				time.Sleep(20 * time.Millisecond)
				after = looptest.AllocatedBytes(t, f.pool.ImagePath(id))
			}
			if tc.returns && after > before-32<<20 {
				t.Errorf("image allocates %d bytes after the file's 32 MiB were deleted, want at most %d", after, before-32<<20)
			}
			if !tc.returns && after != before {
				t.Errorf("thick image allocates %d bytes after the delete, want %d", after, before)
			}
			f.unpublish(id, publish.TargetPath)
			f.unstage(id, stage.StagingTargetPath)
			f.checkGone(id)
		})
	}
}

// TestRealOldDevice: a volume staged before this change — its image on a
// 512-byte-sector loop device attached the old way, formatted there with
// the old mkfs options (1 KiB blocks, as mke2fs picks for a small volume),
// its data written — is found by the node plugin, tuned (its block size
// left alone: it cannot change under the filesystem), staged, published
// and unstaged as before; attached again, it gets the block size of its
// filesystem (4096 would not mount it), and its data is intact.
func TestRealOldDevice(t *testing.T) {
	f := newRealFixture(t)
	requireTool(t, "losetup")
	id := f.volumeOfSize("old", pool.AccessMount, "ext4", 128*mib, pool.Attachment{Node: testNode})
	out, err := exec.Command("losetup", "--direct-io=on", "--sector-size", "512", "--find", "--show", f.pool.ImagePath(id)).CombinedOutput()
	if err != nil {
		t.Fatalf("losetup: %v: %s", err, out)
	}
	dev := strings.TrimSpace(string(out))
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-m0", "-E", "nodiscard,lazy_itable_init=1,lazy_journal_init=1", "-b", "1024", dev).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v: %s", err, out)
	}
	f.untune(dev)

	c := volspectest.Mount("ext4", snw)
	stage, publish := f.stageReq(id, c), f.publishReq(id, c, "pod-old")
	f.stage(stage)
	if got := f.device(id); got != dev {
		t.Fatalf("stage used %s, want the old device %s", got, dev)
	}
	f.checkTuned("after stage", dev, 512, false)
	f.publish(publish)
	want := writeRandomFile(t, filepath.Join(publish.TargetPath, "f"), 1<<20)
	f.unpublish(id, publish.TargetPath)
	f.unstage(id, stage.StagingTargetPath)
	f.checkGone(id)

	// Attached anew by this plugin.
	f.stage(stage)
	f.checkTuned("after a new attach", f.device(id), 1024, false)
	f.publish(publish)
	if got := checksum(t, filepath.Join(publish.TargetPath, "f")); got != want {
		t.Errorf("data differs after the new attach")
	}
	f.unpublish(id, publish.TargetPath)
	f.unstage(id, stage.StagingTargetPath)
	f.checkGone(id)
}
