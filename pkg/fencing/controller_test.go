package fencing

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	"github.com/loopvol/loopvol/internal/kube"
	"github.com/loopvol/loopvol/pkg/fenceapi"
	"github.com/loopvol/loopvol/pkg/heartbeat"
)

const (
	driver    = "loopvol.csi.io"
	namespace = "loopvol"
)

// fencer is a driver whose FenceNode records its calls and answers one
// fenced volume.
type fencer struct {
	mu    sync.Mutex
	calls []fenceapi.FenceNodeRequest
}

func (f *fencer) FenceNode(_ context.Context, req *fenceapi.FenceNodeRequest) (*fenceapi.FenceNodeResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, *req)
	return &fenceapi.FenceNodeResponse{Volumes: []fenceapi.FencedVolume{
		{VolumeID: "default.0123", Pool: "default", Fenced: true, Method: "reflink", Seconds: 0.004},
		{VolumeID: "local.4567", Pool: "local", Reason: "pool local is local"},
	}}, nil
}

func (f *fencer) called() []fenceapi.FenceNodeRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

func node(name string, ready corev1.ConditionStatus) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Status:     corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: ready}}},
	}
}

func lease(nodeID string, incarnation time.Time) *coordinationv1.Lease {
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{
			Name: heartbeat.LeaseName(driver, nodeID), Namespace: namespace,
			Labels:      map[string]string{heartbeat.ComponentLabel: heartbeat.ComponentHeartbeat, heartbeat.DriverLabel: driver},
			Annotations: map[string]string{heartbeat.IncarnationAnnotation: incarnation.Format(time.RFC3339Nano)},
		},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(nodeID), RenewTime: &metav1.MicroTime{Time: time.Now()}, LeaseDurationSeconds: ptr.To[int32](1)},
	}
}

// TestFencesAStaleNotReadyNode: a node whose heartbeat is stale is fenced
// only once its kubelet is not Ready either; the out-of-service taint goes
// on after the fence and comes off once the node renews again and is
// Ready; the claims of the volumes hear what became of them.
func TestFencesAStaleNotReadyNode(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	incarnation := time.Now().Add(-time.Hour).UTC().Truncate(time.Microsecond)
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "pv-1"},
		Spec: corev1.PersistentVolumeSpec{
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: driver, VolumeHandle: "default.0123"}},
			ClaimRef:               &corev1.ObjectReference{Namespace: "app", Name: "data-0"},
		},
	}
	client := fake.NewClientset(node("node-b", corev1.ConditionTrue), lease("node-b", incarnation), pv)
	informers := kube.NewInformers(client, 0)
	events := record.NewFakeRecorder(100)
	f := &fencer{}
	c, err := New(Config{
		DriverName: driver, Client: client, Heartbeats: client, Informers: informers, Fencer: f,
		Namespace: namespace, FencingPeriod: 400 * time.Millisecond, ProbeInterval: 100 * time.Millisecond,
		TaintOutOfService: true, FenceByCopy: true, Recorder: events,
		RetryIntervalStart: 10 * time.Millisecond, RetryIntervalMax: 100 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	informers.Start(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		if err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) { return cond(), nil }); err != nil {
			t.Fatalf("waiting for %s: %v", what, err)
		}
	}
	taints := func() []corev1.Taint {
		n, err := client.CoreV1().Nodes().Get(ctx, "node-b", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return n.Spec.Taints
	}
	reasons := map[string]bool{}
	drain := func() {
		for {
			select {
			case e := <-events.Events:
				t.Logf("event: %s", e)
				for _, r := range []string{ReasonOutOfServiceKept, ReasonWaitingNotReady, ReasonNodeFenced, ReasonVolumeFenced, ReasonVolumeNotFenced, ReasonOutOfServiceOn, ReasonOutOfServiceOff, ReasonNodeBack} {
					if strings.Contains(e, " "+r+" ") {
						reasons[r] = true
					}
				}
			default:
				return
			}
		}
	}

	// Stale, but kubelet says Ready: told, not fenced.
	waitFor("the Event that the node waits for NotReady", func() bool { drain(); return reasons[ReasonWaitingNotReady] })
	if calls := f.called(); len(calls) != 0 {
		t.Fatalf("fenced a node whose kubelet is Ready: %+v", calls)
	}
	// NotReady: fenced through the incarnation its Lease said, then tainted.
	n := node("node-b", corev1.ConditionUnknown)
	if _, err := client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor("the fence", func() bool { return len(f.called()) > 0 })
	if got := f.called()[0]; got.NodeID != "node-b" || !got.Through.Equal(incarnation) || !got.AllowCopy {
		t.Errorf("FenceNode(%+v), want node-b through %s with copies allowed", got, incarnation)
	}
	waitFor("the out-of-service taint", func() bool {
		return slices.ContainsFunc(taints(), func(t corev1.Taint) bool {
			return t.Key == TaintOutOfService && t.Value == driver && t.Effect == corev1.TaintEffectNoExecute
		})
	})
	waitFor("the fence's Events", func() bool {
		drain()
		return reasons[ReasonNodeFenced] && reasons[ReasonVolumeFenced] && reasons[ReasonVolumeNotFenced] && reasons[ReasonOutOfServiceOn]
	})

	// Back: renewing again, and Ready again, still holding a fenced
	// volume: the taint stays; clean: the taint comes off.
	var held atomic.Int64
	held.Store(1)
	renewing := make(chan struct{})
	go func() {
		defer close(renewing)
		for ctx.Err() == nil {
			l := lease("node-b", incarnation)
			l.Annotations[heartbeat.FencedVolumesAnnotation] = strconv.Itoa(int(held.Load()))
			if _, err := client.CoordinationV1().Leases(namespace).Update(ctx, l, metav1.UpdateOptions{}); err != nil && ctx.Err() == nil {
				t.Error(err)
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	defer func() { cancel(); <-renewing }()
	waitFor("the node back", func() bool { drain(); return reasons[ReasonNodeBack] })
	if slices.ContainsFunc(taints(), func(t corev1.Taint) bool { return t.Key == TaintOutOfService }) == false {
		t.Fatal("the taint came off while kubelet was not Ready yet")
	}
	n, _ = client.CoreV1().Nodes().Get(ctx, "node-b", metav1.GetOptions{})
	n.Status.Conditions[0].Status = corev1.ConditionTrue
	if _, err := client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor("the Event that the taint stays while the node holds a fenced volume", func() bool { drain(); return reasons[ReasonOutOfServiceKept] })
	time.Sleep(300 * time.Millisecond) // a few renewals and rechecks
	if !slices.ContainsFunc(taints(), func(t corev1.Taint) bool { return t.Key == TaintOutOfService }) {
		t.Fatal("the taint came off while the node still held a fenced volume")
	}
	held.Store(0)
	waitFor("the taint removed", func() bool {
		return !slices.ContainsFunc(taints(), func(t corev1.Taint) bool { return t.Key == TaintOutOfService })
	})
	waitFor("the Event that the taint is off", func() bool { drain(); return reasons[ReasonOutOfServiceOff] })
}

// TestOperatorTaintIsLeft: an out-of-service taint that loopvol did not
// put there is never removed by it.
func TestOperatorTaintIsLeft(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	n := node("node-b", corev1.ConditionTrue)
	n.Spec.Taints = []corev1.Taint{{Key: TaintOutOfService, Value: "nodeshutdown", Effect: corev1.TaintEffectNoExecute}}
	client := fake.NewClientset(n)
	c := &Controller{cfg: Config{DriverName: driver, Client: client}, recorder: record.NewFakeRecorder(10), metrics: newMetrics(nil)}
	if err := c.setTaint(ctx, n, false); err != nil {
		t.Fatal(err)
	}
	if err := c.setTaint(ctx, n, true); err != nil {
		t.Fatal(err)
	}
	got, _ := client.CoreV1().Nodes().Get(ctx, "node-b", metav1.GetOptions{})
	if len(got.Spec.Taints) != 1 || got.Spec.Taints[0].Value != "nodeshutdown" {
		t.Errorf("taints = %+v, want the operator's alone", got.Spec.Taints)
	}
}
