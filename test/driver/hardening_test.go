package driver

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/loopvol/loopvol/test/internal/driverproc"
	"google.golang.org/grpc/codes"
)

// TestNodeRefusesHostilePathsAndFlags runs the real driver: mount flags
// outside the allowlist and rw on a read-only publish are INVALID_ARGUMENT
// and mount nothing; a target that is a symlink to another volume's mount,
// or a plain file, is left alone by NodeUnpublishVolume (OK), as is the
// other volume; a staging path through a symlink out of the kubelet
// directory is refused and nothing appears outside.
func TestNodeRefusesHostilePathsAndFlags(t *testing.T) {
	c := newCluster(t)
	cap := mountCap(snw, "ext4")
	a := c.create(t, "pvc-hostile-a", 32*mib, cap)
	b := c.create(t, "pvc-hostile-b", 32*mib, cap)
	for _, id := range []string{a, b} {
		if err := c.publish(t, id, "node-a", cap); err != nil {
			t.Fatal(err)
		}
	}
	stagingB, targetB := paths(c.kubeletA, filepath.Base(b))
	for _, flag := range []string{"loop", "X-mount.subdir=lost+found"} {
		flagged := mountCap(snw, "ext4")
		flagged.GetMount().MountFlags = []string{"noatime", flag}
		_, err := c.nodeA.NodeStageVolume(bg(), &csi.NodeStageVolumeRequest{VolumeId: b, StagingTargetPath: stagingB, VolumeCapability: flagged})
		wantCode(t, "NodeStageVolume with "+flag, err, codes.InvalidArgument)
	}
	if m := driverproc.Mounts(c.dir); len(m) != 0 {
		t.Fatalf("refused flags mounted %v", m)
	}
	if devs := driverproc.LoopDevicesOf(c.dir); len(devs) != 0 {
		t.Fatalf("refused flags attached %v", devs)
	}

	targetA := c.stagePublish(t, c.nodeA, c.kubeletA, a, cap, false)
	want := writeRandom(t, filepath.Join(targetA, "data"), 1<<20)
	if _, err := c.nodeA.NodeStageVolume(bg(), &csi.NodeStageVolumeRequest{VolumeId: b, StagingTargetPath: stagingB, VolumeCapability: cap}); err != nil {
		t.Fatal(err)
	}
	rw := mountCap(snw, "ext4")
	rw.GetMount().MountFlags = []string{"rw"}
	_, err := c.nodeA.NodePublishVolume(bg(), &csi.NodePublishVolumeRequest{VolumeId: b, StagingTargetPath: stagingB, TargetPath: targetB, VolumeCapability: rw, Readonly: true})
	wantCode(t, "read-only NodePublishVolume with rw", err, codes.InvalidArgument)

	link := filepath.Join(c.kubeletA, "pods", "link")
	if err := os.Symlink(targetA, link); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(c.kubeletA, "pods", "file")
	if err := os.WriteFile(file, []byte("precious"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, target := range []string{link, file} {
		for _, id := range []string{a, b} {
			if _, err := c.nodeA.NodeUnpublishVolume(bg(), &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
				t.Fatalf("NodeUnpublishVolume %s of %s: %v", target, id, err)
			}
		}
	}
	if fi, err := os.Lstat(link); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Errorf("the symlink was changed: %v, %v", fi, err)
	}
	if data, err := os.ReadFile(file); err != nil || string(data) != "precious" {
		t.Errorf("the plain file: %q, %v", data, err)
	}
	if got := checksum(t, filepath.Join(targetA, "data")); string(got) != string(want) {
		t.Errorf("volume a's data changed or its mount is gone")
	}

	outside := filepath.Join(c.dir, "outside")
	if err := os.MkdirAll(outside, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(c.kubeletA, "escape")); err != nil {
		t.Fatal(err)
	}
	_, err = c.nodeA.NodePublishVolume(bg(), &csi.NodePublishVolumeRequest{VolumeId: b, StagingTargetPath: stagingB,
		TargetPath: filepath.Join(c.kubeletA, "escape", "pod", "mount"), VolumeCapability: cap})
	wantCode(t, "NodePublishVolume through a symlink out", err, codes.InvalidArgument)
	if entries, _ := os.ReadDir(outside); len(entries) != 0 {
		t.Errorf("created %v outside the kubelet directory", entries)
	}
	for _, m := range driverproc.Mounts(c.dir) {
		if strings.Contains(m, outside) {
			t.Errorf("mounted outside the kubelet directory: %s", m)
		}
	}

	c.unpublishUnstage(t, c.nodeA, c.kubeletA, a)
	if _, err := c.nodeA.NodeUnstageVolume(bg(), &csi.NodeUnstageVolumeRequest{VolumeId: b, StagingTargetPath: stagingB}); err != nil {
		t.Fatal(err)
	}
}
