package multinode

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/loopvol/loopvol/internal/harness/cluster"
	"github.com/loopvol/loopvol/internal/harness/cluster/clustertest"
	"github.com/loopvol/loopvol/pkg/volspec"
)

// TestDistributed runs the scenarios of overlays/distributed: a controller
// per node (--node-deployment) and a pool per node on a disk of its own,
// each node its own zone.
func TestDistributed(t *testing.T) {
	c, _ := up(t, true, "distributed")
	t.Run("CapacityPerNode", func(t *testing.T) { testCapacityPerNode(t, c) })
	t.Run("Doctor", func(t *testing.T) { testDoctorDistributed(t, c) })
	t.Run("MadeWhereScheduled", func(t *testing.T) { testMadeWhereScheduled(t, c) })
	t.Run("ScheduledByCapacity", func(t *testing.T) { testScheduledByCapacity(t, c) })
	t.Run("DrainLocal", func(t *testing.T) { testDrainLocal(t, c) })
	// Last: it restarts the node plugins.
	t.Run("VolumeLimit", func(t *testing.T) { testVolumeLimit(t, c) })
}

// capacities are the CSIStorageCapacity objects of the class loopvol, by
// the zone (node) they name.
func capacities(ctx context.Context, c *cluster.Cluster) (map[string]storagev1.CSIStorageCapacity, error) {
	list, err := c.Client.StorageV1().CSIStorageCapacities(cluster.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	out := map[string]storagev1.CSIStorageCapacity{}
	for _, cap := range list.Items {
		if cap.StorageClassName != "loopvol" || cap.NodeTopology == nil {
			continue
		}
		out[cap.NodeTopology.MatchLabels[volspec.TopologyKey]] = cap
	}
	return out, nil
}

// testCapacityPerNode: each node's controller publishes the capacity of its
// own pool, for its own zone, and each about its disk's size.
func testCapacityPerNode(t *testing.T, c *cluster.Cluster) {
	ctx := context.Background()
	var caps map[string]storagev1.CSIStorageCapacity
	if err := c.Wait(ctx, "a CSIStorageCapacity per node", 2*time.Minute, func(ctx context.Context) (bool, error) {
		var err error
		caps, err = capacities(ctx, c)
		if err != nil {
			return false, err
		}
		for _, n := range c.Nodes() {
			if cap, ok := caps[n.Name]; !ok || cap.Capacity == nil || cap.Capacity.IsZero() {
				return false, nil
			}
		}
		return len(caps) == len(c.Nodes()), nil
	}); err != nil {
		t.Fatalf("%v: %d objects", err, len(caps))
	}
	for _, n := range c.Nodes() {
		cap := caps[n.Name]
		if got := cap.Capacity.Value(); got > nodeDisk || got < nodeDisk/2 {
			t.Errorf("node %s's capacity %s: want about its disk's %d MiB", n.Name, cap.Capacity, nodeDisk>>20)
		}
		t.Logf("node %s: CSIStorageCapacity %s, %s for zone %s", n.Name, cap.Name, cap.Capacity, n.Name)
	}
}

// testMadeWhereScheduled: a WaitForFirstConsumer claim's volume is made in
// the pool of the node its Pod was scheduled to, and nowhere else.
func testMadeWhereScheduled(t *testing.T, c *cluster.Cluster) {
	ctx := context.Background()
	ns := namespace(t, c, "where-scheduled")
	for i, n := range c.Nodes() {
		claim := fmt.Sprintf("data-%d", i)
		if _, err := c.Client.CoreV1().PersistentVolumeClaims(ns).Create(ctx, cluster.Claim(ns, claim, "loopvol", "32Mi"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		pod := onNode(cluster.VolumePod(ns, claim, claim, "echo up && busybox sleep 1000000 & wait"), n.Name)
		if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for i, n := range c.Nodes() {
		claim := fmt.Sprintf("data-%d", i)
		running(ctx, t, c, ns, claim)
		pv := volumeOf(ctx, t, c, ns, claim)
		if zone := zoneOf(pv); zone != n.Name {
			t.Fatalf("claim %s of a pod on %s: volume in zone %q", claim, n.Name, zone)
		}
		for _, m := range c.Nodes() {
			_, err := os.Stat(nodeImage(m, pv))
			if exists := err == nil; exists != (m.Name == n.Name) {
				t.Fatalf("claim %s of a pod on %s: its image in %s's pool: %t (%v)", claim, n.Name, m.Name, exists, err)
			}
		}
		t.Logf("claim %s: made in %s's pool (zone %s)", claim, n.Name, zoneOf(pv))
	}
}

// zoneOf is the zone the PV's node affinity names.
func zoneOf(pv *corev1.PersistentVolume) string {
	if pv.Spec.NodeAffinity == nil || pv.Spec.NodeAffinity.Required == nil {
		return ""
	}
	for _, term := range pv.Spec.NodeAffinity.Required.NodeSelectorTerms {
		for _, e := range term.MatchExpressions {
			if e.Key == volspec.TopologyKey && len(e.Values) == 1 {
				return e.Values[0]
			}
		}
	}
	return ""
}

// nodeImage is the host path of pv's image in node n's own pool.
func nodeImage(n cluster.Node, pv *corev1.PersistentVolume) string {
	_, hash, _ := strings.Cut(pv.Spec.CSI.VolumeHandle, ".")
	return filepath.Join(n.StateDir, "pools", "default", "volumes", hash+".img")
}

// testScheduledByCapacity: node A's pool filled, a Pod that prefers A is
// scheduled to B; one that may run only on A stays Pending with the
// scheduler's "did not have enough free storage", which only the
// CSIStorageCapacity check (the VolumeBinding plugin, with the CSIDriver's
// storageCapacity: true) gives: that is how the test knows the scheduler
// used it.
func testScheduledByCapacity(t *testing.T, c *cluster.Cluster) {
	ctx := context.Background()
	ns := namespace(t, c, "by-capacity")
	nodes := c.Nodes()
	a, b := nodes[0], nodes[1]
	caps, err := capacities(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	// All but 64 MiB of A.
	fill := caps[a.Name].Capacity.Value() - 64<<20
	if _, err := c.Client.CoreV1().PersistentVolumeClaims(ns).Create(ctx, cluster.Claim(ns, "fill", "loopvol", resource.NewQuantity(fill, resource.BinarySI).String()), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	filler := onNode(cluster.VolumePod(ns, "fill", "fill", "busybox sleep 1000000 & wait"), a.Name)
	if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, filler, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	running(ctx, t, c, ns, "fill")
	if err := c.Wait(ctx, "node "+a.Name+"'s CSIStorageCapacity down to under 128 MiB", 2*time.Minute, func(ctx context.Context) (bool, error) {
		caps, err := capacities(ctx, c)
		cap, ok := caps[a.Name]
		return ok && cap.Capacity != nil && cap.Capacity.Value() < 128<<20, err
	}); err != nil {
		t.Fatal(err)
	}

	// Prefers A, which has no room: runs on B.
	if _, err := c.Client.CoreV1().PersistentVolumeClaims(ns).Create(ctx, cluster.Claim(ns, "next", "loopvol", "128Mi"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	next := cluster.VolumePod(ns, "next", "next", "busybox sleep 1000000 & wait")
	next.Spec.Affinity = preferNode(a.Name)
	if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, next, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if pod := running(ctx, t, c, ns, "next"); pod.Spec.NodeName != b.Name {
		t.Fatalf("pod next (prefers %s, whose pool is full) runs on %s, want %s", a.Name, pod.Spec.NodeName, b.Name)
	}
	if zone := zoneOf(volumeOf(ctx, t, c, ns, "next")); zone != b.Name {
		t.Fatalf("claim next: volume in zone %q, want %s", zone, b.Name)
	}

	// May run only on A: Pending, and the scheduler says why.
	if _, err := c.Client.CoreV1().PersistentVolumeClaims(ns).Create(ctx, cluster.Claim(ns, "stuck", "loopvol", "128Mi"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, onNode(cluster.VolumePod(ns, "stuck", "stuck", "busybox sleep 1000000 & wait"), a.Name), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	msg := eventOf(ctx, t, c, ns, "stuck", "FailedScheduling", "enough free storage")
	t.Logf("pod next (prefers %s) scheduled to %s; pod stuck (only %s) Pending: %s", a.Name, b.Name, a.Name, msg)
}

// eventOf waits for an event of the object name with reason whose message
// has want, and returns the message.
func eventOf(ctx context.Context, t *testing.T, c *cluster.Cluster, ns, name, reason, want string) string {
	t.Helper()
	var msg string
	if err := c.Wait(ctx, fmt.Sprintf("a %s event of %s with %q", reason, name, want), 2*time.Minute, func(ctx context.Context) (bool, error) {
		evs, err := c.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
		if err != nil {
			return false, err
		}
		for _, e := range evs.Items {
			if e.Reason == reason && strings.Contains(e.Message, want) {
				msg = e.Message
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		evs, _ := c.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
		for _, e := range evs.Items {
			t.Logf("event %s %s: %s %s", e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, e.Message)
		}
		t.Fatal(err)
	}
	return msg
}

// testVolumeLimit runs last, and leaves the node plugins restarted with
// --max-volumes-per-node=1. With node-1 at its one volume, a Pod that
// prefers node-1 is scheduled to node-2 (the scheduler's NodeVolumeLimits,
// from each CSINode's allocatable count that kubelet wrote).
func testVolumeLimit(t *testing.T, c *cluster.Cluster) {
	ctx := context.Background()
	args, err := clustertest.DriverArgs(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	// Not restored: the cluster goes after this test.
	if err := clustertest.SetDriverArgs(ctx, c, append(slices.Clone(args), "--max-volumes-per-node=1"), 1); err != nil {
		t.Fatal(err)
	}
	ns := namespace(t, c, "volume-limit")
	nodes := c.Nodes()
	a, b := nodes[0], nodes[1]
	if _, err := c.Client.CoreV1().PersistentVolumeClaims(ns).Create(ctx, cluster.Claim(ns, "first", "loopvol", "16Mi"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, onNode(cluster.VolumePod(ns, "first", "first", "busybox sleep 1000000 & wait"), a.Name), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	running(ctx, t, c, ns, "first")
	if _, err := c.Client.CoreV1().PersistentVolumeClaims(ns).Create(ctx, cluster.Claim(ns, "next", "loopvol", "16Mi"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	next := cluster.VolumePod(ns, "next", "next", "busybox sleep 1000000 & wait")
	next.Spec.Affinity = preferNode(a.Name)
	if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, next, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if pod := running(ctx, t, c, ns, "next"); pod.Spec.NodeName != b.Name {
		t.Fatalf("pod next (prefers %s, at its one volume) runs on %s, want %s", a.Name, pod.Spec.NodeName, b.Name)
	}
	t.Logf("node %s at --max-volumes-per-node=1: pod next (prefers %s) runs on %s", a.Name, a.Name, b.Name)
}

// preferNode is an affinity that prefers the node name.
func preferNode(name string) *corev1.Affinity {
	return &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		PreferredDuringSchedulingIgnoredDuringExecution: []corev1.PreferredSchedulingTerm{{
			Weight:     100,
			Preference: corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{name}}}},
		}},
	}}
}

// testDoctorDistributed: kubectl loopvol doctor passes on the distributed
// layout, judging it by what runs there: the controllers' rights are the
// node plugin's account's (the controller's account is bound to nothing),
// and the webhook, left out with the central sidecar, is not deployed.
func testDoctorDistributed(t *testing.T, c *cluster.Cluster) {
	p := clustertest.NewPlugin(t, c)
	checks, code := p.Doctor()
	for _, ch := range checks {
		if ch.Result != "pass" {
			t.Errorf("doctor on the distributed layout: %s is %s: %s", ch.Name, ch.Result, ch.Detail)
		}
	}
	if code != 0 {
		t.Errorf("doctor on the distributed layout exited %d", code)
	}
	if ch := checks["rbac"]; !strings.Contains(ch.Detail, "loopvol-node (") || strings.Contains(ch.Detail, "loopvol-controller") {
		t.Errorf("doctor's rbac on the distributed layout: %q, want the node plugin's account judged, not the controller's", ch.Detail)
	}
	if ch := checks["webhook"]; !strings.Contains(ch.Detail, "not deployed") {
		t.Errorf("doctor's webhook on the distributed layout: %q, want it not deployed", ch.Detail)
	}
	p.Table("doctor")
}
