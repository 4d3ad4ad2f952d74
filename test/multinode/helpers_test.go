package multinode

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/loopvol/loopvol/internal/harness/cluster"
	"github.com/loopvol/loopvol/internal/harness/cluster/clustertest"
	"github.com/loopvol/loopvol/internal/harness/testenv"
)

// images are the OCI archives `make images cluster-images` writes that
// these tests run.
var images = []string{"loopvol-node", "loopvol-controller", "csi-provisioner", "pause", "busybox"}

// nodeDisk is the size of each node's own pool file system (nodePools).
const nodeDisk = 512 << 20

// up brings a cluster of two nodes up (nodePools: each node with pools of
// its own, on a file system of nodeDisk bytes, else one pool every node
// sees), applies the overlay of
// deploy/kubernetes named overlay with what this cluster needs
// (Cluster.Overlay), and tears it all down when the test ends.
func up(t *testing.T, nodePools bool, overlay string) (*cluster.Cluster, string) {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return upDir(t, nodePools, root, filepath.Join(root, "deploy", "kubernetes", "overlays", overlay)), root
}

// upDir is up with the kustomization in dir, which may be one a test
// wrote (fencingOverlay), and more settings of the cluster.
func upDir(t *testing.T, nodePools bool, root, dir string, more ...func(*cluster.Config)) *cluster.Cluster {
	t.Helper()
	testenv.RequireRoot(t)
	testenv.RequireLoopDevices(t)
	if cluster.NetNSNodeIP() == "" {
		t.Skip("a cluster of nodes needs the test binary in a network namespace of its own (TestMain)")
	}
	bin, err := testenv.BinDir()
	if err != nil {
		t.Fatal(err)
	}
	c := clustertest.Up(t, "loopvol-multinode-", root, bin, "`make test-multinode`", images, func(cfg *cluster.Config) {
		cfg.Nodes, cfg.NodePools, cfg.NodeName = 2, nodePools, "node"
		if nodePools {
			cfg.NodePoolBytes = nodeDisk
		}
		for _, f := range more {
			f(cfg)
		}
	})
	deployed, err := c.Overlay(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Deploy(context.Background(), deployed); err != nil {
		t.Fatal(err)
	}
	return c
}

func namespace(t *testing.T, c *cluster.Cluster, name string) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if _, err := c.Client.CoreV1().Namespaces().Create(context.Background(), ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteNamespace(t, c, name) })
	return name
}

// deleteNamespace deletes ns and waits until it is gone with its volumes
// detached.
func deleteNamespace(t *testing.T, c *cluster.Cluster, ns string) {
	t.Helper()
	ctx := context.Background()
	if err := c.Client.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Error(err)
		return
	}
	if err := c.Wait(ctx, "namespace "+ns+" gone, no VolumeAttachment left", 3*time.Minute, func(ctx context.Context) (bool, error) {
		if _, err := c.Client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return false, nil
		}
		vas, err := c.Client.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
		return err == nil && len(vas.Items) == 0, err
	}); err != nil {
		t.Error(err)
	}
}

// onNode pins pod to the node name.
func onNode(pod *corev1.Pod, name string) *corev1.Pod {
	pod.Spec.NodeSelector = map[string]string{corev1.LabelHostname: name}
	return pod
}

// attachmentOf is the VolumeAttachment of pv, or nil.
func attachmentOf(ctx context.Context, c *cluster.Cluster, pv string) (*storagev1.VolumeAttachment, error) {
	vas, err := c.Client.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	for _, va := range vas.Items {
		if va.Spec.Source.PersistentVolumeName != nil && *va.Spec.Source.PersistentVolumeName == pv {
			return &va, nil
		}
	}
	return nil, nil
}

// volumeOf is the PV bound to the claim.
func volumeOf(ctx context.Context, t *testing.T, c *cluster.Cluster, ns, claim string) *corev1.PersistentVolume {
	t.Helper()
	pvc, err := c.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, claim, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pv, err := c.Client.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return pv
}

// running waits until the pod runs and returns it.
func running(ctx context.Context, t *testing.T, c *cluster.Cluster, ns, name string) *corev1.Pod {
	t.Helper()
	pod, err := c.PodPhase(ctx, ns, name, corev1.PodRunning, 3*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	return pod
}

// logLine waits until the pod's main container has written a line
// containing want and returns the whole log (clustertest.LogLine).
func logLine(ctx context.Context, t *testing.T, c *cluster.Cluster, pod *corev1.Pod, want string) string {
	t.Helper()
	return clustertest.LogLine(ctx, t, c, pod, want)
}

// kubectl runs kubectl and fails the test on an error.
func kubectl(ctx context.Context, t *testing.T, c *cluster.Cluster, args ...string) string {
	t.Helper()
	out, err := c.Kubectl(ctx, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// other is the name of the node of the two that is not name.
func other(c *cluster.Cluster, name string) string {
	for _, n := range c.Nodes() {
		if n.Name != name {
			return n.Name
		}
	}
	return ""
}

func readFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	return string(b), err
}
