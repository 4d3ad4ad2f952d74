package multinode

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/loopvol/loopvol/internal/harness/cluster"
	"github.com/loopvol/loopvol/pkg/placement"
)

// drain runs `kubectl drain` of node, as an operator would before
// maintenance, and uncordons it when the test ends.
func drain(ctx context.Context, t *testing.T, c *cluster.Cluster, node string) {
	t.Helper()
	t.Cleanup(func() { _, _ = c.Kubectl(context.Background(), "uncordon", node) })
	start := time.Now()
	kubectl(ctx, t, c, "drain", node, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=3m")
	t.Logf("kubectl drain %s: %s", node, time.Since(start).Round(time.Millisecond))
}

// appPod waits until the StatefulSet's pod app-0 exists again (after an
// eviction) and returns it.
func appPod(ctx context.Context, t *testing.T, c *cluster.Cluster, ns string, old *corev1.Pod) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	if err := c.Wait(ctx, "app-0 made again", 2*time.Minute, func(ctx context.Context) (bool, error) {
		p, err := c.Client.CoreV1().Pods(ns).Get(ctx, "app-0", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		pod = p
		return err == nil && p.UID != old.UID, err
	}); err != nil {
		t.Fatal(err)
	}
	return pod
}

// testDrainShared: `kubectl drain` of the node of a shared-pool Pod: the
// Pod runs again on the other node with its data (the controller's own
// pod may be drained with it, and moves too).
func testDrainShared(t *testing.T, c *cluster.Cluster) {
	ctx := context.Background()
	ns := namespace(t, c, "drain")
	pod, _ := startMover(ctx, t, c, ns)
	from := pod.Spec.NodeName
	drain(ctx, t, c, from)
	again := appPod(ctx, t, c, ns, pod)
	again = running(ctx, t, c, ns, again.Name)
	if again.Spec.NodeName == from {
		t.Fatalf("app-0 runs on the drained node %s", from)
	}
	logLine(ctx, t, c, again, "verified on "+again.Spec.NodeName)
	t.Logf("drained %s: app-0 runs on %s with its data", from, again.Spec.NodeName)
}

// testDrainLocal: `kubectl drain` of the node whose pool holds a Pod's
// volume: the Pod, made again, stays Pending (its volume can be used on
// that node alone) with the scheduler's reason, the volume stays, and once
// the node is back the Pod runs there with its data: nothing lost.
func testDrainLocal(t *testing.T, c *cluster.Cluster) {
	ctx := context.Background()
	ns := namespace(t, c, "drain-local")
	pod, pv := startMover(ctx, t, c, ns)
	from := pod.Spec.NodeName
	drain(ctx, t, c, from)
	again := appPod(ctx, t, c, ns, pod)
	msg := eventOf(ctx, t, c, ns, again.Name, "FailedScheduling", "didn't match PersistentVolume's node affinity")
	// The scheduler's reason names neither the node nor the pool; the
	// sidecar's placement controller (of the drained node: each speaks of
	// its own volumes) does.
	told := eventOf(ctx, t, c, ns, again.Name, placement.ReasonVolumeNodeUnavailable,
		fmt.Sprintf("volume %s of claim %s (pool default, zone %s) can be used only on node %s (cordoned", pv.Name, pv.Spec.ClaimRef.Name, from, from))
	if p, err := c.Client.CoreV1().Pods(ns).Get(ctx, again.Name, metav1.GetOptions{}); err != nil || p.Status.Phase != corev1.PodPending || p.Spec.NodeName != "" {
		t.Fatalf("app-0 after the drain: %v on %q, %v; want Pending, unscheduled", p.Status.Phase, p.Spec.NodeName, err)
	}
	var n cluster.Node
	for _, m := range c.Nodes() {
		if m.Name == from {
			n = m
		}
	}
	if _, err := os.Stat(nodeImage(n, pv)); err != nil {
		t.Fatalf("the volume's image in %s's pool: %v", from, err)
	}
	t.Logf("drained %s: app-0 Pending (volume %s in zone %s): %s; %s", from, pv.Name, zoneOf(pv), msg, told)
	kubectl(ctx, t, c, "uncordon", from)
	again = running(ctx, t, c, ns, again.Name)
	if again.Spec.NodeName != from {
		t.Fatalf("app-0 runs on %s, want %s, where its volume is", again.Spec.NodeName, from)
	}
	logLine(ctx, t, c, again, "verified on "+from)
}
