package node

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/loopvol/loopvol/pkg/pool"
	"github.com/loopvol/loopvol/pkg/volspec/volspectest"
)

// healthReasons returns the reasons NodeGetVolumeHealth reports, each with
// its message.
func (f *realFixture) healthReasons(id pool.VolumeID, staging string) map[string]string {
	f.t.Helper()
	resp, err := f.srv.NodeGetVolumeHealth(f.ctx, &csi.NodeGetVolumeHealthRequest{VolumeId: id.String(), StagingTargetPath: staging})
	if err != nil {
		f.t.Fatalf("NodeGetVolumeHealth: %v", err)
	}
	out := map[string]string{}
	for _, e := range resp.GetVolumeHealth().GetHealthStatuses() {
		out[e.GetReason()] = e.GetStatus().String() + ": " + e.GetMessage()
	}
	return out
}

func wantReason(t *testing.T, got map[string]string, reason string, parts ...string) {
	t.Helper()
	msg, ok := got[reason]
	if !ok {
		t.Fatalf("health reasons %v, want %s", got, reason)
	}
	for _, p := range parts {
		if !strings.Contains(msg, p) {
			t.Errorf("%s message %q lacks %q", reason, msg, p)
		}
	}
}

// TestRealFilesystemHealth: an ext4 that recorded an error and an xfs that
// shut down are reported, with what to do; a healthy one is not.
func TestRealFilesystemHealth(t *testing.T) {
	for _, tc := range []struct {
		fsType string
		flags  []string
		// fail makes the mounted filesystem at dir (on dev) fail.
		fail   func(t *testing.T, dir, dev string)
		reason string
		parts  []string
	}{
		{
			fsType: "ext4",
			// remount-ro: the kernel writes the error count into the
			// superblock at once (with continue, a work item does it
			// later).
			flags: []string{"errors=remount-ro"},
			fail: func(t *testing.T, dir, dev string) {
				// The kernel's own way to record an ext4 error.
				trigger := filepath.Join("/sys/fs/ext4", filepath.Base(dev), "trigger_fs_error")
				if err := os.WriteFile(trigger, []byte("loopvol health test\n"), 0o200); err != nil {
					t.Skipf("cannot trigger an ext4 error: %v", err)
				}
			},
			reason: reasonFilesystemErrors, parts: []string{"recorded 1 errors", "e2fsck -f"},
		},
		{
			fsType: "xfs",
			fail: func(t *testing.T, dir, dev string) {
				if out, err := exec.Command("xfs_io", "-x", "-c", "shutdown", dir).CombinedOutput(); err != nil {
					t.Skipf("cannot shut xfs down: %v: %s", err, out)
				}
			},
			reason: reasonFilesystemShutdown, parts: []string{"has shut down", "xfs_repair"},
		},
	} {
		t.Run(tc.fsType, func(t *testing.T) {
			requireTool(t, "mkfs."+tc.fsType)
			f := newRealFixture(t)
			id := f.volumeOfSize("health-"+tc.fsType, pool.AccessMount, tc.fsType, 400*mib, pool.Attachment{Node: testNode})
			stage := f.stageReq(id, volspectest.Mount(tc.fsType, snw, tc.flags...))
			f.stage(stage)
			if got := f.healthReasons(id, stage.StagingTargetPath); len(got) != 0 {
				t.Fatalf("a healthy volume reports %v", got)
			}
			dev, _, err := f.cfg.Loop.Find(f.pool.ImagePath(id))
			if err != nil {
				t.Fatal(err)
			}
			tc.fail(t, stage.StagingTargetPath, dev)
			wantReason(t, f.healthReasons(id, stage.StagingTargetPath), tc.reason, tc.parts...)
			// Unstaged like any other, also a shut-down xfs, whose root
			// answers every stat with EIO.
			f.unstage(id, stage.StagingTargetPath)
			f.checkGone(id)
		})
	}
}

// TestRealImageHealth: an image truncated outside loopvol and an image
// replaced under its loop device are reported as data loss.
func TestRealImageHealth(t *testing.T) {
	f := newRealFixture(t)
	t.Run("truncated", func(t *testing.T) {
		id := f.volumeOfSize("truncated", pool.AccessBlock, "", 64*mib, pool.Attachment{Node: testNode})
		if err := os.Truncate(f.pool.ImagePath(id), 16*mib); err != nil {
			t.Fatal(err)
		}
		wantReason(t, f.healthReasons(id, ""), reasonImageTruncated, "holds 16777216 bytes, the volume is 67108864", "restore")
	})
	t.Run("replaced under its loop device", func(t *testing.T) {
		id := f.volumeOfSize("replaced", pool.AccessBlock, "", 16*mib, pool.Attachment{Node: testNode})
		stage := f.stageReq(id, volspectest.Block(snw))
		f.stage(stage)
		image := f.pool.ImagePath(id)
		// Another file renamed over the image: the device keeps the old one.
		other := image + ".new"
		if err := os.WriteFile(other, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(other, 16*mib); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(other, image); err != nil {
			t.Fatal(err)
		}
		wantReason(t, f.healthReasons(id, stage.StagingTargetPath), reasonBackingFileReplaced, "still serves a deleted file", "dd if=/dev/loop")
	})
}

func TestNodeGetStorageHealth(t *testing.T) {
	f := newFixture(t)
	resp, err := f.srv.NodeGetStorageHealth(f.ctx, &csi.NodeGetStorageHealthRequest{})
	if err != nil || len(resp.GetBackendHealth()) != 0 {
		t.Fatalf("a healthy pool: %v, %v", resp, err)
	}
	// The pool's marker gone (its directory replaced by an empty one, a
	// mount that did not come up): unreachable.
	if err := os.Remove(filepath.Join(f.pool.Path, ".loopvol-pool")); err != nil {
		t.Fatal(err)
	}
	resp, err = f.srv.NodeGetStorageHealth(f.ctx, &csi.NodeGetStorageHealthRequest{})
	if err != nil || len(resp.GetBackendHealth()) != 1 {
		t.Fatalf("a pool without its marker: %v, %v", resp, err)
	}
	h := resp.GetBackendHealth()[0]
	if h.GetStatus() != csi.StorageHealthErrorType_STORAGE_UNREACHABLE || h.GetReason() != reasonPoolUnusable || !strings.Contains(h.GetMessage(), ".loopvol-pool marker") {
		t.Errorf("a pool without its marker: %v", h)
	}
}
