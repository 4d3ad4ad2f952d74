package cluster

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/loopvol/loopvol/internal/harness/cluster"
	"github.com/loopvol/loopvol/internal/harness/cluster/clustertest"
	"github.com/loopvol/loopvol/internal/harness/testenv"
	"github.com/loopvol/loopvol/pkg/loop"
)

// extraPools are pools of the zone "default" beside "default" itself, on
// both sides of the driver: the VolumeAttributesClass scenario moves a
// volume to one of them.
var extraPools = []string{"fast"}

// images are the OCI archives `make images cluster-images` writes.
var images = []string{"loopvol-node", "loopvol-controller", "csi-provisioner", "csi-attacher", "csi-snapshotter", "snapshot-controller", "pause", "busybox"}

// deployed is the kustomization up applied: overlays/local with the extra
// pools and the snapshotter component. A scenario that applies another
// configuration (Switching) comes back to this one.
var deployed string

// up brings a cluster up under a temporary directory, deploys loopvol on
// it with snapshots (the VolumeSnapshot CRDs, the snapshot-controller,
// components/snapshotter), and tears it all down when the test ends.
func up(t *testing.T) *cluster.Cluster {
	t.Helper()
	testenv.RequireRoot(t)
	testenv.RequireLoopDevices(t)
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin, err := testenv.BinDir()
	if err != nil {
		t.Fatal(err)
	}
	c := clustertest.Up(t, "loopvol-cluster-", root, bin, "`make test-cluster`", images)
	ctx := context.Background()
	overlay, err := c.Overlay(filepath.Join(root, "deploy", "kubernetes", "overlays", "local"), extraPools...)
	if err != nil {
		t.Fatal(err)
	}
	clustertest.SnapshotCRDs(ctx, t, c, root)
	deployed = clustertest.DeployWithSnapshots(ctx, t, c, root, overlay)
	return c
}

// TestCluster runs the scenarios on one cluster, one after another.
func TestCluster(t *testing.T) {
	c := up(t)
	t.Run("VolumeLifecycle", func(t *testing.T) { testVolumeLifecycle(t, c) })
	// Early: every scenario after it runs with the webhook answering.
	t.Run("Webhook", func(t *testing.T) { testWebhook(t, c) })
	t.Run("PodNetwork", func(t *testing.T) { testPodNetwork(t, c) })
	t.Run("RawBlock", func(t *testing.T) { testRawBlock(t, c) })
	t.Run("Burst", func(t *testing.T) { testBurst(t, c) })
	t.Run("Expansion", func(t *testing.T) { testExpansion(t, c) })
	t.Run("NodePluginRestart", func(t *testing.T) { testNodePluginRestart(t, c) })
	t.Run("BulkProvisioning", func(t *testing.T) { testBulkProvisioning(t, c) })
	t.Run("VolumeAttributesClass", func(t *testing.T) { testVolumeAttributesClass(t, c) })
	t.Run("Snapshots", func(t *testing.T) { testSnapshots(t, c) })
	// It restarts the node plugin (a registration broken on purpose).
	t.Run("KubectlPlugin", func(t *testing.T) { testKubectlPlugin(t, c) })
	// Before RBAC: upstream's attacher's log is searched for "forbidden" too.
	t.Run("Switching", func(t *testing.T) { testSwitching(t, c) })
	// After the others: their logs are searched for "forbidden".
	t.Run("RBAC", func(t *testing.T) { testRBAC(t, c) })
	// Last: it restarts the node plugin with a volume limit.
	t.Run("NodeLimit", func(t *testing.T) { testNodeLimit(t, c) })
}

// testVolumeLifecycle: PVC → Pod Running → data written; the Pod deleted
// and another reading the data back; the PVC deleted → detached, the image
// gone from the pool, no object left behind with a finalizer.
func testVolumeLifecycle(t *testing.T, c *cluster.Cluster) {
	ctx := context.Background()
	ns := namespace(t, c, "lifecycle")
	core := c.Client.CoreV1()

	start := time.Now()
	if _, err := core.PersistentVolumeClaims(ns).Create(ctx, cluster.Claim(ns, "data", "loopvol", "64Mi"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	writer := cluster.VolumePod(ns, "writer", "data",
		"busybox dd if=/dev/urandom of=/data/file bs=1M count=8 && busybox sha256sum /data/file > /data/file.sha256 && busybox sync && "+
			"echo written && busybox sleep 1000000 & wait")
	if _, err := core.Pods(ns).Create(ctx, writer, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod, err := c.PodPhase(ctx, ns, "writer", corev1.PodRunning, 3*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("PVC created → Pod Running in %s", time.Since(start).Round(time.Millisecond))
	if err := c.Wait(ctx, "the writer's data written", time.Minute, func(context.Context) (bool, error) {
		log, _ := c.ContainerLog(pod, "main")
		return strings.Contains(log, "written"), nil
	}); err != nil {
		t.Fatal(err)
	}

	pvc, err := core.PersistentVolumeClaims(ns).Get(ctx, "data", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pv, err := core.PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	handle := pv.Spec.CSI.VolumeHandle
	_, hash, _ := strings.Cut(handle, ".")
	image := filepath.Join(c.PoolDir(), "volumes", hash+".img")
	if _, err := os.Stat(image); err != nil {
		t.Fatalf("volume %s: no image in the pool: %v", handle, err)
	}
	// The node plugin tuned the volume's loop device (pkg/loop Tune) in
	// its container: writeback throttling off (the kernel turns it on at
	// the first write, 2000 µs) and, the volume being thick, discards
	// refused. It needs a writable sysfs in the pod (internal/harness/cluster
	// holdSysfs).
	dev, found, err := loop.New().Find(image)
	if err != nil || !found {
		t.Fatalf("the loop device of %s: found %t, %v", image, found, err)
	}
	for attr, want := range map[string]string{"wbt_lat_usec": "0", "discard_max_bytes": "0"} {
		b, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "queue", attr))
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.TrimSpace(string(b)); got != want {
			t.Errorf("%s of %s (the volume's loop device): %s, want %s: the node plugin did not tune it (its log says why)", attr, dev, got, want)
		}
	}
	vaName := attachment(ctx, t, c, pv.Name)
	t.Logf("volume %s, VolumeAttachment %s attached", handle, vaName)

	deletePod(ctx, t, c, ns, "writer")
	reader := cluster.VolumePod(ns, "reader", "data", "cd /data && busybox sha256sum -c file.sha256")
	if _, err := core.Pods(ns).Create(ctx, reader, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod, err = c.PodPhase(ctx, ns, "reader", corev1.PodSucceeded, 3*time.Minute)
	if err != nil {
		t.Fatalf("the data did not survive the pod: %v", err)
	}
	log, err := c.ContainerLog(pod, "main")
	if err != nil || !strings.Contains(log, "file: OK") {
		t.Fatalf("reader: %q, %v", log, err)
	}
	deletePod(ctx, t, c, ns, "reader")

	if err := core.PersistentVolumeClaims(ns).Delete(ctx, "data", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.Wait(ctx, "VolumeAttachment, PV and PVC gone", 2*time.Minute, func(ctx context.Context) (bool, error) {
		for _, get := range []func() error{
			func() error {
				_, err := c.Client.StorageV1().VolumeAttachments().Get(ctx, vaName, metav1.GetOptions{})
				return err
			},
			func() error { _, err := core.PersistentVolumes().Get(ctx, pv.Name, metav1.GetOptions{}); return err },
			func() error {
				_, err := core.PersistentVolumeClaims(ns).Get(ctx, "data", metav1.GetOptions{})
				return err
			},
		} {
			if err := get(); !apierrors.IsNotFound(err) {
				return false, nil
			}
		}
		return true, nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(image); !os.IsNotExist(err) {
		t.Fatalf("image %s still in the pool (%v)", image, err)
	}
}

// attachment waits until the VolumeAttachment of pv is attached and
// returns its name.
func attachment(ctx context.Context, t *testing.T, c *cluster.Cluster, pv string) string {
	t.Helper()
	var name string
	if err := c.Wait(ctx, "VolumeAttachment of "+pv+" attached", time.Minute, func(ctx context.Context) (bool, error) {
		vas, err := c.Client.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for _, va := range vas.Items {
			if va.Spec.Source.PersistentVolumeName != nil && *va.Spec.Source.PersistentVolumeName == pv && va.Status.Attached {
				name = va.Name
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		t.Fatal(err)
	}
	return name
}

func deletePod(ctx context.Context, t *testing.T, c *cluster.Cluster, ns, name string) {
	t.Helper()
	if err := c.Client.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.Wait(ctx, "pod "+ns+"/"+name+" gone", 2*time.Minute, func(ctx context.Context) (bool, error) {
		_, err := c.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	}); err != nil {
		t.Fatal(err)
	}
}

func namespace(t *testing.T, c *cluster.Cluster, name string) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if _, err := c.Client.CoreV1().Namespaces().Create(context.Background(), ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A scenario that fails half-way leaves its claims and Pods behind:
	// they go with it, so that the scenarios after it start from a cluster
	// without them (and fail, if they do, for their own reasons).
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		ctx := context.Background()
		if err := c.Client.CoreV1().Namespaces().Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			if !apierrors.IsNotFound(err) {
				t.Logf("deleting namespace %s after the failure: %v", name, err)
			}
			return
		}
		if err := c.Wait(ctx, "namespace "+name+" gone after the failure", 3*time.Minute, func(ctx context.Context) (bool, error) {
			_, err := c.Client.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
			return apierrors.IsNotFound(err), nil
		}); err != nil {
			t.Logf("%v", err)
		}
	})
	return name
}
