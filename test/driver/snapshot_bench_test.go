package driver

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
)

// BenchmarkSnapshot times, through the real driver, CreateSnapshot and a
// restore (CreateVolume from the snapshot) of a 1 GiB and a 10 GiB block
// volume whose image is full of random data, on a pool on ext4 (the copy
// path) and on a loop-mounted xfs with reflink=1 (the reflink path), and in
// the same run the physical baselines on the same image: cp --sparse=always
// and cp --reflink=always. The page cache is warm for all of them (the image
// was just written). MB/s counts the volume's size. The 10 GiB run needs
// about 32 GiB free where TMPDIR is (source, snapshot and restore on ext4)
// and is skipped with less. Figures: docs/benchmarks.md.
//
//	go test -run '^$' -bench Snapshot -benchtime 3x -timeout 60m ./test/driver/
func BenchmarkSnapshot(b *testing.B) {
	for _, size := range []int64{gib, 10 * gib} {
		b.Run(fmt.Sprintf("%dGiB", size/gib), func(b *testing.B) {
			if need := 3*size + 2*gib; freeBytes(b, os.TempDir()) < need {
				b.Skipf("%s has less than %d GiB free", os.TempDir(), need/gib)
			}
			benchmarkSnapshot(b, size)
		})
	}
}

func freeBytes(b *testing.B, dir string) int64 {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		b.Fatal(err)
	}
	return int64(st.Bavail) * st.Bsize
}

func benchmarkSnapshot(b *testing.B, size int64) {
	for _, pc := range []struct {
		name    string
		reflink bool
		cp      string
	}{{"ext4-copy", false, "--sparse=always"}, {"xfs-reflink", true, "--reflink=always"}} {
		b.Run(pc.name, func(b *testing.B) {
			s := newSnapPool(b, pc.reflink)
			cap := blockCap(snw)
			src := s.createFrom(b, "pvc-bench", size, cap, nil)
			img := filepath.Join(s.pool, "volumes", src.GetVolumeId()[strings.LastIndex(src.GetVolumeId(), ".")+1:]+".img")
			if out, err := exec.Command("dd", "if=/dev/urandom", "of="+img, "bs=4M", fmt.Sprint("count=", size/(4<<20)), "conv=notrunc,fsync", "status=none").CombinedOutput(); err != nil {
				b.Fatalf("dd: %v: %s", err, out)
			}
			b.Run("CreateSnapshot", func(b *testing.B) {
				b.SetBytes(size)
				for i := 0; i < b.N; i++ {
					resp, err := s.ctrl.CreateSnapshot(bg(), &csi.CreateSnapshotRequest{Name: fmt.Sprint("snap-", i), SourceVolumeId: src.GetVolumeId()})
					if err != nil {
						b.Fatal(err)
					}
					b.StopTimer()
					if _, err := s.ctrl.DeleteSnapshot(bg(), &csi.DeleteSnapshotRequest{SnapshotId: resp.GetSnapshot().GetSnapshotId()}); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
				}
			})
			snap, err := s.ctrl.CreateSnapshot(bg(), &csi.CreateSnapshotRequest{Name: "snap-restore", SourceVolumeId: src.GetVolumeId()})
			if err != nil {
				b.Fatal(err)
			}
			b.Run("Restore", func(b *testing.B) {
				b.SetBytes(size)
				for i := 0; i < b.N; i++ {
					v := s.createFrom(b, fmt.Sprint("pvc-restore-", i), size, cap, &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
						Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snap.GetSnapshot().GetSnapshotId()}}})
					b.StopTimer()
					if _, err := s.ctrl.DeleteVolume(bg(), &csi.DeleteVolumeRequest{VolumeId: v.GetVolumeId()}); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
				}
			})
			b.Run("cp"+pc.cp, func(b *testing.B) {
				dst := filepath.Join(s.pool, "cp-copy.img")
				b.SetBytes(size)
				for i := 0; i < b.N; i++ {
					// cp and then fsync, as the driver syncs its image.
					if out, err := exec.Command("sh", "-c", "cp "+pc.cp+" \"$1\" \"$2\" && sync \"$2\"", "cp", img, dst).CombinedOutput(); err != nil {
						b.Fatalf("cp: %v: %s", err, out)
					}
					b.StopTimer()
					os.Remove(dst)
					b.StartTimer()
				}
			})
		})
	}
}
