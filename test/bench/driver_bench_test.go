// Package bench holds benchmarks that print figures (median, p99, ratios
// against a baseline measured in the same run); they assert nothing about
// time. Run them with `make bench` and record the output in
// docs/benchmarks.md.
package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/loopvol/loopvol/internal/harness/testenv"
	"github.com/loopvol/loopvol/test/internal/attacherproc"
	"github.com/loopvol/loopvol/test/internal/driverproc"
	"golang.org/x/sys/unix"
)

// cluster is the control plane of the benchmarks that need one
// (BenchmarkAttacher); it starts only when such a benchmark asks for it and
// stops after the last benchmark.
var cluster testenv.Shared

func TestMain(m *testing.M) {
	code := cluster.Run(m)
	driverproc.Cleanup()
	attacherproc.Cleanup()
	os.Exit(code)
}

const (
	mib = int64(1) << 20
	gib = int64(1) << 30
)

// stats summarises a sample of durations.
type stats struct{ median, p99, min, max time.Duration }

func summarize(d []time.Duration) stats {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	idx := func(q float64) time.Duration { return s[min(len(s)-1, int(q*float64(len(s))))] }
	return stats{median: idx(0.5), p99: idx(0.99), min: s[0], max: s[len(s)-1]}
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d.Microseconds())/1000) }

// BenchmarkNodeLifecycle measures NodeStage (with mkfs of a blank 1 GiB
// volume), NodePublish, NodeUnpublish and NodeUnstage against the real
// driver process, over runs fresh volumes (LOOPVOL_BENCH_RUNS, default 20).
func BenchmarkNodeLifecycle(b *testing.B) {
	driverproc.RequireRoot(b)
	runs := 20
	if v := os.Getenv("LOOPVOL_BENCH_RUNS"); v != "" {
		fmt.Sscan(v, &runs)
	}
	for _, fs := range []string{"ext4", "xfs"} {
		b.Run(fs, func(b *testing.B) {
			dir := b.TempDir()
			kubelet := filepath.Join(dir, "kubelet")
			os.MkdirAll(filepath.Join(dir, "pool"), 0o750)
			d := driverproc.Start(b, dir, "--mode=all", "--node-id=bench", "--pool=bench="+filepath.Join(dir, "pool"), "--kubelet-dir="+kubelet, "--default-fstype="+fs)
			ctrl, node := csi.NewControllerClient(d.Conn), csi.NewNodeClient(d.Conn)
			ctx := context.Background()
			cap := &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
				AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}
			var stage, publish, unpublish, unstage []time.Duration
			timed := func(into *[]time.Duration, f func() error) {
				start := time.Now()
				if err := f(); err != nil {
					b.Fatal(err)
				}
				*into = append(*into, time.Since(start))
			}
			for i := range runs {
				vol, err := ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: fmt.Sprintf("bench-%d", i), CapacityRange: &csi.CapacityRange{RequiredBytes: gib}, VolumeCapabilities: []*csi.VolumeCapability{cap}})
				if err != nil {
					b.Fatal(err)
				}
				id := vol.Volume.VolumeId
				if _, err := ctrl.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "bench", VolumeCapability: cap}); err != nil {
					b.Fatal(err)
				}
				staging := filepath.Join(kubelet, "plugins", "st", id)
				target := filepath.Join(kubelet, "pods", id, "mount")
				os.MkdirAll(filepath.Dir(target), 0o750)
				timed(&stage, func() error {
					_, err := node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: cap})
					return err
				})
				timed(&publish, func() error {
					_, err := node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: cap})
					return err
				})
				timed(&unpublish, func() error {
					_, err := node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})
					return err
				})
				timed(&unstage, func() error {
					_, err := node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
					return err
				})
				ctrl.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: "bench"})
				if _, err := ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
					b.Fatal(err)
				}
			}
			fmt.Printf("\nnode lifecycle, %s, 1 GiB volumes, %d runs each\n", fs, runs)
			fmt.Printf("| call | median | p99 | min | max |\n|---|---|---|---|---|\n")
			for _, row := range []struct {
				name string
				d    []time.Duration
			}{{"NodeStageVolume (attach + mkfs + mount)", stage}, {"NodePublishVolume", publish}, {"NodeUnpublishVolume", unpublish}, {"NodeUnstageVolume (umount + detach)", unstage}} {
				s := summarize(row.d)
				fmt.Printf("| %s | %s | %s | %s | %s |\n", row.name, ms(s.median), ms(s.p99), ms(s.min), ms(s.max))
			}
		})
	}
}

// BenchmarkThroughput compares sequential O_DIRECT writes and reads of a
// file inside a published 1 GiB ext4 volume with the same I/O on a file in
// the pool's own filesystem, in one run. LOOPVOL_BENCH_MIB sets the amount
// (default 512 MiB); the figure is the median of 9 passes.
func BenchmarkThroughput(b *testing.B) {
	driverproc.RequireRoot(b)
	size := 512 * mib
	if v := os.Getenv("LOOPVOL_BENCH_MIB"); v != "" {
		var n int64
		fmt.Sscan(v, &n)
		size = n * mib
	}
	dir := b.TempDir()
	kubelet := filepath.Join(dir, "kubelet")
	poolDir := filepath.Join(dir, "pool")
	os.MkdirAll(poolDir, 0o750)
	d := driverproc.Start(b, dir, "--mode=all", "--node-id=bench", "--pool=bench="+poolDir, "--kubelet-dir="+kubelet)
	ctrl, node := csi.NewControllerClient(d.Conn), csi.NewNodeClient(d.Conn)
	ctx := context.Background()
	cap := &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4"}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}
	vol, err := ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "tput", CapacityRange: &csi.CapacityRange{RequiredBytes: gib}, VolumeCapabilities: []*csi.VolumeCapability{cap}})
	if err != nil {
		b.Fatal(err)
	}
	id := vol.Volume.VolumeId
	staging := filepath.Join(kubelet, "plugins", "st", id)
	target := filepath.Join(kubelet, "pods", id, "mount")
	os.MkdirAll(filepath.Dir(target), 0o750)
	if _, err := ctrl.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "bench", VolumeCapability: cap}); err != nil {
		b.Fatal(err)
	}
	if _, err := node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: cap}); err != nil {
		b.Fatal(err)
	}
	if _, err := node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: cap}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})
		node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
	})
	dio, _ := os.ReadFile("/sys/block/" + loopName(b, dir) + "/loop/dio")
	raw := filepath.Join(poolDir, "raw-baseline.bin")
	inVol := filepath.Join(target, "data.bin")
	const passes = 9
	var rawW, rawR, volW, volR []float64
	for range passes {
		// Alternate the two so that drift of the host affects both alike.
		rawW = append(rawW, seqIO(b, raw, size, true))
		volW = append(volW, seqIO(b, inVol, size, true))
		rawR = append(rawR, seqIO(b, raw, size, false))
		volR = append(volR, seqIO(b, inVol, size, false))
	}
	med := func(v []float64) float64 { sort.Float64s(v); return v[len(v)/2] }
	fmt.Printf("\nsequential O_DIRECT I/O, 1 MiB blocks, %d MiB per pass, median of %d passes (loop dio=%s)\n", size/mib, passes, strings.TrimSpace(string(dio)))
	fmt.Printf("| | pool filesystem (baseline) | through the published volume | ratio |\n|---|---|---|---|\n")
	fmt.Printf("| write | %.0f MiB/s | %.0f MiB/s | %.0f%% |\n", med(rawW), med(volW), 100*med(volW)/med(rawW))
	fmt.Printf("| read | %.0f MiB/s | %.0f MiB/s | %.0f%% |\n", med(rawR), med(volR), 100*med(volR)/med(rawR))
}

// loopName finds the loop device backing an image under dir.
func loopName(b *testing.B, dir string) string {
	devs := driverproc.LoopDevicesOf(dir)
	if len(devs) != 1 {
		b.Fatalf("want one loop device under %s, have %v", dir, devs)
	}
	return filepath.Base(devs[0])
}

// seqIO writes (with fsync) or reads size bytes of path with O_DIRECT in
// 1 MiB blocks and returns MiB/s.
func seqIO(b *testing.B, path string, size int64, write bool) float64 {
	flags := unix.O_DIRECT | os.O_RDONLY
	if write {
		flags = unix.O_DIRECT | os.O_WRONLY | os.O_CREATE | os.O_TRUNC
	}
	f, err := os.OpenFile(path, flags, 0o600)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	buf := alignedBuffer(int(mib))
	for i := range buf {
		buf[i] = byte(i)
	}
	start := time.Now()
	for done := int64(0); done < size; done += mib {
		if write {
			_, err = f.Write(buf)
		} else {
			_, err = f.Read(buf)
		}
		if err != nil {
			b.Fatal(err)
		}
	}
	if write {
		if err := f.Sync(); err != nil {
			b.Fatal(err)
		}
	}
	return float64(size) / float64(mib) / time.Since(start).Seconds()
}

// alignedBuffer returns a buffer aligned to 4 KiB, as O_DIRECT needs.
func alignedBuffer(n int) []byte {
	raw := make([]byte, n+4096)
	off := 4096 - int(uintptr(unsafe.Pointer(&raw[0]))&4095)
	if off == 4096 {
		off = 0
	}
	return raw[off : off+n]
}
