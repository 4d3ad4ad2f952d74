package node

import (
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"k8s.io/klog/v2/ktesting"
	mount "k8s.io/mount-utils"
	utilexec "k8s.io/utils/exec"

	"github.com/loopvol/loopvol/pkg/loop"
	"github.com/loopvol/loopvol/pkg/loop/looptest"
	"github.com/loopvol/loopvol/pkg/pool"
	"github.com/loopvol/loopvol/pkg/volspec/volspectest"
)

// realFixture is a node server on real loop devices, mkfs and mounts. The
// pool and the kubelet directory live in a temporary directory; the cleanup
// unmounts everything under the kubelet directory and then detaches every
// loop device of the pool, also when the test fails half-way.
type realFixture struct {
	fixture
}

func newRealFixture(t *testing.T) *realFixture {
	t.Helper()
	looptest.RequireRoot(t)
	_, ctx := ktesting.NewTestContext(t)
	dir := looptest.DirectIODir(t) // detaches the devices of images under dir, last
	f := &realFixture{fixture{t: t, ctx: ctx, kubelet: filepath.Join(dir, "kubelet")}}
	if err := os.MkdirAll(f.kubelet, 0o750); err != nil {
		t.Fatal(err)
	}
	unmountUnder(t, f.kubelet) // runs before the detach
	p, err := pool.Open(pool.Options{Name: "real", Zone: testZone, Path: filepath.Join(dir, "pool")})
	if err != nil {
		t.Fatal(err)
	}
	f.pool = p
	f.cfg = Config{
		NodeID:     testNode,
		Zone:       testZone,
		MaxVolumes: 16,
		KubeletDir: f.kubelet,
		Pools:      map[string]*pool.Pool{p.Name: p},
		Loop:       loop.New(loop.Owner(testNode)),
		Mounter:    mount.NewSafeFormatAndMount(mount.New(""), utilexec.New()),
	}
	f.srv, err = New(f.cfg)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// unmountUnder registers a cleanup that unmounts every mount under dir,
// deepest and latest first.
func unmountUnder(t *testing.T, dir string) {
	t.Cleanup(func() {
		for range 10 { // stacked mounts need more than one round
			mis, err := mount.ParseMountInfo("/proc/self/mountinfo")
			if err != nil {
				t.Errorf("cleanup: %v", err)
				return
			}
			var paths []string
			for i := len(mis) - 1; i >= 0; i-- {
				if strings.HasPrefix(mis[i].MountPoint, dir+"/") {
					paths = append(paths, mis[i].MountPoint)
				}
			}
			if len(paths) == 0 {
				return
			}
			sort.SliceStable(paths, func(i, j int) bool { return len(paths[i]) > len(paths[j]) })
			for _, p := range paths {
				if err := unix.Unmount(p, 0); err != nil && !errors.Is(err, unix.EINVAL) {
					t.Logf("cleanup: unmount %s: %v; detaching lazily", p, err)
					unix.Unmount(p, unix.MNT_DETACH)
				}
			}
		}
		t.Errorf("cleanup: mounts under %s remain", dir)
	})
}

func requireTool(t *testing.T, name string) {
	t.Helper()
	if _, err := exec.LookPath(name); err != nil {
		t.Skipf("%s is not installed", name)
	}
}

// volumeOfSize creates a volume of size bytes, attached to this node.
func (f *realFixture) volumeOfSize(name, accessType, fsType string, size int64, att pool.Attachment) pool.VolumeID {
	f.t.Helper()
	return f.volumeOfSpec(pool.VolumeSpec{Name: name, SizeBytes: size, AccessType: accessType, FsType: fsType}, att)
}

// volumeOfSpec creates the volume spec describes, attached as att.
func (f *realFixture) volumeOfSpec(spec pool.VolumeSpec, att pool.Attachment) pool.VolumeID {
	f.t.Helper()
	id := pool.DeriveVolumeID(f.pool.Name, spec.Name)
	unlock, err := f.pool.Lock(id)
	if err != nil {
		f.t.Fatal(err)
	}
	defer unlock()
	v, err := f.pool.CreateVolume(f.ctx, spec)
	if err != nil {
		f.t.Fatal(err)
	}
	v.Attachments = []pool.Attachment{att}
	if err := f.pool.WriteVolume(v); err != nil {
		f.t.Fatal(err)
	}
	return id
}

// withVolume reads the volume's record under its lock and hands it to
// change, as the controller's RPCs do; a failure ends the test.
func (f *realFixture) withVolume(id pool.VolumeID, change func(v *pool.Volume) error) {
	f.t.Helper()
	unlock, err := f.pool.Lock(id)
	if err != nil {
		f.t.Fatal(err)
	}
	defer unlock()
	v, err := f.pool.ReadVolume(id)
	if err != nil {
		f.t.Fatal(err)
	}
	if err := change(v); err != nil {
		f.t.Fatal(err)
	}
}

// grow does the controller's part of an expansion.
func (f *realFixture) grow(id pool.VolumeID, size int64) {
	f.t.Helper()
	f.withVolume(id, func(v *pool.Volume) error { return f.pool.ExpandVolume(f.ctx, v, size) })
}

func (f *realFixture) stage(req *csi.NodeStageVolumeRequest) time.Duration {
	f.t.Helper()
	start := time.Now()
	if _, err := f.srv.NodeStageVolume(f.ctx, req); err != nil {
		f.t.Fatalf("NodeStageVolume: %v", err)
	}
	return time.Since(start)
}

func (f *realFixture) publish(req *csi.NodePublishVolumeRequest) time.Duration {
	f.t.Helper()
	start := time.Now()
	if _, err := f.srv.NodePublishVolume(f.ctx, req); err != nil {
		f.t.Fatalf("NodePublishVolume: %v", err)
	}
	return time.Since(start)
}

func (f *realFixture) unpublish(id pool.VolumeID, target string) {
	f.t.Helper()
	if _, err := f.srv.NodeUnpublishVolume(f.ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id.String(), TargetPath: target}); err != nil {
		f.t.Fatalf("NodeUnpublishVolume: %v", err)
	}
}

func (f *realFixture) unstage(id pool.VolumeID, staging string) {
	f.t.Helper()
	if _, err := f.srv.NodeUnstageVolume(f.ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id.String(), StagingTargetPath: staging}); err != nil {
		f.t.Fatalf("NodeUnstageVolume: %v", err)
	}
}

// checkGone checks that nothing of the volume is left on the system.
func (f *realFixture) checkGone(id pool.VolumeID) {
	f.t.Helper()
	if dev, ok, err := f.cfg.Loop.Find(f.pool.ImagePath(id)); err != nil || ok {
		f.t.Errorf("loop device %s (%v) still attached", dev, err)
	}
	mis, err := mount.ParseMountInfo("/proc/self/mountinfo")
	if err != nil {
		f.t.Fatal(err)
	}
	for _, mi := range mis {
		if strings.HasPrefix(mi.MountPoint, f.kubelet+"/") {
			f.t.Errorf("%s is still mounted", mi.MountPoint)
		}
	}
}

func writeRandomFile(t *testing.T, path string, size int) [32]byte {
	t.Helper()
	data := make([]byte, size)
	rand.Read(data)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatalf("write %s: %v", path, err)
	}
	fd, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer fd.Close()
	if err := fd.Sync(); err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(data)
}

func checksum(t *testing.T, path string) [32]byte {
	t.Helper()
	fd, err := os.Open(path)
	if err != nil {
		t.Fatalf("open %s: %v", path, err)
	}
	defer fd.Close()
	h := sha256.New()
	if _, err := io.Copy(h, fd); err != nil {
		t.Fatal(err)
	}
	var sum [32]byte
	copy(sum[:], h.Sum(nil))
	return sum
}

func statfsTotal(t *testing.T, path string) int64 {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Blocks) * st.Bsize
}

const gib = int64(1) << 30

// TestRealMountVolume: stage and publish a 1 GiB volume, write data,
// unpublish and unstage, stage and publish again and find the same data;
// stats and health; expand online; clean up without leftovers.
func TestRealMountVolume(t *testing.T) {
	for _, fsType := range []string{"ext4", "xfs"} {
		t.Run(fsType, func(t *testing.T) {
			requireTool(t, "mkfs."+fsType)
			f := newRealFixture(t)
			id := f.volumeOfSize("data-"+fsType, pool.AccessMount, fsType, gib, pool.Attachment{Node: testNode})
			c := volspectest.Mount(fsType, snw)
			stage, publish := f.stageReq(id, c), f.publishReq(id, c, "pod1")

			stageTime := f.stage(stage)
			publishTime := f.publish(publish)
			t.Logf("1 GiB %s: NodeStageVolume (with mkfs) %v, NodePublishVolume %v", fsType, stageTime, publishTime)

			dev, ok, err := f.cfg.Loop.Find(f.pool.ImagePath(id))
			if err != nil || !ok {
				t.Fatalf("no loop device after staging: %v", err)
			}
			if st, err := f.cfg.Loop.Status(dev); err != nil || !st.DirectIO {
				t.Errorf("loop device status %+v, %v; want direct I/O", st, err)
			}
			file := filepath.Join(publish.TargetPath, "data.bin")
			want := writeRandomFile(t, file, 4<<20)

			f.unpublish(id, publish.TargetPath)
			f.unstage(id, stage.StagingTargetPath)
			f.checkGone(id)

			f.stage(stage)
			f.publish(publish)
			if got := checksum(t, file); got != want {
				t.Errorf("checksum after unstage and stage again differs")
			}

			stats, err := f.srv.NodeGetVolumeStats(f.ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: id.String(), VolumePath: publish.TargetPath})
			if err != nil {
				t.Fatalf("NodeGetVolumeStats: %v", err)
			}
			var bytes, inodes *csi.VolumeUsage
			for _, u := range stats.GetUsage() {
				switch u.GetUnit() {
				case csi.VolumeUsage_BYTES:
					bytes = u
				case csi.VolumeUsage_INODES:
					inodes = u
				}
			}
			if bytes == nil || bytes.GetTotal() < gib*8/10 || bytes.GetTotal() > gib || bytes.GetUsed() < 4<<20 {
				t.Errorf("bytes usage = %v, want a total near 1 GiB and the 4 MiB written used", bytes)
			}
			if inodes == nil || inodes.GetTotal() == 0 || inodes.GetUsed() == 0 {
				t.Errorf("inode usage = %v", inodes)
			}
			health, err := f.srv.NodeGetVolumeHealth(f.ctx, &csi.NodeGetVolumeHealthRequest{VolumeId: id.String(), VolumePublishPath: publish.TargetPath, StagingTargetPath: stage.StagingTargetPath})
			if err != nil || len(health.GetVolumeHealth().GetHealthStatuses()) != 0 {
				t.Errorf("NodeGetVolumeHealth = %v, %v; want healthy", health, err)
			}

			if fsType == "ext4" && !hasCapability(t, unix.CAP_SYS_RESOURCE) {
				// The kernel refuses EXT4_IOC_RESIZE_FS without it; a node
				// plugin runs privileged, some sandboxes do not.
				t.Log("skipping online ext4 expansion: this process lacks CAP_SYS_RESOURCE")
			} else {
				f.expandOnline(id, stage.StagingTargetPath, publish.TargetPath, file, want)
			}

			f.unpublish(id, publish.TargetPath)
			f.unstage(id, stage.StagingTargetPath)
			f.checkGone(id)
		})
	}
}

// expandOnline grows a published 1 GiB volume to 2 GiB and checks that the
// filesystem grew and the file kept its data.
func (f *realFixture) expandOnline(id pool.VolumeID, staging, target, file string, want [32]byte) {
	t := f.t
	t.Helper()
	before := statfsTotal(t, target)
	f.grow(id, 2*gib)
	resp, err := f.srv.NodeExpandVolume(f.ctx, &csi.NodeExpandVolumeRequest{
		VolumeId: id.String(), VolumePath: target, StagingTargetPath: staging,
		CapacityRange: &csi.CapacityRange{RequiredBytes: 2 * gib},
	})
	if err != nil {
		t.Fatalf("NodeExpandVolume: %v", err)
	}
	if resp.GetCapacityBytes() != 2*gib {
		t.Errorf("expanded capacity = %d, want %d", resp.GetCapacityBytes(), 2*gib)
	}
	if after := statfsTotal(t, target); after < before+gib*9/10 {
		t.Errorf("filesystem grew from %d to %d bytes, want about 1 GiB more", before, after)
	}
	if got := checksum(t, file); got != want {
		t.Errorf("checksum after expansion differs")
	}
}

// hasCapability reports whether this process has capability c in effect.
func hasCapability(t *testing.T, c int) bool {
	t.Helper()
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			caps, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil {
				t.Fatal(err)
			}
			return caps&(1<<c) != 0
		}
	}
	return false
}

// TestRealBlockVolume: a raw block volume is a device node at the target;
// data written there survives unstage and stage; expansion grows the device.
func TestRealBlockVolume(t *testing.T) {
	f := newRealFixture(t)
	id := f.volumeOfSize("raw", pool.AccessBlock, "", 64*mib, pool.Attachment{Node: testNode})
	c := volspectest.Block(snw)
	stage, publish := f.stageReq(id, c), f.publishReq(id, c, "pod1/dev")
	f.stage(stage)
	f.publish(publish)
	fi, err := os.Stat(publish.TargetPath)
	if err != nil || fi.Mode()&os.ModeDevice == 0 {
		t.Fatalf("target = %v, %v; want a block device node", fi, err)
	}
	pattern := []byte(strings.Repeat("loopvol!", loop.BlockSize/8))
	writeAt(t, publish.TargetPath, pattern, 32*mib)
	// The bind mount of the device node counts as a user of the device.
	_, err = f.srv.NodeUnstageVolume(f.ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id.String(), StagingTargetPath: stage.StagingTargetPath})
	wantCode(t, err, codes.FailedPrecondition)

	f.unpublish(id, publish.TargetPath)
	f.unstage(id, stage.StagingTargetPath)
	f.checkGone(id)
	f.stage(stage)
	f.publish(publish)
	if got := readAt(t, publish.TargetPath, len(pattern), 32*mib); string(got) != string(pattern) {
		t.Errorf("block data differs after unstage and stage again")
	}

	stats, err := f.srv.NodeGetVolumeStats(f.ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: id.String(), VolumePath: publish.TargetPath})
	if err != nil || len(stats.GetUsage()) != 1 || stats.GetUsage()[0].GetTotal() != 64*mib {
		t.Errorf("NodeGetVolumeStats = %v, %v; want 64 MiB", stats, err)
	}
	f.grow(id, 128*mib)
	resp, err := f.srv.NodeExpandVolume(f.ctx, &csi.NodeExpandVolumeRequest{VolumeId: id.String(), VolumePath: publish.TargetPath})
	if err != nil || resp.GetCapacityBytes() != 128*mib {
		t.Errorf("NodeExpandVolume = %v, %v; want 128 MiB", resp, err)
	}
	if got := deviceSize(t, publish.TargetPath); got != 128*mib {
		t.Errorf("device size seen through the target = %d, want %d", got, 128*mib)
	}
	f.unpublish(id, publish.TargetPath)
	f.unstage(id, stage.StagingTargetPath)
	f.checkGone(id)
}

// TestRealReadOnlyPublish: a read-only publish refuses writes while a
// read-write publish of the same staged volume accepts them.
func TestRealReadOnlyPublish(t *testing.T) {
	f := newRealFixture(t)
	id := f.volumeOfSize("ro", pool.AccessMount, "ext4", 64*mib, pool.Attachment{Node: testNode})
	c := volspectest.Mount("ext4", csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER)
	stage := f.stageReq(id, c)
	rw, ro := f.publishReq(id, c, "writer"), f.publishReq(id, c, "reader")
	ro.Readonly = true
	f.stage(stage)
	f.publish(rw)
	f.publish(ro)
	f.publish(ro) // idempotent, also read-only
	writeRandomFile(t, filepath.Join(rw.TargetPath, "a"), 4096)
	if _, err := os.ReadFile(filepath.Join(ro.TargetPath, "a")); err != nil {
		t.Errorf("read through the read-only target: %v", err)
	}
	if err := os.WriteFile(filepath.Join(ro.TargetPath, "b"), []byte("x"), 0o600); !errors.Is(err, unix.EROFS) {
		t.Errorf("write through the read-only target = %v, want EROFS", err)
	}
	f.unpublish(id, ro.TargetPath)
	f.unpublish(id, rw.TargetPath)
	f.unstage(id, stage.StagingTargetPath)
	f.checkGone(id)
}

// TestRealForeignMount: a target that already holds another filesystem is
// neither mounted over nor unmounted.
func TestRealForeignMount(t *testing.T) {
	f := newRealFixture(t)
	id := f.volumeOfSize("foreign", pool.AccessMount, "ext4", 64*mib, pool.Attachment{Node: testNode})
	c := volspectest.Mount("ext4", snw)
	stage, publish := f.stageReq(id, c), f.publishReq(id, c, "pod1")
	f.stage(stage)
	if err := os.MkdirAll(publish.TargetPath, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", publish.TargetPath, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	_, err := f.srv.NodePublishVolume(f.ctx, publish)
	wantCode(t, err, codes.AlreadyExists)
	_, err = f.srv.NodeUnpublishVolume(f.ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id.String(), TargetPath: publish.TargetPath})
	wantCode(t, err, codes.FailedPrecondition)
	if err := unix.Unmount(publish.TargetPath, 0); err != nil {
		t.Errorf("the foreign tmpfs was not left mounted: %v", err)
	}
	f.unpublish(id, publish.TargetPath)
	f.unstage(id, stage.StagingTargetPath)
	f.checkGone(id)
}

// TestRealRestart: a new server on the same system and pool finds the
// staged and published volume and tears it down cleanly.
func TestRealRestart(t *testing.T) {
	f := newRealFixture(t)
	id := f.volumeOfSize("restart", pool.AccessMount, "ext4", 64*mib, pool.Attachment{Node: testNode})
	c := volspectest.Mount("ext4", snw)
	stage, publish := f.stageReq(id, c), f.publishReq(id, c, "pod1")
	f.stage(stage)
	f.publish(publish)
	want := writeRandomFile(t, filepath.Join(publish.TargetPath, "f"), 1<<20)

	srv, err := New(f.cfg)
	if err != nil {
		t.Fatal(err)
	}
	f.srv = srv
	f.stage(stage)
	f.publish(publish)
	if _, err := srv.NodeGetVolumeStats(f.ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: id.String(), VolumePath: publish.TargetPath}); err != nil {
		t.Errorf("stats after restart: %v", err)
	}
	if got := checksum(t, filepath.Join(publish.TargetPath, "f")); got != want {
		t.Errorf("data differs after restart")
	}
	f.unpublish(id, publish.TargetPath)
	f.unstage(id, stage.StagingTargetPath)
	f.checkGone(id)
}

func writeAt(t *testing.T, path string, data []byte, off int64) {
	t.Helper()
	fd, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer fd.Close()
	if _, err := fd.WriteAt(data, off); err != nil {
		t.Fatal(err)
	}
	if err := fd.Sync(); err != nil {
		t.Fatal(err)
	}
}

func readAt(t *testing.T, path string, n int, off int64) []byte {
	t.Helper()
	fd, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer fd.Close()
	buf := make([]byte, n)
	if _, err := fd.ReadAt(buf, off); err != nil {
		t.Fatal(err)
	}
	return buf
}

func deviceSize(t *testing.T, path string) int64 {
	t.Helper()
	fd, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer fd.Close()
	size, err := fd.Seek(0, io.SeekEnd)
	if err != nil {
		t.Fatal(err)
	}
	return size
}

// TestRealImageReplacedBySymlink: on a shared pool anyone who can write the
// pool directory can put a symlink where an image was. NodeStage must not
// follow it: nothing is attached to the file it points at, and that file is
// not formatted; a hard link to a file elsewhere is refused the same way.
func TestRealImageReplacedBySymlink(t *testing.T) {
	for _, how := range []string{"symlink", "hardlink"} {
		t.Run(how, func(t *testing.T) {
			f := newRealFixture(t)
			id := f.volumeOfSize("swapped", pool.AccessMount, "ext4", 64*mib, pool.Attachment{Node: testNode})
			image := f.pool.ImagePath(id)
			// A "host file" next to the pool (the test's own directory).
			victim := filepath.Join(filepath.Dir(f.kubelet), "victim.img")
			content := make([]byte, 64*mib)
			copy(content, "precious host data")
			if err := os.WriteFile(victim, content, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Remove(image); err != nil {
				t.Fatal(err)
			}
			var err error
			if how == "symlink" {
				err = os.Symlink(victim, image)
			} else {
				err = os.Link(victim, image)
			}
			if err != nil {
				t.Fatal(err)
			}
			_, err = f.srv.NodeStageVolume(f.ctx, f.stageReq(id, volspectest.Mount("ext4", snw)))
			if err == nil {
				t.Fatal("NodeStageVolume staged an image that is a " + how + " to a file outside the pool")
			}
			if devs := looptest.DevicesUnder(t, filepath.Dir(f.kubelet)); len(devs) > 0 {
				t.Errorf("loop devices %v were attached for an image that is a %s", devs, how)
			}
			got, rerr := os.ReadFile(victim)
			if rerr != nil || string(got[:18]) != "precious host data" {
				t.Errorf("the file the %s points at was changed (%v)", how, rerr)
			}
			t.Logf("NodeStageVolume of a %s image: %v", how, err)
		})
	}
}
