package attach

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	k8stesting "k8s.io/client-go/testing"

	"github.com/loopvol/loopvol/internal/kube/kubetest"
)

// countCalls counts the CSI calls of each method.
func countCalls(calls []csiCall) map[string]int {
	n := map[string]int{}
	for _, c := range calls {
		n[c.Method]++
	}
	return n
}

// countWrites counts the API writes by verb/resource/subresource.
func countWrites(actions []apiAction) map[string]int {
	n := map[string]int{}
	for _, a := range actions {
		if a.Verb == "get" {
			continue
		}
		key := a.Verb + " " + a.Resource
		if a.Subresource != "" {
			key += "/" + a.Subresource
		}
		n[key]++
	}
	return n
}

func TestAttachDetachFlowPublishesOnceWithFourWrites(t *testing.T) {
	const n = 20
	objs := []runtime.Object{csiNodeObj(testNode, testNodeID)}
	for i := range n {
		objs = append(objs, pvObj(fmt.Sprintf("pv%d", i), fmt.Sprintf("pool.vol%d", i)))
	}
	f := newFixture(t, allCaps, objs...)
	f.csi.publishCtx = map[string]string{"devicePath": "/dev/loop0"}

	// kube-controller-manager creates the VolumeAttachments.
	for i := range n {
		if err := f.Client.Tracker().Add(vaObj(fmt.Sprintf("va%d", i), fmt.Sprintf("pv%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	f.observe()
	f.drain()
	for i := range n {
		if va := f.va(fmt.Sprintf("va%d", i)); !va.Status.Attached {
			t.Errorf("va%d not attached: %+v", i, va.Status)
		}
	}
	kubetest.Diff(t, "CSI calls after attach", map[string]int{"ControllerPublishVolume": n}, countCalls(f.csi.TakeCalls()))
	attachWrites := countWrites(f.actions())
	kubetest.Diff(t, "API writes of the attaches", map[string]int{
		"patch persistentvolumes":        n, // PV finalizer
		"patch volumeattachments":        n, // VA finalizer + node ID
		"patch volumeattachments/status": n, // attached
	}, attachWrites)

	// A resync queues everything again: nothing is published again.
	for _, va := range mustList(t, f) {
		f.c.vaUpdated(va, va)
	}
	f.drain()
	kubetest.Diff(t, "CSI calls after a resync", map[string]int{}, countCalls(f.csi.TakeCalls()))
	kubetest.Diff(t, "API writes after a resync", map[string]int{}, countWrites(f.actions()))

	// kube-controller-manager deletes them (the API server sets the
	// deletionTimestamp; the finalizer holds them).
	for i := range n {
		va := f.va(fmt.Sprintf("va%d", i))
		deleting(va)
		if err := f.Client.Tracker().Update(vaGVR, va, ""); err != nil {
			t.Fatal(err)
		}
	}
	f.observe()
	if f.c.attachQ.Q.Len() != 0 || f.c.detachQ.Q.Len() != n {
		t.Fatalf("queues after deletion: attach %d, detach %d; want 0, %d", f.c.attachQ.Q.Len(), f.c.detachQ.Q.Len(), n)
	}
	f.drain()
	kubetest.Diff(t, "CSI calls after detach", map[string]int{"ControllerUnpublishVolume": n}, countCalls(f.csi.TakeCalls()))
	kubetest.Diff(t, "API writes of the detaches", map[string]int{"patch volumeattachments": n}, countWrites(f.actions()))
	for i := range n {
		if fins := f.va(fmt.Sprintf("va%d", i)).Finalizers; len(fins) != 0 {
			t.Errorf("va%d keeps finalizers %v", i, fins)
		}
	}
	if d, _ := f.c.pending.stats(opAttach); d != 0 {
		t.Errorf("%d attaches still pending", d)
	}
	if d, _ := f.c.pending.stats(opDetach); d != 0 {
		t.Errorf("%d detaches still pending", d)
	}
}

var vaGVR = storagev1.SchemeGroupVersion.WithResource("volumeattachments")

func mustList(t *testing.T, f *fixture) []*storagev1.VolumeAttachment {
	t.Helper()
	out, err := f.c.vaLister.List(labels.Everything())
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestOwnStatusWriteDoesNotResetBackoff(t *testing.T) {
	for _, tc := range []struct {
		name      string
		err       error
		wantDelay time.Duration
	}{
		{name: "transient error → first backoff step", err: status.Error(codes.Unavailable, "busy"), wantDelay: time.Second},
		{name: "final error → at least 32 initial intervals", err: status.Error(codes.NotFound, "no such volume"), wantDelay: 32 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, allCaps,
				vaObj("va1", "pv1", withFinalizers(finalizer), withNodeIDAnnotation(testNodeID)),
				pvObj("pv1", "pool.vol1", pvFinalizers(finalizer)), csiNodeObj(testNode, testNodeID))
			f.csi.publishErr = tc.err
			f.c.vaAdded(f.va("va1"))

			err := f.c.syncVA(f.Ctx, "va1")
			if status.Code(err) != status.Code(tc.err) {
				t.Fatalf("syncVA = %v, want %v", err, tc.err)
			}
			if got := f.handle(f.c.attachQ, "va1", err); got != tc.wantDelay {
				t.Errorf("retry delay = %s, want %s", got, tc.wantDelay)
			}
			// The attachError write comes back as an update event.
			f.observe()
			if n := f.c.attachQ.Q.Len(); n != 1 { // the original Add, not yet taken
				t.Errorf("attach queue holds %d items, want only the original one", n)
			}
			key, _ := f.c.attachQ.Q.Get()
			f.c.attachQ.Q.Done(key)
			if n := f.c.attachQ.Q.Len(); n != 0 {
				t.Errorf("our own status write queued the object again (%d items)", n)
			}
			if n := f.c.attachQ.Failures("va1"); n != 1 {
				t.Errorf("failures counted = %d, want 1", n)
			}
		})
	}
}

func TestHandleErrBackoffGrowsAndResets(t *testing.T) {
	f := newFixture(t, allCaps)
	transient := status.Error(codes.DeadlineExceeded, "slow")
	var got []time.Duration
	for range 4 {
		got = append(got, f.handle(f.c.attachQ, "va1", transient))
	}
	got = append(got, f.handle(f.c.attachQ, "va1", permanent(errors.New("bad spec"))))
	got = append(got, f.handle(f.c.attachQ, "va1", nil))
	got = append(got, f.handle(f.c.attachQ, "va1", transient))
	kubetest.Diff(t, "retry delays", []time.Duration{
		time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, // doubling
		32 * time.Second, // final: the floor
		0,                // success forgets
		time.Second,      // starts over
	}, got)
}

func TestShouldEnqueueVAChange(t *testing.T) {
	base := vaObj("va1", "pv1", withRV("10"))
	tests := []struct {
		name   string
		change func(*storagev1.VolumeAttachment)
		want   bool
	}{
		{name: "resync (same resourceVersion) → queued", change: func(*storagev1.VolumeAttachment) {}, want: true},
		{name: "status attached written → not queued", change: func(va *storagev1.VolumeAttachment) {
			va.ResourceVersion = "11"
			va.Status.Attached = true
			va.Status.AttachmentMetadata = map[string]string{"a": "b"}
		}, want: false},
		{name: "attachError written → not queued", change: func(va *storagev1.VolumeAttachment) {
			va.ResourceVersion = "11"
			va.Status.AttachError = &storagev1.VolumeError{Message: "x"}
		}, want: false},
		{name: "our finalizer and node ID written → not queued", change: func(va *storagev1.VolumeAttachment) {
			va.ResourceVersion = "11"
			withFinalizers(finalizer)(va)
			withNodeIDAnnotation(testNodeID)(va)
			va.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "attacher"}}
		}, want: false},
		{name: "deletion started → queued", change: func(va *storagev1.VolumeAttachment) {
			va.ResourceVersion = "11"
			deleting(va)
		}, want: true},
		{name: "spec changed → queued", change: func(va *storagev1.VolumeAttachment) {
			va.ResourceVersion = "11"
			va.Spec.NodeName = "node-2"
		}, want: true},
		{name: "recreated with the same name → queued", change: func(va *storagev1.VolumeAttachment) {
			va.ResourceVersion = "11"
			va.UID = "other"
		}, want: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			va := base.DeepCopy()
			tc.change(va)
			if got := shouldEnqueueVAChange(base, va); got != tc.want {
				t.Errorf("shouldEnqueueVAChange = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestEnqueueRoutesAttachAndDetach(t *testing.T) {
	f := newFixture(t, allCaps)
	f.c.vaAdded(vaObj("live", "pv1"))
	f.c.vaAdded(vaObj("gone", "pv2", deleting, withFinalizers(finalizer)))
	f.c.vaAdded(vaObj("other", "pv3", func(va *storagev1.VolumeAttachment) { va.Spec.Attacher = "other.csi.io" }))
	if f.c.attachQ.Q.Len() != 1 || f.c.detachQ.Q.Len() != 1 {
		t.Fatalf("attach queue %d, detach queue %d; want 1 and 1", f.c.attachQ.Q.Len(), f.c.detachQ.Q.Len())
	}
	a, _ := f.c.attachQ.Q.Get()
	d, _ := f.c.detachQ.Q.Get()
	if a != "live" || d != "gone" {
		t.Errorf("attach queue had %q, detach queue %q", a, d)
	}
}

func TestOneWorkerPerVolumeAttachmentAcrossQueues(t *testing.T) {
	f := newFixture(t, allCaps,
		vaObj("va1", "pv1", deleting, withFinalizers(finalizer), withNodeIDAnnotation(testNodeID), attached(nil)),
		pvObj("pv1", "pool.vol1", pvFinalizers(finalizer)))
	// An attach worker holds va1 (it was deleted while being attached).
	if !f.c.locks.tryLock("va1", f.c.attachQ.Q) {
		t.Fatal("tryLock failed on a free key")
	}
	f.c.detachQ.Q.Add("va1")
	f.c.processNextVA(f.Ctx, f.c.detachQ)
	kubetest.Diff(t, "CSI calls while another worker holds va1", nil, f.csi.TakeCalls())
	if n := f.c.detachQ.Q.Len(); n != 0 {
		t.Fatalf("detach queue holds %d items while va1 is busy", n)
	}
	f.c.locks.unlock("va1")
	if n := f.c.detachQ.Q.Len(); n != 1 {
		t.Fatalf("va1 not handed back to the detach queue (%d items)", n)
	}
	f.c.processNextVA(f.Ctx, f.c.detachQ)
	kubetest.Diff(t, "CSI calls", map[string]int{"ControllerUnpublishVolume": 1}, countCalls(f.csi.TakeCalls()))
}

func TestDetachWakesAttachesBlockedOnTheSameVolumeOrNode(t *testing.T) {
	f := newFixture(t, allCaps,
		vaObj("old", "pv1", deleting, withFinalizers(finalizer), withNodeIDAnnotation(testNodeID), attached(nil)),
		vaObj("same-volume", "pv1", onNode("node-2"), withAttachError(int32(codes.FailedPrecondition))),
		vaObj("same-node", "pv9", withAttachError(int32(codes.ResourceExhausted))),
		vaObj("healthy", "pv8", attached(nil)),
		vaObj("elsewhere", "pv7", onNode("node-3"), withAttachError(int32(codes.ResourceExhausted))),
		pvObj("pv1", "pool.vol1", pvFinalizers(finalizer)))
	if err := f.c.syncVA(f.Ctx, "old"); err != nil {
		t.Fatalf("syncVA: %v", err)
	}
	var woken []string
	for f.c.attachQ.Q.Len() > 0 {
		k, _ := f.c.attachQ.Q.Get()
		f.c.attachQ.Q.Done(k)
		woken = append(woken, k)
	}
	kubetest.Diff(t, "woken attaches", []string{"same-volume", "same-node"}, woken)
}

func TestCSINodeRegistrationWakesWaitingAttaches(t *testing.T) {
	f := newFixture(t, allCaps,
		vaObj("waiting", "pv1", withAttachError(0)),
		vaObj("done", "pv2", attached(nil)))
	f.c.csiNodeChanged(nil, csiNodeObj(testNode, testNodeID))
	if n := f.c.attachQ.Q.Len(); n != 1 {
		t.Fatalf("attach queue holds %d items, want the waiting one", n)
	}
	// The same ID again (a resync) wakes nobody.
	k, _ := f.c.attachQ.Q.Get()
	f.c.attachQ.Q.Done(k)
	f.c.csiNodeChanged(csiNodeObj(testNode, testNodeID), csiNodeObj(testNode, testNodeID))
	if n := f.c.attachQ.Q.Len(); n != 0 {
		t.Errorf("an unchanged CSINode queued %d items", n)
	}
}

func TestVAMetadataConflictReadsAgain(t *testing.T) {
	f := newFixture(t, allCaps,
		vaObj("va1", "pv1", withRV("7")), pvObj("pv1", "pool.vol1", pvFinalizers(finalizer)), csiNodeObj(testNode, testNodeID))
	conflicts := 1
	f.Client.PrependReactor("patch", "volumeattachments", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if p := a.(k8stesting.PatchAction); p.GetSubresource() == "" && p.GetPatchType() == types.MergePatchType && conflicts > 0 {
			conflicts--
			return true, nil, apierrors.NewConflict(schema.GroupResource{Group: "storage.k8s.io", Resource: "volumeattachments"}, "va1", errors.New("stale"))
		}
		return false, nil, nil
	})
	// The live object has moved on: someone added a finalizer.
	live := f.va("va1")
	live.ResourceVersion = "8"
	live.Finalizers = []string{otherFin}
	if err := f.Client.Tracker().Update(vaGVR, live, ""); err != nil {
		t.Fatal(err)
	}
	f.Client.ClearActions()
	if err := f.c.syncVA(f.Ctx, "va1"); err != nil {
		t.Fatalf("syncVA: %v", err)
	}
	kubetest.Diff(t, "API actions", []apiAction{
		patchVAMeta("va1", `{"metadata":{"resourceVersion":"7","finalizers":["`+finalizer+`"],"annotations":{"`+nodeIDAnn+`":"`+testNodeID+`"}}}`),
		get("volumeattachments", "va1"),
		patchVAMeta("va1", `{"metadata":{"resourceVersion":"8","finalizers":["`+otherFin+`","`+finalizer+`"],"annotations":{"`+nodeIDAnn+`":"`+testNodeID+`"}}}`),
		patchVAStatus("va1", markAttached),
	}, f.actions())
	kubetest.Diff(t, "finalizers", []string{otherFin, finalizer}, f.va("va1").Finalizers)
}

func TestStaleCacheAfterOwnWriteReadsLiveObject(t *testing.T) {
	f := newFixture(t, allCaps,
		vaObj("va1", "pv1", withRV("5"), withFinalizers(finalizer), withNodeIDAnnotation(testNodeID)),
		pvObj("pv1", "pool.vol1", pvFinalizers(finalizer)), csiNodeObj(testNode, testNodeID))
	// The controller attached it at resourceVersion 6; the cache still has 5.
	live := f.va("va1")
	live.ResourceVersion = "6"
	live.Status.Attached = true
	if err := f.Client.Tracker().Update(vaGVR, live, ""); err != nil {
		t.Fatal(err)
	}
	f.c.state.written.Record("va1", "6", testNow)
	f.Client.ClearActions()
	if err := f.c.syncVA(f.Ctx, "va1"); err != nil {
		t.Fatalf("syncVA: %v", err)
	}
	kubetest.Diff(t, "API actions", []apiAction{get("volumeattachments", "va1")}, f.actions())
	kubetest.Diff(t, "CSI calls (no second publish)", nil, f.csi.TakeCalls())
}

func TestWaitsForTheDriverInsteadOfFailing(t *testing.T) {
	f := newFixture(t, allCaps, vaObj("va1", "pv1"))
	gate := &gatedCSI{fakeCSI: f.csi, ready: make(chan struct{})}
	f.c.csi = gate
	f.c.vaAdded(f.va("va1"))
	ctx, cancel := context.WithTimeout(f.Ctx, 50*time.Millisecond)
	defer cancel()
	if f.c.processNextVA(ctx, f.c.attachQ) {
		t.Fatal("processNextVA went on while the driver was away")
	}
	if n := f.c.attachQ.Q.Len(); n != 1 {
		t.Errorf("attach queue holds %d items, want the item untouched", n)
	}
	kubetest.Diff(t, "API actions while the driver is away", nil, f.actions())
}

// gatedCSI is a driver that is not ready until ready is closed.
type gatedCSI struct {
	*fakeCSI
	ready chan struct{}
}

func (g *gatedCSI) WaitReady(ctx context.Context) error {
	select {
	case <-g.ready:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func TestVAMetadataPatchFailureIsReportedWithoutPublishing(t *testing.T) {
	f := newFixture(t, allCaps,
		vaObj("va1", "pv1"), pvObj("pv1", "pool.vol1", pvFinalizers(finalizer)), csiNodeObj(testNode, testNodeID))
	f.Client.PrependReactor("patch", "volumeattachments", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if p := a.(k8stesting.PatchAction); p.GetSubresource() == "" {
			return true, nil, apierrors.NewInternalError(errors.New("etcd is sad"))
		}
		return false, nil, nil
	})
	err := f.c.syncVA(f.Ctx, "va1")
	if !apierrors.IsInternalError(err) || isFinal(err) {
		t.Fatalf("syncVA = %v, want a transient internal error", err)
	}
	kubetest.Diff(t, "CSI calls", nil, f.csi.TakeCalls())
	const msg = `add finalizer and node ID to VolumeAttachment "va1": Internal error occurred: etcd is sad`
	kubetest.Diff(t, "Events", []string{"Warning AttachFailed " + msg}, f.events())
	if got := f.va("va1").Status.AttachError; got == nil || got.Message != msg || got.ErrorCode != nil {
		t.Errorf("attachError = %+v, want %q without a gRPC code", got, msg)
	}
}

// TestWriteOrderAroundTheDriver checks the order of API writes and CSI calls
// together: finalizers and node ID before ControllerPublishVolume, the
// status after it; a fresh read, then ControllerUnpublishVolume before the
// finalizer goes.
func TestWriteOrderAroundTheDriver(t *testing.T) {
	f := newFixture(t, allCaps, vaObj("va1", "pv1"), pvObj("pv1", "pool.vol1"), csiNodeObj(testNode, testNodeID))
	var timeline []string
	apiSeen := 0
	record := func(event string) {
		for _, a := range f.Client.Actions()[apiSeen:] {
			timeline = append(timeline, a.GetVerb()+" "+a.GetResource().Resource+subresource(a))
		}
		apiSeen = len(f.Client.Actions())
		if event != "" {
			timeline = append(timeline, event)
		}
	}
	f.csi.onCall = record

	if err := f.c.syncVA(f.Ctx, "va1"); err != nil {
		t.Fatalf("attach: %v", err)
	}
	va := f.va("va1")
	deleting(va)
	if err := f.Client.Tracker().Update(vaGVR, va, ""); err != nil {
		t.Fatal(err)
	}
	f.cache(va)
	if err := f.c.syncVA(f.Ctx, "va1"); err != nil {
		t.Fatalf("detach: %v", err)
	}
	record("")
	kubetest.Diff(t, "timeline", []string{
		"patch persistentvolumes", // PV finalizer
		"patch volumeattachments", // VA finalizer + node ID
		"ControllerPublishVolume", // once
		"patch volumeattachments/status",
		"get volumeattachments", // the object as it is now, not the cache's copy
		"ControllerUnpublishVolume",
		"patch volumeattachments", // finalizer removed; the object goes, so no status patch
	}, timeline)
}

func subresource(a k8stesting.Action) string {
	if s := a.GetSubresource(); s != "" {
		return "/" + s
	}
	return ""
}
