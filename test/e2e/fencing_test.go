package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/loopvol/loopvol/internal/harness/testfs"
	"github.com/loopvol/loopvol/pkg/fencing"
	"github.com/loopvol/loopvol/pkg/heartbeat"
	"github.com/loopvol/loopvol/test/internal/driverproc"
)

// TestFencingControllerFencesAFrozenNode: the whole chain of fencing with
// the real binaries, on a real API server, loop devices and a reflink xfs
// pool, every component as a user that holds only the RBAC of
// deploy/kubernetes/components/fencing. Node B's plugin renews its
// heartbeat Lease; B has a volume staged and written. B's plugin is frozen
// (SIGSTOP): while B's kubelet still says Ready (the Node, as the test
// writes it) the fencing controller waits and says so; once B is NotReady it
// fences: the image is replaced, the claim hears VolumeFenced, B gets the
// out-of-service taint, and the detach from B answers at once. Node A then
// stages the volume with every write B synced before, and B's writes after
// the fence never reach it. B thawed renews again: the taint stays while B,
// Ready, still holds the fenced volume, its unstage cleans its side up, and
// the taint comes off once its plugin says it is clean.
func TestFencingControllerFencesAFrozenNode(t *testing.T) {
	r := newRigWith(t, func(r *rig) {
		testfs.MountReflinkXFS(r.t, filepath.Join(r.dir, "pool.xfs"), r.pool, 2<<30)
	})
	// Runs before the pool's unmount: whatever a failing test left mounted
	// or attached under the rig's directory goes (autoclear for a busy
	// device).
	t.Cleanup(func() {
		devs := driverproc.LoopDevicesOf(r.dir)
		mounts := driverproc.Mounts(r.dir)
		for i := len(mounts) - 1; i >= 0; i-- {
			if f := strings.Fields(mounts[i]); len(f) > 4 && f[4] != r.pool {
				_ = exec.Command("umount", "-l", f[4]).Run()
			}
		}
		for _, dev := range devs {
			_ = exec.Command("losetup", "-d", dev).Run()
		}
	})
	ns := r.env.Namespace(t)
	nodeB := r.nodeName("b")
	ctx := r.ctx

	// The Nodes, as kubelet and kube-controller-manager would keep them.
	for _, name := range []string{nodeA, nodeB} {
		if _, err := r.client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: r.labels()}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ignoreNotFound(t, r.client.CoreV1().Nodes().Delete(context.WithoutCancel(ctx), name, metav1.DeleteOptions{}))
		})
		setReady(t, r, name, corev1.ConditionTrue)
	}

	// Node B's plugin, renewing its heartbeat as the heartbeat's user.
	heartbeatKC := r.restrictedKubeconfig("loopvol-heartbeat-"+r.id, ns, "components/fencing/rbac-heartbeat.yaml")
	dirB := filepath.Join(r.dir, "node-b")
	kubeletB := filepath.Join(dirB, "kubelet")
	if err := os.MkdirAll(kubeletB, 0o750); err != nil {
		t.Fatal(err)
	}
	pluginB := driverproc.Start(t, dirB, "--mode=node", "--node-id="+nodeB, "--zone=e2e", "--pool=e2e="+r.pool, "--kubelet-dir="+kubeletB,
		"--heartbeat-namespace="+ns, "--kubeconfig="+heartbeatKC, "--heartbeat-interval=500ms", "--fencing-period=4s", "--self-fence-after=2s")
	t.Cleanup(func() { _ = syscall.Kill(pluginB.Pid(), syscall.SIGCONT) }) // never leave it stopped
	lease := heartbeat.LeaseName(driverName, nodeB)
	poll(t, ctx, "node B's heartbeat Lease", func() bool {
		_, err := r.client.CoordinationV1().Leases(ns).Get(ctx, lease, metav1.GetOptions{})
		return err == nil
	})

	// The fencing controller, as its user.
	t.Setenv("NAMESPACE", ns)
	fencingKC := r.restrictedKubeconfig("loopvol-fencing-"+r.id, ns, "components/fencing/rbac-fencing.yaml")
	r.startSidecar("fencing", fencingKC, "--controllers=fencing", "--fencing-period=4s", "--fencing-taint-out-of-service", "--leader-election-namespace="+ns)

	// A volume on B, written and synced, with a PV and claim for Events.
	ctrl := r.ctrl
	capability := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4"}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
	vol, err := ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "fenced-" + r.id, CapacityRange: &csi.CapacityRange{RequiredBytes: 64 << 20}, VolumeCapabilities: []*csi.VolumeCapability{capability}})
	if err != nil {
		t.Fatal(err)
	}
	id := vol.GetVolume().GetVolumeId()
	claim := "data-" + r.id
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "pv-" + r.id, Labels: r.labels()},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:               corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("64Mi")},
			AccessModes:            []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: driverName, VolumeHandle: id, FSType: "ext4"}},
			ClaimRef:               &corev1.ObjectReference{Namespace: ns, Name: claim},
		},
	}
	if _, err := r.client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := ctrl.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: nodeB, VolumeCapability: capability}); err != nil {
		t.Fatal(err)
	}
	nodeClientB := csi.NewNodeClient(pluginB.Conn)
	stagingB, targetB := filepath.Join(kubeletB, "staging", "v"), filepath.Join(kubeletB, "pods", "v", "mount")
	stagePublish(t, ctx, nodeClientB, id, capability, stagingB, targetB)
	before := writeSynced(t, filepath.Join(targetB, "before"), 2<<20)
	image := filepath.Join(r.pool, "volumes", id[strings.LastIndex(id, ".")+1:]+".img")
	inode := func() uint64 {
		var st syscall.Stat_t
		if err := syscall.Stat(image, &st); err != nil {
			t.Fatal(err)
		}
		return st.Ino
	}
	staged := inode()

	// The fault: B's plugin stops (its heartbeat with it).
	if err := syscall.Kill(pluginB.Pid(), syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	fault := time.Now()
	waitEvent(t, r, "", nodeB, fencing.ReasonWaitingNotReady)
	if inode() != staged {
		t.Fatal("fenced while B's kubelet still said Ready")
	}
	t.Logf("Heartbeat stale, kubelet Ready: the controller waits (%s after the fault)", time.Since(fault).Round(time.Millisecond))
	notReady := time.Now()
	setReady(t, r, nodeB, corev1.ConditionUnknown)
	poll(t, ctx, "the fence (a new image)", func() bool { return inode() != staged })
	fenced := time.Now()
	t.Logf("Fenced %s after the fault, %s after B turned NotReady", fenced.Sub(fault).Round(time.Millisecond), fenced.Sub(notReady).Round(time.Millisecond))
	waitEvent(t, r, ns, claim, fencing.ReasonVolumeFenced)
	poll(t, ctx, "the out-of-service taint", func() bool { return hasTaint(t, r, nodeB) })

	// B's writes after the fence go nowhere; the detach answers at once.
	writeSynced(t, filepath.Join(targetB, "after"), 2<<20)
	start := time.Now()
	if _, err := ctrl.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: nodeB}); err != nil {
		t.Fatalf("ControllerUnpublishVolume from the fenced node: %v", err)
	}
	t.Logf("Detach from the fenced node: %s", time.Since(start).Round(time.Microsecond))
	if _, err := ctrl.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: nodeA, VolumeCapability: capability}); err != nil {
		t.Fatal(err)
	}
	nodeClientA := csi.NewNodeClient(r.driver.Conn)
	stagingA, targetA := filepath.Join(r.dir, "kubelet", "staging", "v"), filepath.Join(r.dir, "kubelet", "pods", "v", "mount")
	stagePublish(t, ctx, nodeClientA, id, capability, stagingA, targetA)
	if got := sum(t, filepath.Join(targetA, "before")); !bytes.Equal(got, before) {
		t.Error("node A reads another 'before' than B synced before the fence")
	}
	if _, err := os.Stat(filepath.Join(targetA, "after")); !os.IsNotExist(err) {
		t.Errorf("node A sees what B wrote after the fence: %v", err)
	}
	unpublishUnstage(t, ctx, nodeClientA, id, stagingA, targetA)
	imageSum := sum(t, image)

	// B is back: it renews, the taint stays while it holds the fenced
	// volume, its unstage cleans its side up without touching the volume,
	// and then the taint comes off.
	if err := syscall.Kill(pluginB.Pid(), syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, r, "", nodeB, fencing.ReasonNodeBack)
	if !hasTaint(t, r, nodeB) {
		t.Error("the taint came off before B was Ready")
	}
	setReady(t, r, nodeB, corev1.ConditionTrue)
	waitEvent(t, r, "", nodeB, fencing.ReasonOutOfServiceKept)
	if !hasTaint(t, r, nodeB) {
		t.Error("the taint came off while B still held the fenced volume")
	}
	// B's plugin, back, shuts the fenced filesystem down (within its 10 s
	// check): the Pod's writes fail with EIO instead of vanishing.
	poll(t, ctx, "B's writes to its fenced volume failing", func() bool {
		return os.WriteFile(filepath.Join(targetB, "later"), []byte("after the return\n"), 0o600) != nil
	})
	unpublishUnstage(t, ctx, nodeClientB, id, stagingB, targetB)
	if !bytes.Equal(sum(t, image), imageSum) {
		t.Error("node B's writes or unstage after the fence changed the volume's image")
	}
	if devs := driverproc.LoopDevicesOf(dirB); len(devs) != 0 {
		t.Errorf("node B kept loop devices: %v", devs)
	}
	poll(t, ctx, "the taint removed once B is clean", func() bool { return !hasTaint(t, r, nodeB) })
	waitEvent(t, r, "", nodeB, fencing.ReasonOutOfServiceOff)
	if _, err := ctrl.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: nodeA}); err != nil {
		t.Fatal(err)
	}
	if _, err := ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		t.Fatal(err)
	}
}

// setReady writes node's Ready condition, as kubelet (True) or
// kube-controller-manager (Unknown) would.
func setReady(t *testing.T, r *rig, node string, status corev1.ConditionStatus) {
	t.Helper()
	n, err := r.client.CoreV1().Nodes().Get(r.ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: status, LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
	if _, err := r.client.CoreV1().Nodes().UpdateStatus(r.ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func hasTaint(t *testing.T, r *rig, node string) bool {
	t.Helper()
	n, err := r.client.CoreV1().Nodes().Get(r.ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return slices.ContainsFunc(n.Spec.Taints, func(tn corev1.Taint) bool { return tn.Key == fencing.TaintOutOfService })
}

// waitEvent waits for an Event of reason on the object called name (in
// namespace ns; "" for a Node's, recorded in "default").
func waitEvent(t *testing.T, r *rig, ns, name, reason string) {
	t.Helper()
	if ns == "" {
		ns = metav1.NamespaceDefault
	}
	sel := fields.AndSelectors(fields.OneTermEqualSelector("involvedObject.name", name), fields.OneTermEqualSelector("reason", reason)).String()
	poll(t, r.ctx, "Event "+reason+" on "+name, func() bool {
		l, err := r.client.CoreV1().Events(ns).List(r.ctx, metav1.ListOptions{FieldSelector: sel})
		if err == nil && len(l.Items) > 0 {
			t.Logf("Event %s on %s: %s", reason, name, l.Items[0].Message)
			return true
		}
		return false
	})
}

func poll(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) { return cond(), nil }); err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

func stagePublish(t *testing.T, ctx context.Context, n csi.NodeClient, id string, c *csi.VolumeCapability, staging, target string) {
	t.Helper()
	for _, d := range []string{staging, filepath.Dir(target)} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := n.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: c}); err != nil {
		t.Fatalf("NodeStageVolume: %v", err)
	}
	if _, err := n.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: c}); err != nil {
		t.Fatalf("NodePublishVolume: %v", err)
	}
}

func unpublishUnstage(t *testing.T, ctx context.Context, n csi.NodeClient, id, staging, target string) {
	t.Helper()
	if _, err := n.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
		t.Fatalf("NodeUnpublishVolume: %v", err)
	}
	if _, err := n.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
		t.Fatalf("NodeUnstageVolume: %v", err)
	}
}

// writeSynced writes size random bytes to path, fsyncs them and returns
// their SHA-256.
func writeSynced(t *testing.T, path string, size int) []byte {
	t.Helper()
	data := make([]byte, size)
	rand.Read(data)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	s := sha256.Sum256(data)
	return s[:]
}

func sum(t *testing.T, path string) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return h.Sum(nil)
}
