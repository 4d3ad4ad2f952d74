package node

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"github.com/loopvol/loopvol/pkg/loop/looptest"
	"github.com/loopvol/loopvol/pkg/pool"
	"github.com/loopvol/loopvol/pkg/volspec/volspectest"
)

// writeGrace is how long a test waits for a write that must fail rather
// than hang: long enough for any machine, and no measure of anything.
const writeGrace = 2 * time.Minute

// openWriter opens a file for a writer on the volume published at dir,
// before the freeze: a Pod writing on through a file it has open.
func openWriter(t *testing.T, dir, name string) *os.File {
	t.Helper()
	open, err := os.OpenFile(filepath.Join(dir, name+"-open.bin"), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { open.Close() })
	return open
}

// startWriters starts two writers on the volume published at dir: one
// appends to open (openWriter), one creates a new file. Each sends what
// its write and fsync returned. Only they touch the frozen filesystem: the
// test's own goroutine never blocks on it.
func startWriters(dir, name string, open *os.File) <-chan error {
	errs := make(chan error, 2)
	go func() {
		_, err := open.Write(make([]byte, 64<<10))
		if err == nil {
			err = open.Sync()
		}
		errs <- err
	}()
	go func() {
		errs <- os.WriteFile(filepath.Join(dir, name+"-new.bin"), make([]byte, 64<<10), 0o600)
	}()
	return errs
}

// wantIOErrors waits for n writers of errs and checks that each failed with
// EIO.
func wantIOErrors(t *testing.T, errs <-chan error, n int, when string) {
	t.Helper()
	for range n {
		select {
		case err := <-errs:
			if !errors.Is(err, unix.EIO) {
				t.Errorf("a write %s returned %v, want EIO", when, err)
			}
		case <-time.After(writeGrace):
			t.Fatalf("a write %s still hangs after %v", when, writeGrace)
		}
	}
}

// sharedRealFixture is a real fixture whose pool another node's record
// makes shared, as fencing needs.
func sharedRealFixture(t *testing.T) *realFixture {
	t.Helper()
	f := newRealFixture(t)
	if err := f.pool.WriteNode(pool.NodeRecord{ID: "node-b", Zone: testZone, LastStart: time.Now().UTC()}); err != nil {
		t.Fatal(err)
	}
	return f
}

// cleanUpFencedAndCheck unpublishes and unstages the fenced volume id and
// checks that nothing of it is left on the node and that its image still
// has the checksum it had after the fence, then that staged again it holds
// the file written before the fence (sum) and none written after.
func (f *realFixture) cleanUpFencedAndCheck(id pool.VolumeID, staging, target string, image [32]byte, before [32]byte) {
	f.t.Helper()
	f.unpublish(id, target)
	f.unstage(id, staging)
	f.checkGone(id)
	if devs, err := f.cfg.Loop.FindReplaced(f.pool.ImagePath(id)); err != nil || len(devs) != 0 {
		f.t.Errorf("fenced devices after the unstage: %v, %v", devs, err)
	}
	if devs := looptest.DevicesUnder(f.t, f.pool.Path); len(devs) != 0 {
		f.t.Errorf("loop devices of the pool after the unstage: %v", devs)
	}
	if got := checksum(f.t, f.pool.ImagePath(id)); got != image {
		f.t.Error("the shutdown or the cleanup of the fenced device changed the volume's image")
	}
	v, err := f.pool.ReadVolume(id)
	if err != nil {
		f.t.Fatal(err)
	}
	c := volspectest.Mount(v.FsType, snw)
	stage, publish := f.stageReq(id, c), f.publishReq(id, c, "pod2")
	f.stage(stage)
	f.publish(publish)
	if got := checksum(f.t, filepath.Join(publish.TargetPath, "before.bin")); got != before {
		f.t.Error("the data written before the fence differs in the fenced volume")
	}
	for _, name := range []string{"during-new.bin", "after-new.bin", "silent.bin"} {
		if _, err := os.Stat(filepath.Join(publish.TargetPath, name)); !os.IsNotExist(err) {
			f.t.Errorf("%s, written after the fence: %v, want none in the volume", name, err)
		}
	}
	// Made before the fence, empty then, and written only after it.
	for _, name := range []string{"during-open.bin", "after-open.bin"} {
		if st, err := os.Stat(filepath.Join(publish.TargetPath, name)); err == nil && st.Size() != 0 {
			f.t.Errorf("%s holds %d bytes written after the fence, want none in the volume", name, st.Size())
		}
	}
	f.unpublish(id, publish.TargetPath)
	f.unstage(id, stage.StagingTargetPath)
	f.checkGone(id)
}

// TestRealSelfFencedVolumeFencedShutDown: on real ext4 and xfs, a volume
// fenced while the node was self-fenced, with writers blocked on its frozen
// filesystem. EndSelfFence shuts the filesystem down and thaws it: the
// writers get EIO instead of hanging (and nothing reaches the orphaned
// inode silently); stats and health still say it was fenced; the unpublish
// and the unstage unmount and detach it; the image the fence put in place
// is unchanged by all of it.
func TestRealSelfFencedVolumeFencedShutDown(t *testing.T) {
	for _, tc := range []struct {
		fsType string
		size   int64
	}{{"ext4", 64 * mib}, {"xfs", 320 * mib}} { // xfs needs 300 MiB
		t.Run(tc.fsType, func(t *testing.T) {
			requireTool(t, "mkfs."+tc.fsType)
			f := sharedRealFixture(t)
			id := f.volumeOfSize("shutdown-"+tc.fsType, pool.AccessMount, tc.fsType, tc.size, pool.Attachment{Node: testNode})
			c := volspectest.Mount(tc.fsType, snw)
			stage, publish := f.stageReq(id, c), f.publishReq(id, c, "pod1")
			thawInCleanup(t, stage.StagingTargetPath)
			f.stage(stage)
			f.publish(publish)
			before := writeRandomFile(t, filepath.Join(publish.TargetPath, "before.bin"), 1<<20)

			open := openWriter(t, publish.TargetPath, "during")
			f.srv.SelfFence(f.ctx)
			if !probeFrozen(t, stage.StagingTargetPath) {
				t.Fatal("not frozen after SelfFence")
			}
			errs := startWriters(publish.TargetPath, "during", open)
			select {
			case err := <-errs:
				t.Fatalf("a write to the self-fenced volume completed (%v)", err)
			case <-time.After(300 * time.Millisecond):
			}
			f.fence(id)
			image := checksum(t, f.pool.ImagePath(id))

			f.srv.EndSelfFence(f.ctx)
			wantIOErrors(t, errs, 2, "blocked on the freeze of a fenced volume")
			open.Close() // the Pod's process exits on its error
			if err := os.WriteFile(filepath.Join(publish.TargetPath, "after-new.bin"), []byte("lost"), 0o600); !errors.Is(err, unix.EIO) {
				t.Errorf("a write after EndSelfFence returned %v, want EIO", err)
			}
			f.checkFencedReported(id, stage.StagingTargetPath, publish.TargetPath)
			f.cleanUpFencedAndCheck(id, stage.StagingTargetPath, publish.TargetPath, image, before)
		})
	}
}

// TestRealCheckFencedShutsDown: on real ext4 and xfs, a volume fenced while
// its node was not self-fenced (stopped whole, say, and running again):
// its writes succeed into the orphaned inode, silently, until the periodic
// check shuts its filesystem down; from then on they fail with EIO, also
// through a file opened before, and the cleanup works as for any fenced
// volume.
func TestRealCheckFencedShutsDown(t *testing.T) {
	for _, tc := range []struct {
		fsType string
		size   int64
	}{{"ext4", 64 * mib}, {"xfs", 320 * mib}} { // xfs needs 300 MiB
		t.Run(tc.fsType, func(t *testing.T) {
			requireTool(t, "mkfs."+tc.fsType)
			f := sharedRealFixture(t)
			id := f.volumeOfSize("check-"+tc.fsType, pool.AccessMount, tc.fsType, tc.size, pool.Attachment{Node: testNode})
			c := volspectest.Mount(tc.fsType, snw)
			stage, publish := f.stageReq(id, c), f.publishReq(id, c, "pod1")
			thawInCleanup(t, stage.StagingTargetPath)
			f.stage(stage)
			f.publish(publish)
			before := writeRandomFile(t, filepath.Join(publish.TargetPath, "before.bin"), 1<<20)
			open, err := os.OpenFile(filepath.Join(publish.TargetPath, "after-open.bin"), os.O_WRONLY|os.O_CREATE, 0o600)
			if err != nil {
				t.Fatal(err)
			}
			defer open.Close()

			f.fence(id)
			image := checksum(t, f.pool.ImagePath(id))
			// What the problem is: acknowledged, and lost.
			writeRandomFile(t, filepath.Join(publish.TargetPath, "silent.bin"), 64<<10)

			if n := f.srv.FencedVolumes(f.ctx); n != 1 {
				t.Errorf("FencedVolumes after the fence = %d, want 1", n)
			}
			f.srv.checkFenced(f.ctx)
			if _, err := open.Write([]byte("lost")); !errors.Is(err, unix.EIO) {
				t.Errorf("a write through a file opened before the check returned %v, want EIO", err)
			}
			if err := os.WriteFile(filepath.Join(publish.TargetPath, "after-new.bin"), []byte("lost"), 0o600); !errors.Is(err, unix.EIO) {
				t.Errorf("a new file after the check: %v, want EIO", err)
			}
			open.Close()
			f.checkFencedReported(id, stage.StagingTargetPath, publish.TargetPath)
			f.cleanUpFencedAndCheck(id, stage.StagingTargetPath, publish.TargetPath, image, before)
			if n := f.srv.FencedVolumes(f.ctx); n != 0 {
				t.Errorf("FencedVolumes after the cleanup = %d, want 0", n)
			}
		})
	}
}

// checkFencedReported checks that stats and health still say volume id was
// fenced once its filesystem is shut down.
func (f *realFixture) checkFencedReported(id pool.VolumeID, staging, target string) {
	f.t.Helper()
	_, err := f.srv.NodeGetVolumeStats(f.ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: id.String(), VolumePath: target})
	wantError(f.t, err, codes.NotFound, "was fenced", "no longer reaches the volume")
	wantReason(f.t, f.healthOf(id, staging, target), reasonFenced, "INACCESSIBLE", "this node stopped answering")
}
