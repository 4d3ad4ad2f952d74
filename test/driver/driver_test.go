// Package driver tests the real driver binary with real loop devices and
// mounts: fencing between two node plugins on one pool, data surviving
// unstage/restage and a move between nodes, online expansion, bad input and
// restarts. Needs root.
package driver

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/loopvol/loopvol/test/internal/driverproc"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestMain(m *testing.M) {
	code := m.Run()
	driverproc.Cleanup()
	os.Exit(code)
}

const (
	mib = int64(1) << 20
	gib = int64(1) << 30
)

// cluster is one shared pool served by a controller+node plugin (node-a)
// and a second node plugin (node-b), as two nodes on one NFS export would be.
type cluster struct {
	dir      string
	pool     string
	a, b     *driverproc.Driver
	kubeletA string
	kubeletB string
	ctrl     csi.ControllerClient
	nodeA    csi.NodeClient
	nodeB    csi.NodeClient
}

func newCluster(t *testing.T, extra ...string) *cluster {
	t.Helper()
	return newClusterOn(t, nil, extra...)
}

// newClusterOn is newCluster with a pool directory that mountPool, if not
// nil, first mounts a filesystem on (its cleanup runs after the drivers
// stopped).
func newClusterOn(t *testing.T, mountPool func(dir, pool string), extra ...string) *cluster {
	t.Helper()
	driverproc.RequireRoot(t)
	c := &cluster{dir: t.TempDir()}
	c.pool = filepath.Join(c.dir, "pool")
	c.kubeletA = filepath.Join(c.dir, "kubelet-a")
	c.kubeletB = filepath.Join(c.dir, "kubelet-b")
	for _, d := range []string{c.pool, c.kubeletA, c.kubeletB, filepath.Join(c.dir, "a"), filepath.Join(c.dir, "b")} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	if mountPool != nil {
		mountPool(c.dir, c.pool)
	}
	// Registered after the pool's mount so it runs before its unmount:
	// whatever a failing test left mounted or attached under its directory
	// goes.
	t.Cleanup(func() { forceCleanup(t, c.dir) })
	c.a = driverproc.Start(t, filepath.Join(c.dir, "a"), append([]string{"--mode=all", "--node-id=node-a", "--zone=shared",
		"--pool=shared=" + c.pool, "--kubelet-dir=" + c.kubeletA}, extra...)...)
	c.b = driverproc.Start(t, filepath.Join(c.dir, "b"), "--mode=node", "--node-id=node-b", "--zone=shared",
		"--pool=shared="+c.pool, "--kubelet-dir="+c.kubeletB)
	c.ctrl = csi.NewControllerClient(c.a.Conn)
	c.nodeA = csi.NewNodeClient(c.a.Conn)
	c.nodeB = csi.NewNodeClient(c.b.Conn)
	return c
}

func forceCleanup(t *testing.T, dir string) {
	// The loop devices first: a volume's image in a pool that is itself a
	// loop-mounted filesystem under dir is named by its path in that pool,
	// which the pool's unmount takes away (the device would then name
	// "/volumes/<id>.img" and be missed).
	devs := driverproc.LoopDevicesOf(dir)
	mounts := driverproc.Mounts(dir)
	for i := len(mounts) - 1; i >= 0; i-- {
		if f := strings.Fields(mounts[i]); len(f) > 4 {
			exec.Command("umount", "-l", f[4]).Run()
		}
	}
	// A device still in use goes when its last user does (autoclear).
	for _, dev := range append(devs, driverproc.LoopDevicesOf(dir)...) {
		exec.Command("losetup", "-d", dev).Run()
	}
	if left := driverproc.Mounts(dir); len(left) > 0 {
		t.Errorf("mounts left behind: %v", left)
	}
}

func mountCap(mode csi.VolumeCapability_AccessMode_Mode, fs string) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: fs}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode},
	}
}

func blockCap(mode csi.VolumeCapability_AccessMode_Mode) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode},
	}
}

const snw = csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER

func wantCode(t *testing.T, what string, err error, code codes.Code) {
	t.Helper()
	if status.Code(err) != code {
		t.Fatalf("%s: got %v (%v), want %v", what, status.Code(err), err, code)
	}
}

func bg() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	_ = cancel // released when the test binary ends; each call is bounded
	return ctx
}

// paths returns a staging and a target path under a kubelet dir.
func paths(kubelet, vol string) (staging, target string) {
	return filepath.Join(kubelet, "plugins", "staging", vol), filepath.Join(kubelet, "pods", vol, "mount")
}

func (c *cluster) stagePublish(t *testing.T, n csi.NodeClient, kubelet, id string, cap *csi.VolumeCapability, ro bool) string {
	t.Helper()
	staging, target := paths(kubelet, filepath.Base(id))
	os.MkdirAll(staging, 0o750)
	os.MkdirAll(filepath.Dir(target), 0o750)
	if _, err := n.NodeStageVolume(bg(), &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: cap}); err != nil {
		t.Fatalf("NodeStageVolume: %v", err)
	}
	if _, err := n.NodePublishVolume(bg(), &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: cap, Readonly: ro}); err != nil {
		t.Fatalf("NodePublishVolume: %v", err)
	}
	return target
}

func (c *cluster) unpublishUnstage(t *testing.T, n csi.NodeClient, kubelet, id string) {
	t.Helper()
	staging, target := paths(kubelet, filepath.Base(id))
	if _, err := n.NodeUnpublishVolume(bg(), &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
		t.Fatalf("NodeUnpublishVolume: %v", err)
	}
	if _, err := n.NodeUnstageVolume(bg(), &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
		t.Fatalf("NodeUnstageVolume: %v", err)
	}
}

func (c *cluster) publish(t *testing.T, id, node string, cap *csi.VolumeCapability) error {
	t.Helper()
	_, err := c.ctrl.ControllerPublishVolume(bg(), &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: node, VolumeCapability: cap})
	return err
}

func (c *cluster) create(t *testing.T, name string, size int64, cap *csi.VolumeCapability) string {
	t.Helper()
	resp, err := c.ctrl.CreateVolume(bg(), &csi.CreateVolumeRequest{Name: name, CapacityRange: &csi.CapacityRange{RequiredBytes: size}, VolumeCapabilities: []*csi.VolumeCapability{cap}})
	if err != nil {
		t.Fatalf("CreateVolume %s: %v", name, err)
	}
	return resp.Volume.VolumeId
}

func writeRandom(t *testing.T, path string, size int) []byte {
	t.Helper()
	data := make([]byte, size)
	rand.Read(data)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	f, _ := os.Open(path)
	f.Sync()
	f.Close()
	sum := sha256.Sum256(data)
	return sum[:]
}

func checksum(t *testing.T, path string) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	io.Copy(h, f)
	return h.Sum(nil)
}

func TestFencingDataAndExpansion(t *testing.T) {
	for _, fs := range []string{"ext4", "xfs"} {
		t.Run(fs, func(t *testing.T) {
			c := newCluster(t)
			cap := mountCap(snw, fs)
			id := c.create(t, "pvc-data-"+fs, 320*mib, cap)

			// Fencing: attached to A, so B may not stage it, nor attach it.
			if err := c.publish(t, id, "node-a", cap); err != nil {
				t.Fatal(err)
			}
			stagingB, _ := paths(c.kubeletB, filepath.Base(id))
			os.MkdirAll(stagingB, 0o750)
			_, err := c.nodeB.NodeStageVolume(bg(), &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: stagingB, VolumeCapability: cap})
			wantCode(t, "stage on node B while attached to A", err, codes.FailedPrecondition)
			wantCode(t, "attach to B while attached to A", c.publish(t, id, "node-b", cap), codes.FailedPrecondition)

			// Data survives unpublish, unstage, stage and publish on A.
			target := c.stagePublish(t, c.nodeA, c.kubeletA, id, cap, false)
			want := writeRandom(t, filepath.Join(target, "data"), 8<<20)
			c.unpublishUnstage(t, c.nodeA, c.kubeletA, id)
			target = c.stagePublish(t, c.nodeA, c.kubeletA, id, cap, false)
			if got := checksum(t, filepath.Join(target, "data")); !bytes.Equal(got, want) {
				t.Fatal("checksum changed after unstage and restage on node A")
			}
			c.unpublishUnstage(t, c.nodeA, c.kubeletA, id)

			// Detach from A, attach to B: B sees the same data.
			if _, err := c.ctrl.ControllerUnpublishVolume(bg(), &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: "node-a"}); err != nil {
				t.Fatal(err)
			}
			if err := c.publish(t, id, "node-b", cap); err != nil {
				t.Fatal(err)
			}
			staging, _ := paths(c.kubeletA, filepath.Base(id))
			_, err = c.nodeA.NodeStageVolume(bg(), &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: cap})
			wantCode(t, "stage on node A after the move to B", err, codes.FailedPrecondition)
			target = c.stagePublish(t, c.nodeB, c.kubeletB, id, cap, false)
			if got := checksum(t, filepath.Join(target, "data")); !bytes.Equal(got, want) {
				t.Fatal("checksum differs on node B")
			}

			// Online expansion: the filesystem grows while mounted, the data
			// stays. The kernel wants CAP_SYS_RESOURCE to grow ext4 online; a
			// privileged node plugin has it, some sandboxes do not.
			if fs == "xfs" || hasCapSysResource() {
				c.expand(t, id, 640*mib, target, c.nodeB, c.kubeletB, cap)
			} else {
				t.Log("online ext4 growth skipped: this process lacks CAP_SYS_RESOURCE; the offline path below still runs")
			}
			if got := checksum(t, filepath.Join(target, "data")); !bytes.Equal(got, want) {
				t.Fatal("checksum changed by expansion")
			}
			// Offline expansion: grown while unstaged, the filesystem follows
			// at the next stage (ext4 before mounting, xfs by NodeExpand).
			c.unpublishUnstage(t, c.nodeB, c.kubeletB, id)
			if _, err := c.ctrl.ControllerExpandVolume(bg(), &csi.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: &csi.CapacityRange{RequiredBytes: 960 * mib}}); err != nil {
				t.Fatal(err)
			}
			target = c.stagePublish(t, c.nodeB, c.kubeletB, id, cap, false)
			c.expand(t, id, 960*mib, target, c.nodeB, c.kubeletB, cap)
			if got := checksum(t, filepath.Join(target, "data")); !bytes.Equal(got, want) {
				t.Fatal("checksum changed by offline expansion")
			}
			stats, err := c.nodeB.NodeGetVolumeStats(bg(), &csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: target})
			if err != nil || len(stats.Usage) != 2 || stats.Usage[0].Total < 500*mib {
				t.Fatalf("NodeGetVolumeStats = %v, %v", stats, err)
			}
			c.unpublishUnstage(t, c.nodeB, c.kubeletB, id)
			if _, err := c.ctrl.ControllerUnpublishVolume(bg(), &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: "node-b"}); err != nil {
				t.Fatal(err)
			}
			if _, err := c.ctrl.DeleteVolume(bg(), &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
				t.Fatal(err)
			}
			if devs := driverproc.LoopDevicesOf(c.dir); len(devs) != 0 {
				t.Fatalf("loop devices left: %v", devs)
			}
		})
	}
}

func TestMultiNodeRules(t *testing.T) {
	c := newCluster(t)
	_, err := c.ctrl.CreateVolume(bg(), &csi.CreateVolumeRequest{Name: "mnmw-mount", VolumeCapabilities: []*csi.VolumeCapability{mountCap(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER, "ext4")}})
	wantCode(t, "multi-node writable mount", err, codes.InvalidArgument)

	// A raw block volume may be written from two nodes (the application,
	// e.g. a clustered database, coordinates).
	cap := blockCap(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER)
	id := c.create(t, "mnmw-block", 16*mib, cap)
	for _, n := range []string{"node-a", "node-b"} {
		if err := c.publish(t, id, n, cap); err != nil {
			t.Fatalf("publish to %s: %v", n, err)
		}
	}
	ta := c.stagePublish(t, c.nodeA, c.kubeletA, id, cap, false)
	tb := c.stagePublish(t, c.nodeB, c.kubeletB, id, cap, false)
	var rdev [2]uint64
	for i, target := range []string{ta, tb} {
		var st unix.Stat_t
		if err := unix.Stat(target, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFBLK {
			t.Fatalf("%s is not a block device: %v", target, err)
		}
		rdev[i] = st.Rdev
	}
	// Both "nodes" share this host's kernel here, as two kubelets on one
	// machine do; each node plugin acts only on the loop devices it
	// attached itself (pkg/loop owners), as on real nodes: each node has
	// a device of its own for the image, and node A's unstage detaches its
	// own while node B's publish goes on using B's.
	if rdev[0] == rdev[1] {
		t.Fatalf("nodes A and B staged the image on one loop device (%d:%d)", unix.Major(rdev[0]), unix.Minor(rdev[0]))
	}
	stagingA, targetA := paths(c.kubeletA, filepath.Base(id))
	stagingB, targetB := paths(c.kubeletB, filepath.Base(id))
	if _, err := c.nodeA.NodeUnpublishVolume(bg(), &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: targetA}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.nodeA.NodeUnstageVolume(bg(), &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: stagingA}); err != nil {
		t.Fatalf("node A's unstage while node B has its own device published: %v", err)
	}
	f, err := os.Open(targetB)
	if err != nil {
		t.Fatalf("node B's publish after node A's unstage: %v", err)
	}
	if _, err := f.ReadAt(make([]byte, 4096), 0); err != nil {
		t.Errorf("node B's device after node A's unstage: %v", err)
	}
	f.Close()
	if _, err := c.nodeB.NodeUnpublishVolume(bg(), &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: targetB}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.nodeB.NodeUnstageVolume(bg(), &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: stagingB}); err != nil {
		t.Fatal(err)
	}
	if devs := driverproc.LoopDevicesOf(c.dir); len(devs) != 0 {
		t.Fatalf("loop devices left: %v", devs)
	}

	// Read-only sharing: MULTI_NODE_READER_ONLY published read-only.
	ro := mountCap(csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY, "ext4")
	rid := c.create(t, "mnro", 32*mib, ro)
	if _, err := c.ctrl.ControllerPublishVolume(bg(), &csi.ControllerPublishVolumeRequest{VolumeId: rid, NodeId: "node-a", VolumeCapability: ro, Readonly: false}); status.Code(err) != codes.OK {
		t.Fatalf("first writer-less publish: %v", err)
	}
	_, err = c.ctrl.ControllerPublishVolume(bg(), &csi.ControllerPublishVolumeRequest{VolumeId: rid, NodeId: "node-b", VolumeCapability: ro, Readonly: true})
	wantCode(t, "read-only node next to a writable attachment", err, codes.FailedPrecondition)
}

func TestBadInputTouchesNothing(t *testing.T) {
	c := newCluster(t)
	cap := mountCap(snw, "ext4")
	id := c.create(t, "pvc-bad", 32*mib, cap)
	if err := c.publish(t, id, "node-a", cap); err != nil {
		t.Fatal(err)
	}
	outside := filepath.Join(c.dir, "outside")
	os.MkdirAll(outside, 0o750)
	staging, target := paths(c.kubeletA, "pvc-bad")
	badIDs := []string{"..", "../../etc/passwd", "shared/../x", "a\x00b", strings.Repeat("x", 10000), "shared." + strings.Repeat("0", 32)}
	for _, bad := range badIDs {
		_, err := c.nodeA.NodeStageVolume(bg(), &csi.NodeStageVolumeRequest{VolumeId: bad, StagingTargetPath: staging, VolumeCapability: cap})
		wantCode(t, "NodeStageVolume with a bad ID", err, codes.NotFound)
		_, err = c.nodeA.NodeGetVolumeStats(bg(), &csi.NodeGetVolumeStatsRequest{VolumeId: bad, VolumePath: target})
		if status.Code(err) != codes.NotFound && status.Code(err) != codes.InvalidArgument {
			t.Fatalf("NodeGetVolumeStats with bad ID: %v", err)
		}
		_, err = c.ctrl.ControllerPublishVolume(bg(), &csi.ControllerPublishVolumeRequest{VolumeId: bad, NodeId: "node-a", VolumeCapability: cap})
		wantCode(t, "ControllerPublishVolume with a bad ID", err, codes.NotFound)
	}
	for _, path := range []string{outside, "/tmp", c.kubeletA + "/../outside", "relative/path", c.kubeletA + "x/target"} {
		_, err := c.nodeA.NodeStageVolume(bg(), &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: path, VolumeCapability: cap})
		wantCode(t, "NodeStageVolume outside --kubelet-dir "+path, err, codes.InvalidArgument)
		_, err = c.nodeA.NodePublishVolume(bg(), &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: path, VolumeCapability: cap})
		wantCode(t, "NodePublishVolume outside --kubelet-dir "+path, err, codes.InvalidArgument)
	}
	for _, size := range []int64{-1, 1 << 62} {
		_, err := c.ctrl.CreateVolume(bg(), &csi.CreateVolumeRequest{Name: "sized", CapacityRange: &csi.CapacityRange{RequiredBytes: size}, VolumeCapabilities: []*csi.VolumeCapability{cap}})
		if code := status.Code(err); code != codes.InvalidArgument && code != codes.OutOfRange {
			t.Fatalf("CreateVolume of %d bytes: %v", size, err)
		}
	}
	_, err := c.ctrl.CreateVolume(bg(), &csi.CreateVolumeRequest{Name: "mode", VolumeCapabilities: []*csi.VolumeCapability{mountCap(csi.VolumeCapability_AccessMode_Mode(42), "ext4")}})
	wantCode(t, "unknown access mode", err, codes.InvalidArgument)
	if m := driverproc.Mounts(c.dir); len(m) != 0 {
		t.Fatalf("bad input mounted something: %v", m)
	}
	entries, _ := os.ReadDir(outside)
	if len(entries) != 0 {
		t.Fatalf("bad input created %v outside the kubelet dir", entries)
	}
	imgs, _ := filepath.Glob(filepath.Join(c.pool, "volumes", "*.img"))
	if len(imgs) != 1 {
		t.Fatalf("pool holds %v, want only the one volume", imgs)
	}
}

func TestRestartFindsMountsAndCrashRetry(t *testing.T) {
	c := newCluster(t, "--http-endpoint=127.0.0.1:0")
	cap := mountCap(snw, "ext4")
	id := c.create(t, "pvc-restart", 32*mib, cap)
	if err := c.publish(t, id, "node-a", cap); err != nil {
		t.Fatal(err)
	}
	target := c.stagePublish(t, c.nodeA, c.kubeletA, id, cap, false)
	want := writeRandom(t, filepath.Join(target, "data"), 1<<20)

	// The node plugin dies and comes back: everything it needs is on the
	// system (mountinfo, sysfs, the pool).
	c.a.Kill()
	c.a = driverproc.Start(t, filepath.Join(c.dir, "a"), "--mode=all", "--node-id=node-a", "--zone=shared", "--pool=shared="+c.pool, "--kubelet-dir="+c.kubeletA)
	c.ctrl, c.nodeA = csi.NewControllerClient(c.a.Conn), csi.NewNodeClient(c.a.Conn)
	// Staging and publishing again are no-ops that succeed.
	if got := c.stagePublish(t, c.nodeA, c.kubeletA, id, cap, false); got != target {
		t.Fatalf("target moved: %s", got)
	}
	if got := checksum(t, filepath.Join(target, "data")); !bytes.Equal(got, want) {
		t.Fatal("checksum changed across a driver restart")
	}
	c.unpublishUnstage(t, c.nodeA, c.kubeletA, id)
	if devs := driverproc.LoopDevicesOf(c.dir); len(devs) != 0 {
		t.Fatalf("loop devices left after unstage: %v", devs)
	}

	// A CreateVolume that crashed after making the image but before the
	// record: the retry returns the same volume.
	first := c.create(t, "pvc-retry", 32*mib, cap)
	hash := first[strings.LastIndex(first, ".")+1:]
	os.Remove(filepath.Join(c.pool, "volumes", hash+".json"))
	if again := c.create(t, "pvc-retry", 32*mib, cap); again != first {
		t.Fatalf("retry gave %s, first %s", again, first)
	}

	// A half-written record and a missing image are reported, not panics.
	rec := filepath.Join(c.pool, "volumes", hash+".json")
	data, _ := os.ReadFile(rec)
	os.WriteFile(rec, data[:len(data)/2], 0o600)
	h, err := c.ctrl.ControllerGetVolumeHealth(bg(), &csi.ControllerGetVolumeHealthRequest{VolumeId: first})
	if err != nil || len(h.GetVolumeHealth().GetHealthStatuses()) == 0 {
		t.Fatalf("health of a volume with a torn record = %v, %v", h, err)
	}
	_, err = c.ctrl.ControllerPublishVolume(bg(), &csi.ControllerPublishVolumeRequest{VolumeId: first, NodeId: "node-a", VolumeCapability: cap})
	if code := status.Code(err); code == codes.OK || code == codes.Unknown {
		t.Fatalf("publish of a volume with a torn record: %v", err)
	}
	// Nodes serve the pool, so a volume whose record cannot be read may be
	// in use: not deleted until the operator moves the record aside.
	_, err = c.ctrl.DeleteVolume(bg(), &csi.DeleteVolumeRequest{VolumeId: first})
	wantCode(t, "delete of a volume with a torn record", err, codes.FailedPrecondition)
	if err := os.Rename(rec, rec+".unreadable"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ctrl.DeleteVolume(bg(), &csi.DeleteVolumeRequest{VolumeId: first}); err != nil {
		t.Fatal(err)
	}
	other := c.create(t, "pvc-lost", 32*mib, cap)
	os.Remove(filepath.Join(c.pool, "volumes", other[strings.LastIndex(other, ".")+1:]+".img"))
	h, err = c.ctrl.ControllerGetVolumeHealth(bg(), &csi.ControllerGetVolumeHealthRequest{VolumeId: other})
	if err != nil || len(h.GetVolumeHealth().GetHealthStatuses()) == 0 || h.VolumeHealth.HealthStatuses[0].Status != csi.VolumeHealthErrorType_DATA_LOSS {
		t.Fatalf("health of a volume without image = %v, %v", h, err)
	}
}

// TestMetricsAndHealth scrapes the driver's HTTP endpoint.
func TestMetricsAndHealth(t *testing.T) {
	driverproc.RequireRoot(t)
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "pool"), 0o750)
	d := driverproc.Start(t, dir, "--mode=controller", "--pool=p1="+filepath.Join(dir, "pool"), "--http-endpoint=127.0.0.1:39808")
	ctrl := csi.NewControllerClient(d.Conn)
	ctrl.CreateVolume(bg(), &csi.CreateVolumeRequest{Name: "m", VolumeCapabilities: []*csi.VolumeCapability{mountCap(snw, "")}})
	ctrl.DeleteVolume(bg(), &csi.DeleteVolumeRequest{})
	resp, err := http.Get("http://127.0.0.1:39808/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`csi_plugin_operations_seconds_count{driver_name="loopvol.csi.io",grpc_status_code="OK",method_name="/csi.v1.Controller/CreateVolume"} 1`,
		`csi_plugin_operations_seconds_count{driver_name="loopvol.csi.io",grpc_status_code="InvalidArgument",method_name="/csi.v1.Controller/DeleteVolume"} 1`,
		`loopvol_pool_available_bytes{pool="p1",zone="default"}`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	h, err := http.Get("http://127.0.0.1:39808/healthz")
	if err != nil || h.StatusCode != 200 {
		t.Fatalf("healthz = %v, %v", h, err)
	}
	h.Body.Close()
	// A pool whose marker vanished is not usable: not ready.
	os.Remove(filepath.Join(dir, "pool", ".loopvol-pool"))
	h, err = http.Get("http://127.0.0.1:39808/healthz")
	if err != nil || h.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("healthz with a broken pool = %v, %v", h, err)
	}
	h.Body.Close()
}

func TestBadFlags(t *testing.T) {
	bin := driverproc.Binary(t)
	for _, args := range [][]string{
		{"--mode=bogus", "--pool=a=/tmp/x"},
		{"--endpoint=tcp://1.2.3.4:5", "--pool=a=/tmp/x"},
		{"--pool=noequals"},
		{"--mode=all"},
		{"--no-such-flag"},
		{"--pool=Bad_Name=" + t.TempDir(), "--mode=controller"},
	} {
		out, err := exec.Command(bin, args...).CombinedOutput()
		if err == nil {
			t.Errorf("driver %v exited 0", args)
		}
		if len(out) == 0 {
			t.Errorf("driver %v printed no message", args)
		}
	}
}

// expand grows a published volume to size (ControllerExpandVolume then
// NodeExpandVolume, as the resizer and kubelet do) and checks that the
// filesystem at target is now about that big.
func (c *cluster) expand(t *testing.T, id string, size int64, target string, n csi.NodeClient, kubelet string, cap *csi.VolumeCapability) {
	t.Helper()
	exp, err := c.ctrl.ControllerExpandVolume(bg(), &csi.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: &csi.CapacityRange{RequiredBytes: size}})
	if err != nil || !exp.NodeExpansionRequired {
		t.Fatalf("ControllerExpandVolume = %v, %v", exp, err)
	}
	staging, _ := paths(kubelet, filepath.Base(id))
	if _, err := n.NodeExpandVolume(bg(), &csi.NodeExpandVolumeRequest{VolumeId: id, VolumePath: target, StagingTargetPath: staging, CapacityRange: &csi.CapacityRange{RequiredBytes: size}, VolumeCapability: cap}); err != nil {
		t.Fatalf("NodeExpandVolume: %v", err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(target, &st); err != nil {
		t.Fatal(err)
	}
	// Filesystem metadata takes a few percent.
	if total := int64(st.Blocks) * st.Bsize; total < size*85/100 {
		t.Fatalf("filesystem holds %d bytes after growing to %d", total, size)
	}
}

// hasCapSysResource reports whether this process may grow ext4 online.
func hasCapSysResource() bool {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(data), "\n") {
		if hex, ok := strings.CutPrefix(line, "CapEff:"); ok {
			var caps uint64
			fmt.Sscanf(strings.TrimSpace(hex), "%x", &caps)
			return caps&(1<<unix.CAP_SYS_RESOURCE) != 0
		}
	}
	return false
}

// TestConfigFileZones serves pools of two zones from --config: capacity is
// answered per zone and a volume lands in the zone its topology asks for.
func TestConfigFileZones(t *testing.T) {
	driverproc.RequireRoot(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "pools.yaml")
	yaml := "pools:\n- name: east\n  zone: z-east\n  path: " + filepath.Join(dir, "east") + "\n- name: west\n  zone: z-west\n  path: " + filepath.Join(dir, "west") + "\n  reserveBytes: 1048576\n"
	if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	d := driverproc.Start(t, dir, "--mode=controller", "--config="+cfg)
	ctrl := csi.NewControllerClient(d.Conn)
	zone := func(z string) *csi.Topology {
		return &csi.Topology{Segments: map[string]string{"topology.loopvol.csi.io/zone": z}}
	}
	east, err := ctrl.GetCapacity(bg(), &csi.GetCapacityRequest{AccessibleTopology: zone("z-east")})
	if err != nil {
		t.Fatal(err)
	}
	west, err := ctrl.GetCapacity(bg(), &csi.GetCapacityRequest{AccessibleTopology: zone("z-west")})
	if err != nil {
		t.Fatal(err)
	}
	none, err := ctrl.GetCapacity(bg(), &csi.GetCapacityRequest{AccessibleTopology: zone("z-north")})
	if err != nil {
		t.Fatal(err)
	}
	// Same filesystem below both pools; west keeps a 1 MiB reserve.
	if east.AvailableCapacity <= 0 || east.AvailableCapacity-west.AvailableCapacity < 512<<10 || none.AvailableCapacity != 0 {
		t.Fatalf("capacity east=%d west=%d north=%d", east.AvailableCapacity, west.AvailableCapacity, none.AvailableCapacity)
	}
	resp, err := ctrl.CreateVolume(bg(), &csi.CreateVolumeRequest{
		Name:                      "zoned",
		VolumeCapabilities:        []*csi.VolumeCapability{mountCap(snw, "")},
		CapacityRange:             &csi.CapacityRange{RequiredBytes: 16 * mib},
		AccessibilityRequirements: &csi.TopologyRequirement{Requisite: []*csi.Topology{zone("z-west")}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(resp.Volume.VolumeId, "west.") || resp.Volume.AccessibleTopology[0].Segments["topology.loopvol.csi.io/zone"] != "z-west" {
		t.Fatalf("volume %v not in zone z-west", resp.Volume)
	}
	// A config file with an unknown field is refused, not half-read.
	os.WriteFile(cfg, []byte("pools:\n- name: a\n  zone: z\n  path: /tmp/x\n  reserve: 5\n"), 0o600)
	if out, err := exec.Command(driverproc.Binary(t), "--mode=controller", "--endpoint=unix://"+filepath.Join(dir, "x.sock"), "--config="+cfg).CombinedOutput(); err == nil || !strings.Contains(string(out), "reserve") {
		t.Fatalf("driver with a bad config: %v\n%s", err, out)
	}
}
