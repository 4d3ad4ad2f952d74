package multinode

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"

	"github.com/loopvol/loopvol/internal/harness/cluster"
)

// failoverClaims is how many volumes are being attached when the leader
// goes.
const failoverClaims = 50

// testLeaderFailover: the controller runs as two replicas, one per node;
// its leader's Pod is deleted while 50 VolumeAttachments are being
// attached; the replica on the other node takes the Lease over and every
// VolumeAttachment ends attached, once. It reports the gap: from the
// leader's deletion to the next attach, and the longest pause between two
// attaches while some waited.
func testLeaderFailover(t *testing.T, c *cluster.Cluster) {
	ctx := context.Background()
	ns := namespace(t, c, "failover")
	// The shipped StatefulSet prefers its replicas on different nodes.
	scale := func(replicas int32) {
		t.Helper()
		patch := fmt.Sprintf(`{"spec":{"replicas":%d}}`, replicas)
		if _, err := c.Client.AppsV1().StatefulSets(cluster.Namespace).Patch(ctx, "loopvol-controller", types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := c.Wait(ctx, fmt.Sprintf("the controller's %d replicas ready", replicas), 4*time.Minute, func(ctx context.Context) (bool, error) {
			ss, err := c.Client.AppsV1().StatefulSets(cluster.Namespace).Get(ctx, "loopvol-controller", metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			return ss.Status.ObservedGeneration == ss.Generation && ss.Status.ReadyReplicas == replicas && ss.Status.UpdatedReplicas == replicas && ss.Status.Replicas == replicas, nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	scale(2)
	t.Cleanup(func() { scale(1) })
	pods, err := c.Client.CoreV1().Pods(cluster.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=controller"})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != 2 || pods.Items[0].Spec.NodeName == pods.Items[1].Spec.NodeName {
		t.Fatalf("the controller's 2 replicas: %d pods, want one on each node", len(pods.Items))
	}

	class := immediateClass(ctx, t, c)
	for i := range failoverClaims {
		if _, err := c.Client.CoreV1().PersistentVolumeClaims(ns).Create(ctx, cluster.Claim(ns, fmt.Sprintf("vol-%02d", i), class, "16Mi"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	var pvs []string
	if err := c.Wait(ctx, fmt.Sprintf("%d claims Bound", failoverClaims), 3*time.Minute, func(ctx context.Context) (bool, error) {
		list, err := c.Client.CoreV1().PersistentVolumeClaims(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		pvs = pvs[:0]
		for _, pvc := range list.Items {
			if pvc.Status.Phase == corev1.ClaimBound {
				pvs = append(pvs, pvc.Spec.VolumeName)
			}
		}
		return len(pvs) == failoverClaims, nil
	}); err != nil {
		t.Fatal(err)
	}

	// The identity is the leader's host name (its node's: the pods share
	// the node's network) and a UUID.
	leader := leaseHolder(ctx, t, c)
	leaderNode, _, _ := strings.Cut(leader, "_")
	var leaderPod *corev1.Pod
	for i, p := range pods.Items {
		if p.Spec.NodeName == leaderNode {
			leaderPod = &pods.Items[i]
		}
	}
	if leaderPod == nil {
		t.Fatalf("the attacher's Lease holder %q: no controller pod on node %q", leader, leaderNode)
	}
	// The volumes go to the node the leader does not run on, so that the
	// node that goes on serving them is not the one that lost a pod.
	target := other(c, leaderPod.Spec.NodeName)
	t.Logf("leader %s (pod %s on %s); attaching %d volumes to %s", leader, leaderPod.Name, leaderPod.Spec.NodeName, failoverClaims, target)

	attached := watchAttached(ctx, c)
	start := time.Now()
	var names []string
	for i, pv := range pvs {
		va := &storagev1.VolumeAttachment{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("failover-%02d", i)},
			Spec: storagev1.VolumeAttachmentSpec{
				Attacher: cluster.DriverName,
				NodeName: target,
				Source:   storagev1.VolumeAttachmentSource{PersistentVolumeName: ptr.To(pv)},
			},
		}
		if _, err := c.Client.StorageV1().VolumeAttachments().Create(ctx, va, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		names = append(names, va.Name)
		if i == failoverClaims/2 {
			// Its node cordoned first, so that the StatefulSet's new
			// pod cannot come back there (the replicas' host ports
			// keep it off the other node): the standby has to take
			// over, as when the leader's node is lost.
			kubectl(ctx, t, c, "cordon", leaderPod.Spec.NodeName)
			t.Cleanup(func() { _, _ = c.Kubectl(context.Background(), "uncordon", leaderPod.Spec.NodeName) })
			if err := c.Client.CoreV1().Pods(cluster.Namespace).Delete(ctx, leaderPod.Name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Cleanup(func() {
		for _, n := range names {
			_ = c.Client.StorageV1().VolumeAttachments().Delete(context.Background(), n, metav1.DeleteOptions{})
		}
	})
	deleted := time.Since(start)
	var newLeader string
	var takeover time.Duration
	if err := c.Wait(ctx, "every VolumeAttachment attached", 3*time.Minute, func(ctx context.Context) (bool, error) {
		newLeader = leaseHolder(ctx, t, c)
		if n, _, _ := strings.Cut(newLeader, "_"); takeover == 0 && n != "" && n != leaderNode {
			takeover = time.Since(start) - deleted
		}
		return attached.count() == failoverClaims && takeover != 0, nil
	}); err != nil {
		t.Fatal(err)
	}
	if newNode, _, _ := strings.Cut(newLeader, "_"); newLeader == leader || newNode == leaderNode {
		t.Fatalf("the Lease is %s's after the leader %s was deleted: want the standby's on the other node", newLeader, leader)
	}
	for _, n := range names {
		va, err := c.Client.StorageV1().VolumeAttachments().Get(ctx, n, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if !va.Status.Attached || va.Status.AttachError != nil {
			t.Fatalf("VolumeAttachment %s: attached %t, error %v", n, va.Status.Attached, va.Status.AttachError)
		}
	}
	times := attached.times()
	var next, pause time.Duration
	for i, at := range times {
		d := at.Sub(start)
		if next == 0 && d > deleted {
			next = d - deleted
		}
		if i > 0 {
			pause = max(pause, at.Sub(times[i-1]))
		}
	}
	if flips := attached.flips(); flips > 0 {
		t.Errorf("%d VolumeAttachments went from attached back to not attached: each must be attached once", flips)
	}
	t.Logf("leader failover during %d attaches: %s took the Lease over from %s %s after the delete; the next attach came %s after the delete, the longest pause between two attaches %s, all attached %s after the first create",
		failoverClaims, newLeader, leader, takeover.Round(time.Millisecond), next.Round(time.Millisecond), pause.Round(time.Millisecond), times[len(times)-1].Sub(start).Round(time.Millisecond))

	for _, n := range names {
		if err := c.Client.StorageV1().VolumeAttachments().Delete(ctx, n, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
	}
	if err := c.Wait(ctx, "the VolumeAttachments detached and gone", 3*time.Minute, func(ctx context.Context) (bool, error) {
		vas, err := c.Client.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		return !slices.ContainsFunc(vas.Items, func(va storagev1.VolumeAttachment) bool { return strings.HasPrefix(va.Name, "failover-") }), nil
	}); err != nil {
		t.Fatal(err)
	}
}

// leaseHolder is the holder of the attacher's Lease (external-attacher's
// name, which the sidecar keeps).
func leaseHolder(ctx context.Context, t *testing.T, c *cluster.Cluster) string {
	t.Helper()
	leases, err := c.Client.CoordinationV1().Leases(cluster.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range leases.Items {
		if strings.HasPrefix(l.Name, "external-attacher-leader-") && l.Spec.HolderIdentity != nil {
			return *l.Spec.HolderIdentity
		}
	}
	return ""
}

// attachWatch records when each VolumeAttachment was first seen attached,
// and how often one went back.
type attachWatch struct {
	mu    sync.Mutex
	first map[string]time.Time
	state map[string]bool
	back  int
}

func watchAttached(ctx context.Context, c *cluster.Cluster) *attachWatch {
	a := &attachWatch{first: map[string]time.Time{}, state: map[string]bool{}}
	ctx, cancel := context.WithCancel(ctx)
	w, err := c.Client.StorageV1().VolumeAttachments().Watch(ctx, metav1.ListOptions{})
	if err != nil {
		cancel()
		return a
	}
	go func() {
		defer cancel()
		for ev := range w.ResultChan() {
			va, ok := ev.Object.(*storagev1.VolumeAttachment)
			if !ok || ev.Type == watch.Deleted || !strings.HasPrefix(va.Name, "failover-") {
				continue
			}
			a.mu.Lock()
			if va.Status.Attached {
				if _, seen := a.first[va.Name]; !seen {
					a.first[va.Name] = time.Now()
				}
			} else if a.state[va.Name] && va.DeletionTimestamp == nil {
				a.back++
			}
			a.state[va.Name] = va.Status.Attached
			a.mu.Unlock()
		}
	}()
	return a
}

func (a *attachWatch) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.first)
}

func (a *attachWatch) flips() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.back
}

// times are the first-attached times, in order.
func (a *attachWatch) times() []time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []time.Time
	for _, t := range a.first {
		out = append(out, t)
	}
	slices.SortFunc(out, func(x, y time.Time) int { return x.Compare(y) })
	return out
}

// immediateClass is the shipped class "loopvol" with Immediate binding,
// deleted when the test ends.
func immediateClass(ctx context.Context, t *testing.T, c *cluster.Cluster) string {
	t.Helper()
	sc, err := c.Client.StorageV1().StorageClasses().Get(ctx, "loopvol", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	class := sc.DeepCopy()
	class.ObjectMeta = metav1.ObjectMeta{Name: "loopvol-immediate"}
	class.VolumeBindingMode = ptr.To(storagev1.VolumeBindingImmediate)
	if _, err := c.Client.StorageV1().StorageClasses().Create(ctx, class, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Client.StorageV1().StorageClasses().Delete(context.Background(), class.Name, metav1.DeleteOptions{})
	})
	return class.Name
}
