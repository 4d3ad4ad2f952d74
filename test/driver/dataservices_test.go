package driver

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
)

// imagePath is the pool file of a volume.
func (s *snapPool) imagePath(volumeID string) string {
	return filepath.Join(s.pool, "volumes", volumeID[strings.LastIndex(volumeID, ".")+1:]+".img")
}

// TestGroupSnapshotOfMountedVolumes: through the real driver (--mode=all),
// a group snapshot of three mounted ext4 volumes with data written but not
// synced. The driver freezes them (they are mounted on its node), so every
// member holds its volume's data and checks clean without journal
// recovery; each restores to a new volume that holds the data.
func TestGroupSnapshotOfMountedVolumes(t *testing.T) {
	s := newSnapPool(t, false)
	cap := mountCap(snw, "ext4")
	var vols []string
	want := map[string][]byte{}
	for i := range 3 {
		v := s.createFrom(t, fmt.Sprint("pvc-member-", i), 64*mib, cap, nil)
		target := s.attach(t, v.GetVolumeId(), cap)
		data := make([]byte, 4<<20)
		rand.Read(data)
		// Not synced: only a freeze puts it in the snapshot for sure.
		if err := os.WriteFile(filepath.Join(target, "data"), data, 0o600); err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(data)
		vols, want[v.GetVolumeId()] = append(vols, v.GetVolumeId()), sum[:]
	}
	g, err := csi.NewGroupControllerClient(s.d.Conn).CreateVolumeGroupSnapshot(bg(), &csi.CreateVolumeGroupSnapshotRequest{Name: "group-1", SourceVolumeIds: vols})
	if err != nil {
		t.Fatalf("CreateVolumeGroupSnapshot: %v", err)
	}
	if !g.GetGroupSnapshot().GetReadyToUse() || len(g.GetGroupSnapshot().GetSnapshots()) != 3 {
		t.Fatalf("group snapshot %v", g.GetGroupSnapshot())
	}
	for i, snap := range g.GetGroupSnapshot().GetSnapshots() {
		img := filepath.Join(s.pool, "volumes", snap.GetSnapshotId()[strings.LastIndex(snap.GetSnapshotId(), ".")+1:]+".img")
		if out, err := exec.Command("e2fsck", "-fn", img).CombinedOutput(); err != nil {
			t.Errorf("member %d: e2fsck -fn (a frozen filesystem needs no recovery): %v\n%s", i, err, out)
		}
		r := s.createFrom(t, fmt.Sprint("pvc-restored-", i), 64*mib, cap, &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
			Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snap.GetSnapshotId()}}})
		rt := s.attach(t, r.GetVolumeId(), cap)
		if got := checksum(t, filepath.Join(rt, "data")); !bytes.Equal(got, want[snap.GetSourceVolumeId()]) {
			t.Errorf("member %d restored without its volume's data", i)
		}
		s.detach(t, r.GetVolumeId())
		if _, err := s.ctrl.DeleteVolume(bg(), &csi.DeleteVolumeRequest{VolumeId: r.GetVolumeId()}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := csi.NewGroupControllerClient(s.d.Conn).DeleteVolumeGroupSnapshot(bg(), &csi.DeleteVolumeGroupSnapshotRequest{GroupSnapshotId: g.GetGroupSnapshot().GetGroupSnapshotId()}); err != nil {
		t.Fatal(err)
	}
	for _, v := range vols {
		s.detach(t, v)
		if _, err := s.ctrl.DeleteVolume(bg(), &csi.DeleteVolumeRequest{VolumeId: v}); err != nil {
			t.Fatal(err)
		}
	}
	if left := poolEntries(t, s.pool); len(left) != 0 {
		t.Fatalf("files left in the pool: %v", left)
	}
}

// TestModifyPreallocateThroughTheDriver: a thick volume with data is made
// thin (refused while attached, done once detached), thick again while
// attached, and keeps its data throughout.
func TestModifyPreallocateThroughTheDriver(t *testing.T) {
	s := newSnapPool(t, false)
	cap := mountCap(snw, "ext4")
	v := s.createFrom(t, "pvc-modify", 256*mib, cap, nil)
	allocated := func() int64 {
		var st unix.Stat_t
		if err := unix.Stat(s.imagePath(v.GetVolumeId()), &st); err != nil {
			t.Fatal(err)
		}
		return st.Blocks * 512
	}
	modify := func(value string) error {
		_, err := s.ctrl.ControllerModifyVolume(bg(), &csi.ControllerModifyVolumeRequest{VolumeId: v.GetVolumeId(), MutableParameters: map[string]string{"preallocate": value}})
		return err
	}
	target := s.attach(t, v.GetVolumeId(), cap)
	want := writeRandom(t, filepath.Join(target, "data"), 8<<20)
	wantCode(t, "thinning an attached volume", modify("false"), codes.FailedPrecondition)
	s.detach(t, v.GetVolumeId())
	if err := modify("false"); err != nil {
		t.Fatal(err)
	}
	if a := allocated(); a > 64*mib {
		t.Errorf("a thin 256 MiB volume with 8 MiB of data and an ext4 has %d bytes allocated", a)
	}
	target = s.attach(t, v.GetVolumeId(), cap)
	if got := checksum(t, filepath.Join(target, "data")); !bytes.Equal(got, want) {
		t.Fatal("the data changed when the volume was made thin")
	}
	if err := modify("true"); err != nil {
		t.Fatal(err)
	}
	if a := allocated(); a < 256*mib {
		t.Errorf("a thick 256 MiB volume has %d bytes allocated", a)
	}
	if got := checksum(t, filepath.Join(target, "data")); !bytes.Equal(got, want) {
		t.Fatal("the data changed when the volume was made thick")
	}
	wantCode(t, "an unknown key", func() error {
		_, err := s.ctrl.ControllerModifyVolume(bg(), &csi.ControllerModifyVolumeRequest{VolumeId: v.GetVolumeId(), MutableParameters: map[string]string{"iops": "100"}})
		return err
	}(), codes.InvalidArgument)
	s.detach(t, v.GetVolumeId())
}

// isFrozen reports whether the filesystem mounted at dir is frozen (a
// second freeze is EBUSY); one that was not is thawed again.
func isFrozen(t *testing.T, dir string) bool {
	t.Helper()
	const fifreeze, fithaw = 0xC0045877, 0xC0045878
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.IoctlSetInt(fd, fifreeze, 0); err == unix.EBUSY {
		return true
	} else if err != nil {
		t.Fatalf("FIFREEZE %s: %v", dir, err)
	}
	unix.IoctlSetInt(fd, fithaw, 0)
	return false
}

// TestKilledWhileFrozen: the driver is killed (SIGKILL) while it copies a
// snapshot of a mounted volume, which it froze; the filesystem stays frozen
// (no deferred thaw runs), and the restarted driver thaws it before it
// serves; the retried snapshot then completes.
func TestKilledWhileFrozen(t *testing.T) {
	s := newSnapPool(t, false)
	cap := mountCap(snw, "ext4")
	src := s.createFrom(t, "pvc-frozen", 2*gib, cap, nil)
	target := s.attach(t, src.GetVolumeId(), cap)
	// Data, so that the copy takes a while.
	if out, err := exec.Command("dd", "if=/dev/urandom", "of="+filepath.Join(target, "data"), "bs=4M", "count=384", "conv=fsync", "status=none").CombinedOutput(); err != nil {
		t.Fatalf("dd: %v: %s", err, out)
	}
	staging, _ := paths(s.kubelet, filepath.Base(src.GetVolumeId()))
	// A failure leaves the filesystem frozen: thawed before the unmounts
	// of the pool's cleanup (which runs after this one).
	t.Cleanup(func() { exec.Command("fsfreeze", "-u", staging).Run() })
	done := make(chan error, 1)
	go func() {
		_, err := s.ctrl.CreateSnapshot(bg(), &csi.CreateSnapshotRequest{Name: "snap-frozen", SourceVolumeId: src.GetVolumeId()})
		done <- err
	}()
	// The record that says not ready is written while the source is frozen.
	for found := false; !found; {
		for _, name := range poolEntries(t, s.pool) {
			found = found || (strings.HasPrefix(name, "snap-") && strings.HasSuffix(name, ".json"))
		}
		select {
		case err := <-done:
			t.Fatalf("CreateSnapshot finished (%v) before the test saw its record", err)
		case <-time.After(time.Millisecond):
		}
	}
	s.d.Kill()
	<-done
	if !isFrozen(t, staging) {
		t.Skip("the copy finished before the kill; nothing was left frozen")
	}
	s.start(t)
	if isFrozen(t, staging) {
		t.Fatal("the restarted driver left the volume frozen")
	}
	if err := os.WriteFile(filepath.Join(target, "after"), []byte("writable\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ctrl.CreateSnapshot(bg(), &csi.CreateSnapshotRequest{Name: "snap-frozen", SourceVolumeId: src.GetVolumeId()}); err != nil {
		t.Fatalf("retried CreateSnapshot: %v", err)
	}
	if isFrozen(t, staging) {
		t.Fatal("frozen after the retried snapshot")
	}
	s.detach(t, src.GetVolumeId())
}
