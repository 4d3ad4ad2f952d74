package node

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/loopvol/loopvol/pkg/pool"
	"github.com/loopvol/loopvol/pkg/volspec/volspectest"
)

// probeFrozen tells whether the filesystem mounted at dir is frozen: a
// FIFREEZE answers EBUSY when it is; one that succeeds froze it, and is
// undone at once.
func probeFrozen(t *testing.T, dir string) bool {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	switch err := unix.IoctlSetInt(fd, ioctlFIFREEZE, 0); {
	case errors.Is(err, unix.EBUSY):
		return true
	case err != nil:
		t.Fatalf("FIFREEZE %s: %v", dir, err)
	}
	if err := unix.IoctlSetInt(fd, ioctlFITHAW, 0); err != nil {
		t.Fatalf("FITHAW %s: %v", dir, err)
	}
	return false
}

// thawInCleanup thaws the filesystems at dirs when the test ends, before
// their unmount (cleanups run last-in first-out, and newRealFixture's
// unmount was registered first): a failing test never leaves one frozen.
func thawInCleanup(t *testing.T, dirs ...string) {
	t.Cleanup(func() {
		for _, dir := range dirs {
			if fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err == nil {
				_ = unix.IoctlSetInt(fd, ioctlFITHAW, 0)
				unix.Close(fd)
			}
		}
	})
}

// TestRealSelfFence: on real loop devices and mounts, with the pool shared
// (a second node's record in it), SelfFence freezes a staged ext4 or xfs
// volume: a write started after it does not complete until EndSelfFence,
// which thaws it. A local pool's volume is never frozen. A volume fenced
// while the node is self-fenced is shut down by EndSelfFence instead of
// thawed (TestRealSelfFencedVolumeFencedShutDown has its writers), and its
// unstage unmounts it and cleans it up.
func TestRealSelfFence(t *testing.T) {
	for _, tc := range []struct {
		fsType string
		size   int64
	}{{"ext4", 64 * mib}, {"xfs", 320 * mib}} { // xfs needs 300 MiB
		t.Run(tc.fsType, func(t *testing.T) {
			requireTool(t, "mkfs."+tc.fsType)
			requireTool(t, "mkfs.ext4")
			f := newRealFixture(t)
			local, err := pool.Open(pool.Options{Name: "local", Zone: testZone, Path: filepath.Join(filepath.Dir(f.pool.Path), "local")})
			if err != nil {
				t.Fatal(err)
			}
			f.cfg.Pools[local.Name] = local
			if f.srv, err = New(f.cfg); err != nil {
				t.Fatal(err)
			}
			if err := f.pool.WriteNode(pool.NodeRecord{ID: "node-b", Zone: testZone, LastStart: time.Now().UTC()}); err != nil {
				t.Fatal(err)
			}

			id := f.volumeOfSize("selffence-"+tc.fsType, pool.AccessMount, tc.fsType, tc.size, pool.Attachment{Node: testNode})
			c := volspectest.Mount(tc.fsType, snw)
			stage, publish := f.stageReq(id, c), f.publishReq(id, c, "pod1")
			localID := pool.DeriveVolumeID(local.Name, "local")
			func() {
				unlock, err := local.Lock(localID)
				if err != nil {
					t.Fatal(err)
				}
				defer unlock()
				v, err := local.CreateVolume(f.ctx, pool.VolumeSpec{Name: "local", SizeBytes: 64 * mib, AccessType: pool.AccessMount, FsType: "ext4"})
				if err != nil {
					t.Fatal(err)
				}
				v.Attachments = []pool.Attachment{{Node: testNode}}
				if err := local.WriteVolume(v); err != nil {
					t.Fatal(err)
				}
			}()
			localStage := f.stageReq(localID, volspectest.Mount("ext4", snw))
			thawInCleanup(t, stage.StagingTargetPath, localStage.StagingTargetPath)
			f.stage(stage)
			f.publish(publish)
			f.stage(localStage)

			f.srv.SelfFence(f.ctx)
			if !probeFrozen(t, stage.StagingTargetPath) {
				t.Fatal("the shared pool's volume is not frozen after SelfFence")
			}
			if probeFrozen(t, localStage.StagingTargetPath) {
				t.Error("the local pool's volume is frozen")
			}
			wrote := make(chan error, 1)
			go func() {
				wrote <- os.WriteFile(filepath.Join(publish.TargetPath, "during.bin"), make([]byte, 64<<10), 0o600)
			}()
			select {
			case err := <-wrote:
				t.Fatalf("a write to the self-fenced volume completed (%v)", err)
			case <-time.After(300 * time.Millisecond):
			}
			f.srv.EndSelfFence(f.ctx)
			if err := <-wrote; err != nil {
				t.Fatalf("the write after EndSelfFence: %v", err)
			}
			if probeFrozen(t, stage.StagingTargetPath) {
				t.Error("still frozen after EndSelfFence")
			}

			// Fenced while self-fenced: shut down, so writes fail; the
			// unstage cleans it up all the same.
			f.srv.SelfFence(f.ctx)
			f.fence(id)
			f.srv.EndSelfFence(f.ctx)
			if err := os.WriteFile(filepath.Join(publish.TargetPath, "after.bin"), []byte("lost"), 0o600); !errors.Is(err, unix.EIO) {
				t.Errorf("a write to the volume fenced while self-fenced returned %v, want EIO", err)
			}
			f.unpublish(id, publish.TargetPath)
			f.unstage(id, stage.StagingTargetPath)
			if devs, err := f.cfg.Loop.FindReplaced(f.pool.ImagePath(id)); err != nil || len(devs) != 0 {
				t.Errorf("fenced devices after the unstage: %v, %v", devs, err)
			}
			f.unstage(localID, localStage.StagingTargetPath)
			f.checkGone(id)
		})
	}
}
