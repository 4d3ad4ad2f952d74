package bench

import (
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/loopvol/loopvol/test/internal/driverproc"
	"golang.org/x/sys/unix"
)

// fioKnobs are the environment settings of BenchmarkFio. The defaults are
// the recorded run (about 15 minutes on the 2-core VM); a quick run is
// LOOPVOL_BENCH_FIO_PASSES=1 LOOPVOL_BENCH_FIO_RUNTIME=1s
// LOOPVOL_BENCH_FIO_SIZE_MIB=256 LOOPVOL_BENCH_FIO_CACHE_MIB=512.
type fioKnobs struct {
	passes int
	// size is the file each job works on (and the raw block volume).
	size int64
	// cache is the sequential write of the page cache measurement.
	cache   int64
	runtime time.Duration
	// queue are sysfs queue settings ("nr_requests=64,read_ahead_kb=128")
	// the benchmark writes to every volume's loop device after staging, to
	// compare a setting with the one the driver chose.
	queue map[string]string
	// ab are sysfs queue settings to compare with the driver's: every
	// volume is measured twice, alternately, once as the driver left it
	// and once with these ("<volume> (B)").
	ab map[string]string
	// jobs, when set, runs only the jobs whose name contains one of these.
	jobs []string
}

func loadFioKnobs(tb testing.TB) fioKnobs {
	tb.Helper()
	k := fioKnobs{passes: 5, size: 1024 * mib, cache: 4096 * mib, runtime: 3 * time.Second}
	for name, into := range map[string]*int64{"LOOPVOL_BENCH_FIO_SIZE_MIB": &k.size, "LOOPVOL_BENCH_FIO_CACHE_MIB": &k.cache} {
		if v := os.Getenv(name); v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 16 {
				tb.Fatalf("%s=%q: want a number of MiB >= 16", name, v)
			}
			*into = n * mib
		}
	}
	if v := os.Getenv("LOOPVOL_BENCH_FIO_PASSES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			tb.Fatalf("LOOPVOL_BENCH_FIO_PASSES=%q: want a number >= 1", v)
		}
		k.passes = n
	}
	if v := os.Getenv("LOOPVOL_BENCH_FIO_RUNTIME"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < time.Second {
			tb.Fatalf("LOOPVOL_BENCH_FIO_RUNTIME=%q: want a duration >= 1s", v)
		}
		k.runtime = d
	}
	k.queue = parseQueue(tb, "LOOPVOL_BENCH_FIO_QUEUE")
	k.ab = parseQueue(tb, "LOOPVOL_BENCH_FIO_AB")
	if v := os.Getenv("LOOPVOL_BENCH_FIO_JOBS"); v != "" {
		k.jobs = strings.Split(v, ",")
	}
	return k
}

// parseQueue reads "name=value,..." of sysfs queue attributes from env.
func parseQueue(tb testing.TB, env string) map[string]string {
	v := os.Getenv(env)
	if v == "" {
		return nil
	}
	q := map[string]string{}
	for _, kv := range strings.Split(v, ",") {
		name, val, ok := strings.Cut(kv, "=")
		if !ok || strings.ContainsAny(name, "/.") {
			tb.Fatalf("%s: %q is not name=value", env, kv)
		}
		q[name] = val
	}
	return q
}

// fioTarget is one place the jobs run: a file on the pool's filesystem (the
// baseline), a file in a published ext4 or xfs volume, or the published raw
// block volume itself.
type fioTarget struct {
	name string
	// file is what fio opens.
	file string
	// dev is the volume's loop device ("" for the baseline).
	dev string
	// image is the volume's image file in the pool ("" for the baseline).
	image string
	// dir is where the page cache test writes ("" where it does not run).
	dir string
	// queue is written to the device's sysfs queue before each run on it.
	queue map[string]string
}

// apply sets the target's queue settings.
func (t fioTarget) apply(b *testing.B) {
	for name, val := range t.queue {
		p := filepath.Join("/sys/block", filepath.Base(t.dev), "queue", name)
		if err := os.WriteFile(p, []byte(val), 0); err != nil {
			b.Fatalf("%s: %v", t.name, err)
		}
	}
}

// BenchmarkFio runs the same fio jobs, pass after pass and target after
// target (the order rotates each pass, so drift of the shared host falls on
// every target alike), on a file of the pool's filesystem and inside
// published loopvol volumes: ext4, xfs and raw block. The raw block volume
// against the pool file is the cost of the loop device alone; ext4 and xfs
// against the raw block volume is the cost of a filesystem on a filesystem.
// It then measures the page cache that a large buffered write inside a
// volume makes the image file hold, against the same write on the pool.
func BenchmarkFio(b *testing.B) {
	driverproc.RequireRoot(b)
	fio, err := exec.LookPath("fio")
	if err != nil {
		b.Skip("fio is not installed (`make bench` installs it: apt-get install -y fio)")
	}
	k := loadFioKnobs(b)
	dir := b.TempDir()
	kubelet := filepath.Join(dir, "kubelet")
	poolDir := filepath.Join(dir, "pool")
	os.MkdirAll(poolDir, 0o750)
	d := driverproc.Start(b, dir, "--mode=all", "--node-id=bench", "--pool=bench="+poolDir, "--kubelet-dir="+kubelet)
	pub := &fioPublisher{b: b, ctrl: csi.NewControllerClient(d.Conn), node: csi.NewNodeClient(d.Conn), kubelet: kubelet, pool: poolDir}

	// The ext4 volume also holds the page cache test's file.
	targets := []fioTarget{{name: "pool file", file: filepath.Join(poolDir, "fio.bin"), dir: poolDir}}
	for _, fs := range []string{"ext4", "xfs"} {
		size := k.size + k.size/4 + 64*mib
		if fs == "ext4" {
			size += k.cache + k.cache/8
		}
		t := pub.volume(fs, size)
		t.file = filepath.Join(t.file, "fio.bin")
		if fs == "ext4" {
			t.dir = filepath.Dir(t.file)
		}
		targets = append(targets, t)
	}
	targets = append(targets, pub.volume("block", k.size))
	for i := range targets[1:] {
		t := &targets[1+i]
		t.queue = k.queue
		t.apply(b)
		if k.ab == nil {
			continue
		}
		// The B twin restores nothing itself: the A target's queue holds
		// the values as they were before B, so each run sets its own.
		t.queue = map[string]string{}
		for name := range k.ab {
			data, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(t.dev), "queue", name))
			if err != nil {
				b.Fatal(err)
			}
			val := strings.TrimSpace(string(data))
			if name == "scheduler" { // "[none] mq-deadline" → "none"
				val = val[strings.Index(val, "[")+1 : strings.Index(val, "]")]
			}
			t.queue[name] = val
		}
		maps.Copy(t.queue, k.queue)
		twin := *t
		twin.name += " (B)"
		twin.queue = k.ab
		targets = append(targets, twin)
	}
	if k.ab != nil {
		fmt.Printf("\nA/B: every volume also as \"(B)\" with %v\n", k.ab)
	}
	disk := poolDisk(b, poolDir)
	fmt.Printf("\nfio %s: pool %s; %d passes of %s per job, files of %d MiB; libaio, direct=1 unless said\n",
		fioVersion(fio), describeFS(poolDir), k.passes, k.runtime, k.size/mib)
	for _, t := range targets[1:] {
		fmt.Printf("  %s on %s: %s\n", t.name, t.dev, queueSettings(t.dev))
	}
	for _, t := range targets {
		// Reads need written blocks, not the unwritten extents of a new
		// file or of the fallocated image.
		fioRun(b, fio, t, fioJob{name: "layout", args: []string{"--rw=write", "--bs=1M", "--iodepth=8", "--ioengine=libaio", "--direct=1"}}, k.size, 0, disk)
	}

	jobs := selectJobs(fioJobs(), k.jobs)
	res := fioResults{}
	for pass := range k.passes {
		for _, j := range jobs {
			for i := range targets {
				t := targets[(i+pass)%len(targets)]
				t.apply(b)
				res.add(t.name, j, fioRun(b, fio, t, j, k.size, k.runtime, disk))
			}
		}
	}
	res.print(jobs, targets, k.passes)

	if len(k.jobs) == 0 || slices.Contains(k.jobs, "cache") {
		var vols []fioTarget
		for _, t := range targets[1:] {
			if t.dir != "" {
				vols = append(vols, t)
			}
		}
		cacheTest(b, fio, targets[0], vols, k)
	}
}

func selectJobs(all []fioJob, only []string) []fioJob {
	if len(only) == 0 {
		return all
	}
	var out []fioJob
	for _, j := range all {
		for _, o := range only {
			if strings.Contains(j.name, o) {
				out = append(out, j)
				break
			}
		}
	}
	return out
}

// fioPublisher makes volumes through the driver's CSI calls, as kubelet and
// the sidecars would: create, controller publish, stage, publish.
type fioPublisher struct {
	b             *testing.B
	ctrl          csi.ControllerClient
	node          csi.NodeClient
	kubelet, pool string
	devs          []string // of the volumes made so far
}

// volume creates and publishes a volume of fs ("ext4", "xfs" or "block").
// The target's file is the published path: the mount point, or the device
// node for block.
func (p *fioPublisher) volume(fs string, size int64) fioTarget {
	b, ctx := p.b, context.Background()
	cap := &csi.VolumeCapability{AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}
	if fs == "block" {
		cap.AccessType = &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}
	} else {
		cap.AccessType = &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: fs}}
	}
	vol, err := p.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "fio-" + fs, CapacityRange: &csi.CapacityRange{RequiredBytes: size}, VolumeCapabilities: []*csi.VolumeCapability{cap}})
	if err != nil {
		b.Fatal(err)
	}
	id := vol.Volume.VolumeId
	staging := filepath.Join(p.kubelet, "plugins", "st", id)
	target := filepath.Join(p.kubelet, "pods", id, "volume")
	os.MkdirAll(filepath.Dir(target), 0o750)
	if _, err := p.ctrl.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "bench", VolumeCapability: cap}); err != nil {
		b.Fatal(err)
	}
	if _, err := p.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: cap}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if _, err := p.node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
			b.Errorf("unstage %s: %v", fs, err)
		}
	})
	if _, err := p.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: cap}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if _, err := p.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
			b.Errorf("unpublish %s: %v", fs, err)
		}
	})
	// The device of this volume is the one of the pool's that the earlier
	// volumes do not have.
	var dev, image string
	for _, d := range driverproc.LoopDevicesOf(p.pool) {
		if !slices.Contains(p.devs, d) {
			dev = d
			back, _ := os.ReadFile("/sys/block/" + filepath.Base(d) + "/loop/backing_file")
			image = strings.TrimSpace(string(back))
		}
	}
	if dev == "" {
		b.Fatalf("no loop device for volume %s", id)
	}
	p.devs = append(p.devs, dev)
	name := fs + " volume"
	if fs == "block" {
		name = "raw block volume"
	}
	return fioTarget{name: name, file: target, dev: dev, image: image}
}

// queueSettings describes the loop device's settings that the tuning is
// about, read back from sysfs.
func queueSettings(dev string) string {
	name := filepath.Base(dev)
	read := func(p string) string {
		data, err := os.ReadFile(filepath.Join("/sys/block", name, p))
		if err != nil {
			return "?"
		}
		return strings.TrimSpace(string(data))
	}
	return fmt.Sprintf("dio=%s logical_block_size=%s max_sectors_kb=%s nr_requests=%s scheduler=%s read_ahead_kb=%s rotational=%s wbt_lat_usec=%s",
		read("loop/dio"), read("queue/logical_block_size"), read("queue/max_sectors_kb"), read("queue/nr_requests"),
		read("queue/scheduler"), read("queue/read_ahead_kb"), read("queue/rotational"), read("queue/wbt_lat_usec"))
}

// poolDisk returns the sysfs stat file of the block device under dir.
func poolDisk(b *testing.B, dir string) string {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		b.Fatal(err)
	}
	return fmt.Sprintf("/sys/dev/block/%d:%d/stat", unix.Major(st.Dev), unix.Minor(st.Dev))
}

// describeFS names the filesystem and device under dir, as findmnt sees it.
func describeFS(dir string) string {
	out, err := exec.Command("findmnt", "-n", "-o", "FSTYPE,SOURCE,OPTIONS", "--target", dir).Output()
	if err != nil {
		return "on an unknown filesystem (" + err.Error() + ")"
	}
	f := strings.Fields(string(out))
	if len(f) < 3 {
		return "on " + strings.TrimSpace(string(out))
	}
	return fmt.Sprintf("%s on %s (%s)", f[0], f[1], f[2])
}

func fioVersion(fio string) string {
	out, err := exec.Command(fio, "--version").Output()
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(string(out))
}
