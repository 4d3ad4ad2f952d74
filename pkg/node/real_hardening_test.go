package node

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	mount "k8s.io/mount-utils"

	"github.com/loopvol/loopvol/pkg/pool"
	"github.com/loopvol/loopvol/pkg/volspec/volspectest"
)

// raceIterations is how many publish/unpublish rounds TestRealSymlinkRace
// runs while path components are swapped for symbolic links.
const raceIterations = 300

// TestRealSymlinkRace swaps the first component of the staging and the
// target path for a symbolic link to a copy of the tree outside the kubelet
// directory, over and over (renameat2 RENAME_EXCHANGE, atomic), while
// NodeStageVolume, NodePublishVolume, NodeUnpublishVolume and
// NodeUnstageVolume run. Outside, a decoy tmpfs sits where the target would
// land and a decoy file where the staging mount would: afterwards nothing is
// mounted outside but the decoy, nothing was created or removed there, and
// the volume is torn down cleanly.
func TestRealSymlinkRace(t *testing.T) {
	for _, walk := range []string{"openat2", "O_NOFOLLOW walk"} {
		t.Run(walk, func(t *testing.T) {
			// The walk is what kernels without openat2 (before 5.6) get.
			noOpenat2.Store(walk != "openat2")
			t.Cleanup(func() { noOpenat2.Store(false) })
			testRealSymlinkRace(t)
		})
	}
}

func testRealSymlinkRace(t *testing.T) {
	f := newRealFixture(t)
	outside := filepath.Join(filepath.Dir(f.kubelet), "outside")
	unmountUnder(t, outside)
	id := f.volumeOfSize("race", pool.AccessMount, "ext4", 64*mib, pool.Attachment{Node: testNode})
	c := volspectest.Mount("ext4", csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER)
	stage := &csi.NodeStageVolumeRequest{VolumeId: id.String(), StagingTargetPath: f.path("plugins", "vol", "globalmount"), VolumeCapability: c}
	publish := &csi.NodePublishVolumeRequest{VolumeId: id.String(), StagingTargetPath: stage.StagingTargetPath,
		TargetPath: f.path("pods", "pod", "mount"), VolumeCapability: c}

	for _, d := range []string{f.path("plugins", "vol"), f.path("pods", "pod"), filepath.Join(outside, "plugins", "vol", "globalmount"), filepath.Join(outside, "pods", "pod", "mount")} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	decoy := filepath.Join(outside, "pods", "pod", "mount")
	if err := unix.Mount("tmpfs", decoy, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	for _, marker := range []string{filepath.Join(decoy, "marker"), filepath.Join(outside, "plugins", "vol", "globalmount", "marker")} {
		if err := os.WriteFile(marker, []byte("decoy"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	before := tree(t, outside)
	for _, top := range []string{"plugins", "pods"} {
		if err := os.Symlink(filepath.Join(outside, top), f.path(top+".link")); err != nil {
			t.Fatal(err)
		}
	}

	// The swapper: each exchange turns the real directory into the link or
	// back; an even number leaves the real one in place.
	stop := make(chan struct{})
	var swaps atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() {
		kd, err := unix.Open(f.kubelet, unix.O_PATH|unix.O_DIRECTORY, 0)
		if err != nil {
			t.Error(err)
			return
		}
		defer unix.Close(kd)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			top := []string{"plugins", "pods"}[i%2]
			for range 2 {
				if err := unix.Renameat2(kd, top, kd, top+".link", unix.RENAME_EXCHANGE); err != nil {
					t.Errorf("exchange %s: %v", top, err)
					return
				}
			}
			swaps.Add(1)
		}
	})
	// The swapper exchanges one directory twice per round: between the two
	// exchanges the path leads outside. Each call also runs with the link
	// in place for certain, below, so both outcomes are exercised.
	var ok [4]int
	call := func(i int, rpc func() error) {
		if rpc() == nil {
			ok[i]++
		}
	}
	for i := range raceIterations {
		call(0, func() error { _, err := f.srv.NodeStageVolume(f.ctx, stage); return err })
		call(1, func() error { _, err := f.srv.NodePublishVolume(f.ctx, publish); return err })
		call(2, func() error {
			_, err := f.srv.NodeUnpublishVolume(f.ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id.String(), TargetPath: publish.TargetPath})
			return err
		})
		if i%25 == 24 {
			call(3, func() error {
				_, err := f.srv.NodeUnstageVolume(f.ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id.String(), StagingTargetPath: stage.StagingTargetPath})
				return err
			})
		}
	}
	close(stop)
	wg.Wait()
	t.Logf("%d rounds of swaps; calls that succeeded: stage %d, publish %d, unpublish %d, unstage %d of %d, %d, %d, %d",
		swaps.Load(), ok[0], ok[1], ok[2], ok[3], raceIterations, raceIterations, raceIterations, raceIterations/25)

	// With the links in place for certain: refused, or nothing done.
	for _, top := range []string{"plugins", "pods"} {
		if err := unix.Renameat2(unix.AT_FDCWD, f.path(top), unix.AT_FDCWD, f.path(top+".link"), unix.RENAME_EXCHANGE); err != nil {
			t.Fatal(err)
		}
	}
	_, err := f.srv.NodeStageVolume(f.ctx, stage)
	wantCode(t, err, codes.InvalidArgument)
	_, err = f.srv.NodePublishVolume(f.ctx, publish)
	wantCode(t, err, codes.InvalidArgument)
	f.unpublish(id, publish.TargetPath)
	_, err = f.srv.NodeUnstageVolume(f.ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id.String(), StagingTargetPath: stage.StagingTargetPath})
	if code := status.Code(err); code != codes.OK && code != codes.FailedPrecondition {
		t.Errorf("NodeUnstageVolume through a link = %v, want OK or FAILED_PRECONDITION (still in use)", err)
	}
	for _, top := range []string{"plugins", "pods"} {
		if err := unix.Renameat2(unix.AT_FDCWD, f.path(top), unix.AT_FDCWD, f.path(top+".link"), unix.RENAME_EXCHANGE); err != nil {
			t.Fatal(err)
		}
	}

	mis, err := mount.ParseMountInfo("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, mi := range mis {
		if strings.HasPrefix(mi.MountPoint, outside+"/") && (mi.MountPoint != decoy || mi.FsType != "tmpfs") {
			t.Errorf("%s (%s from %s) was mounted outside the kubelet directory", mi.MountPoint, mi.FsType, mi.Source)
		}
	}
	if !slices.ContainsFunc(mis, func(mi mount.MountInfo) bool { return mi.MountPoint == decoy }) {
		t.Errorf("the decoy tmpfs outside the kubelet directory was unmounted")
	}
	if after := tree(t, outside); !slices.Equal(after, before) {
		t.Errorf("outside the kubelet directory, before:\n%s\nafter:\n%s", strings.Join(before, "\n"), strings.Join(after, "\n"))
	}
	// A clean teardown from whatever state the race left.
	f.unpublish(id, publish.TargetPath)
	f.unstage(id, stage.StagingTargetPath)
	f.checkGone(id)
}

// tree lists every path under dir with its type, sorted.
func tree(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		out = append(out, p+" "+d.Type().String())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(out)
	return out
}

// TestRealUnpublishForeignTargets: on real mounts, NodeUnpublishVolume of a
// symbolic link to another volume's mount, of a path through a linked
// parent and of a plain file answers OK and leaves all of them, and the
// other volume's mount, as they were.
func TestRealUnpublishForeignTargets(t *testing.T) {
	f := newRealFixture(t)
	a := f.volumeOfSize("a", pool.AccessMount, "ext4", 64*mib, pool.Attachment{Node: testNode})
	b := f.volumeOfSize("b", pool.AccessMount, "ext4", 64*mib, pool.Attachment{Node: testNode})
	c := volspectest.Mount("ext4", snw)
	stageA, pubA := f.stageReq(a, c), f.publishReq(a, c, "a")
	f.stage(stageA)
	f.publish(pubA)
	f.stage(f.stageReq(b, c))
	want := writeRandomFile(t, filepath.Join(pubA.TargetPath, "data"), 1<<20)

	link := f.path("pods", "link")
	if err := os.Symlink(pubA.TargetPath, link); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(f.path("pods"), f.path("linked")); err != nil {
		t.Fatal(err)
	}
	file := f.path("pods", "file")
	if err := os.WriteFile(file, []byte("precious"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, target := range []string{link, f.path("linked", "a"), file} {
		for _, id := range []pool.VolumeID{a, b} {
			f.unpublish(id, target)
		}
	}
	mis, err := mount.ParseMountInfo("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(mis, func(mi mount.MountInfo) bool { return mi.MountPoint == pubA.TargetPath }) {
		t.Fatalf("volume a's mount at %s is gone", pubA.TargetPath)
	}
	if got := checksum(t, filepath.Join(pubA.TargetPath, "data")); got != want {
		t.Error("volume a's data changed")
	}
	if data, err := os.ReadFile(file); err != nil || string(data) != "precious" {
		t.Errorf("plain file: %q, %v", data, err)
	}
	for _, l := range []string{link, f.path("linked")} {
		if fi, err := os.Lstat(l); err != nil || fi.Mode()&os.ModeSymlink == 0 {
			t.Errorf("symlink %s changed: %v, %v", l, fi, err)
		}
	}
	_, err = f.srv.NodeUnpublishVolume(f.ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: pool.DeriveVolumeID(f.pool.Name, "never").String(), TargetPath: pubA.TargetPath})
	wantCode(t, err, codes.NotFound)

	f.unpublish(a, pubA.TargetPath)
	f.unstage(a, stageA.StagingTargetPath)
	f.unstage(b, f.stageReq(b, c).StagingTargetPath)
	f.checkGone(a)
	f.checkGone(b)
}

// TestRealMountFlags: refused flags (loop, X-mount.subdir, rw on
// a read-only publish) attach and mount nothing; accepted ones show in the
// mount table, a read-only publish with them is read-only, and the staging
// mount is the volume's device.
func TestRealMountFlags(t *testing.T) {
	for _, api := range []string{"new mount API", "mount(2)"} {
		t.Run(api, func(t *testing.T) {
			// mount(2) is what kernels before 5.12 get for binds.
			noMountAPI.Store(api == "mount(2)")
			t.Cleanup(func() { noMountAPI.Store(false) })
			testRealMountFlags(t)
		})
	}
}

func testRealMountFlags(t *testing.T) {
	f := newRealFixture(t)
	id := f.volumeOfSize("flags", pool.AccessMount, "ext4", 64*mib, pool.Attachment{Node: testNode})
	for _, flag := range []string{"loop", "X-mount.subdir=lost+found", "offset=4096", "errors=panic"} {
		_, err := f.srv.NodeStageVolume(f.ctx, f.stageReq(id, volspectest.Mount("ext4", snw, flag)))
		wantCode(t, err, codes.InvalidArgument)
	}
	if dev, ok, _ := f.cfg.Loop.Find(f.pool.ImagePath(id)); ok {
		t.Fatalf("refused flags attached %s", dev)
	}
	f.checkGone(id)

	c := volspectest.Mount("ext4", csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER, "noatime", "nodev", "nosuid", "commit=30", "errors=remount-ro")
	stage := f.stageReq(id, c)
	f.stage(stage)
	ro := f.publishReq(id, volspectest.Mount("ext4", csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER, "noatime", "nodev", "nosuid", "noexec", "rw"), "reader")
	ro.Readonly = true
	_, err := f.srv.NodePublishVolume(f.ctx, ro)
	wantCode(t, err, codes.InvalidArgument)
	if _, err := os.Stat(ro.TargetPath); !os.IsNotExist(err) {
		t.Errorf("a refused publish left %s: %v", ro.TargetPath, err)
	}
	ro.VolumeCapability = volspectest.Mount("ext4", csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER, "noatime", "noexec", "ro")
	f.publish(ro)
	rw := f.publishReq(id, c, "writer")
	f.publish(rw)

	dev, _, err := f.cfg.Loop.Find(f.pool.ImagePath(id))
	if err != nil {
		t.Fatal(err)
	}
	want, err := rdev(dev)
	if err != nil {
		t.Fatal(err)
	}
	mis, err := mount.ParseMountInfo("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	opts := map[string][]string{}
	for _, mi := range mis {
		if unix.Mkdev(uint32(mi.Major), uint32(mi.Minor)) == want {
			opts[mi.MountPoint] = append(mi.MountOptions, mi.SuperOptions...)
		}
	}
	for path, wantOpts := range map[string][]string{
		stage.StagingTargetPath: {"rw", "noatime", "nodev", "nosuid", "commit=30", "errors=remount-ro"},
		ro.TargetPath:           {"ro", "noatime", "nodev", "nosuid", "noexec"},
		rw.TargetPath:           {"rw", "noatime", "nodev", "nosuid"},
	} {
		got, ok := opts[path]
		if !ok {
			t.Errorf("%s is not a mount of %s; mounts of it: %v", path, dev, opts)
			continue
		}
		for _, o := range wantOpts {
			if !slices.Contains(got, o) {
				t.Errorf("%s has options %v, want %s among them", path, got, o)
			}
		}
	}
	if err := os.WriteFile(filepath.Join(ro.TargetPath, "x"), nil, 0o600); !errors.Is(err, unix.EROFS) {
		t.Errorf("write through the read-only target = %v, want EROFS", err)
	}
	writeRandomFile(t, filepath.Join(rw.TargetPath, "x"), 4096)
	f.unpublish(id, ro.TargetPath)
	f.unpublish(id, rw.TargetPath)
	f.unstage(id, stage.StagingTargetPath)
	f.checkGone(id)
}
