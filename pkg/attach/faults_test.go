package attach

import (
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	k8stesting "k8s.io/client-go/testing"

	"github.com/loopvol/loopvol/internal/kube"
	"github.com/loopvol/loopvol/internal/kube/kubetest"
)

// emptyState is what trackedObjects reports with nothing left to do.
var emptyState = map[string]int{"pending": 0, "written": 0, "forced": 0, "timeouts": 0, "locked": 0, "failing": 0, "leaks": 0}

// TestStateEmptyAfterBurst: a burst of attaches and detaches leaves no
// per-VolumeAttachment state behind, even when the informer's delete event
// is handled before the patch that removed the last finalizer returns (the
// order that used to leave a third of the entries behind).
func TestStateEmptyAfterBurst(t *testing.T) {
	const n = 50
	var objs []runtime.Object
	for i := range n {
		objs = append(objs, vaObj(fmt.Sprintf("va%d", i), fmt.Sprintf("pv%d", i)), pvObj(fmt.Sprintf("pv%d", i), fmt.Sprintf("pool.vol%d", i)))
	}
	objs = append(objs, csiNodeObj(testNode, testNodeID))
	f := newFixture(t, allCaps, objs...)
	for i := range n {
		f.c.vaAdded(f.va(fmt.Sprintf("va%d", i)))
	}
	f.drain()
	for i := range n {
		if va := f.va(fmt.Sprintf("va%d", i)); !va.Status.Attached {
			t.Fatalf("%s not attached: %+v", va.Name, va.Status)
		}
	}

	// The API server deletes an object whose last finalizer goes; the
	// informer sees that and runs the delete handler before the patch's
	// answer reaches the worker.
	react := k8stesting.ObjectReaction(f.Client.Tracker())
	f.Client.PrependReactor("patch", "volumeattachments", func(a k8stesting.Action) (bool, runtime.Object, error) {
		pa := a.(k8stesting.PatchActionImpl)
		if pa.GetPatchType() != types.JSONPatchType || !strings.Contains(string(pa.GetPatch()), `"remove"`) {
			return false, nil, nil
		}
		handled, obj, err := react(a)
		if err != nil {
			return handled, obj, err
		}
		va := obj.(*storagev1.VolumeAttachment)
		if va.DeletionTimestamp != nil && len(va.Finalizers) == 0 {
			if err := f.Client.Tracker().Delete(vaGVR, "", va.Name); err != nil {
				t.Error(err)
			}
			cached, _ := f.c.vaLister.Get(va.Name)
			_ = f.c.vaIndexer.Delete(cached)
			f.c.vaDeleted(cached)
		}
		return handled, obj, err
	})
	for i := range n {
		va := f.va(fmt.Sprintf("va%d", i))
		deleting(va)
		if err := f.Client.Tracker().Update(vaGVR, va, ""); err != nil {
			t.Fatal(err)
		}
	}
	f.observe()
	f.drain()
	vas, _ := f.Client.StorageV1().VolumeAttachments().List(f.Ctx, metav1.ListOptions{})
	if len(vas.Items) != 0 {
		t.Fatalf("%d VolumeAttachments left", len(vas.Items))
	}
	kubetest.Diff(t, "tracked objects after the burst", emptyState, f.c.trackedObjects().sizes)
}

// TestStaleCacheNeverPublishesOrUnpublishes: a cached VolumeAttachment
// that is gone from the API server (another replica detached it while this
// one was paused) is neither published nor unpublished, and its state is
// dropped.
func TestStaleCacheNeverPublishesOrUnpublishes(t *testing.T) {
	for _, tc := range []struct {
		name string
		va   *storagev1.VolumeAttachment
	}{
		{name: "attach from a stale copy", va: vaObj("va1", "pv1", withFinalizers(finalizer), withNodeIDAnnotation(testNodeID))},
		{name: "detach from a stale copy", va: vaObj("va1", "pv1", deleting, withFinalizers(finalizer), withNodeIDAnnotation(testNodeID), attached(nil))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, allCaps, pvObj("pv1", "pool.vol1", pvFinalizers(finalizer)), csiNodeObj(testNode, testNodeID))
			f.cache(tc.va) // in the cache only
			f.c.vaAdded(tc.va)
			f.drain()
			kubetest.Diff(t, "API actions", []apiAction{get("volumeattachments", "va1")}, f.actions())
			kubetest.Diff(t, "CSI calls", nil, f.csi.TakeCalls())
			kubetest.Diff(t, "tracked objects", emptyState, f.c.trackedObjects().sizes)
		})
	}
}

// TestNotLeadingActsOnNothing: once the leader check fails, neither a
// driver call nor a status write nor an Event happens.
func TestNotLeadingActsOnNothing(t *testing.T) {
	for _, tc := range []struct {
		name string
		va   *storagev1.VolumeAttachment
	}{
		{name: "attach", va: vaObj("va1", "pv1", withFinalizers(finalizer), withNodeIDAnnotation(testNodeID))},
		{name: "detach", va: vaObj("va1", "pv1", deleting, withFinalizers(finalizer), withNodeIDAnnotation(testNodeID), attached(nil))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, allCaps, tc.va, pvObj("pv1", "pool.vol1", pvFinalizers(finalizer)), csiNodeObj(testNode, testNodeID))
			ctx := kube.WithLeaderCheck(f.Ctx, func() error { return kube.ErrNotLeading })
			err := f.c.syncVA(ctx, "va1")
			if err == nil || !strings.Contains(err.Error(), kube.ErrNotLeading.Error()) {
				t.Fatalf("syncVA = %v, want %v", err, kube.ErrNotLeading)
			}
			kubetest.Diff(t, "API actions", []apiAction{get("volumeattachments", "va1")}, f.actions())
			kubetest.Diff(t, "CSI calls", nil, f.csi.TakeCalls())
			kubetest.Diff(t, "Events", nil, f.events())
		})
	}
}

// TestCallTimeoutGrows: each timeout of a VolumeAttachment's call doubles
// its next timeout up to TimeoutGrowthLimit × Timeout; an answer resets it.
func TestCallTimeoutGrows(t *testing.T) {
	f := newFixture(t, allCaps, vaObj("va1", "pv1", withFinalizers(finalizer), withNodeIDAnnotation(testNodeID)),
		pvObj("pv1", "pool.vol1", pvFinalizers(finalizer)), csiNodeObj(testNode, testNodeID))
	f.c.cfg.Timeout = 10 * time.Second
	f.csi.publishErr = status.Error(codes.DeadlineExceeded, "context deadline exceeded")
	var got []time.Duration
	for range 5 {
		if err := f.c.syncVA(f.Ctx, "va1"); status.Code(err) != codes.DeadlineExceeded {
			t.Fatalf("syncVA = %v, want DEADLINE_EXCEEDED", err)
		}
		got = append(got, f.c.state.callTimeout("va1", f.c.cfg.Timeout))
	}
	kubetest.Diff(t, "timeouts after each timeout", []time.Duration{20 * time.Second, 40 * time.Second, 80 * time.Second, 80 * time.Second, 80 * time.Second}, got)
	f.csi.publishErr = nil
	if err := f.c.syncVA(f.Ctx, "va1"); err != nil {
		t.Fatal(err)
	}
	kubetest.Diff(t, "timeout after a success", 10*time.Second, f.c.state.callTimeout("va1", f.c.cfg.Timeout))
	if _, _, timeouts := f.c.state.sizes(); timeouts != 0 {
		t.Errorf("%d grown timeouts remembered after a success, want 0", timeouts)
	}
}

// TestLeakRepair: the reconcile unpublishes a volume the driver lists as
// published to a node that no VolumeAttachment wants, after the grace
// period and a live list, and never one that a VolumeAttachment wants.
func TestLeakRepair(t *testing.T) {
	unpublish := func(vol, node string) csiCall {
		return csiCall{Method: "ControllerUnpublishVolume", VolumeID: vol, NodeID: node}
	}
	listed := csiCall{Method: "ListVolumes"}
	wanted := vaObj("va1", "pv1", withRV("3"), withFinalizers(finalizer), withNodeIDAnnotation(testNodeID), attached(nil))
	base := func() []runtime.Object {
		return []runtime.Object{wanted, pvObj("pv1", "pool.vol1", pvFinalizers(finalizer)), csiNodeObj(testNode, testNodeID)}
	}
	published := map[string][]string{"pool.vol1": {testNodeID}, "pool.leak": {testNodeID, "node-2-id"}}
	tests := []struct {
		name     string
		objs     []runtime.Object
		between  func(*fixture) // after the first pass
		wantCSI  []csiCall      // of the second pass, a grace period later
		wantLeft int            // leaks still tracked
	}{
		{
			name:    "no VolumeAttachment wants it → unpublished from each node after the grace period; the wanted volume untouched",
			objs:    base(),
			wantCSI: []csiCall{listed, unpublish("pool.leak", testNodeID), unpublish("pool.leak", "node-2-id")},
		},
		{
			name: "a VolumeAttachment created meanwhile (not in the cache yet) wants it on one node → only the other node's publication goes",
			objs: base(),
			between: func(f *fixture) {
				va := vaObj("va2", "pv2", withNodeIDAnnotation(testNodeID))
				if err := f.Client.Tracker().Add(va); err != nil {
					t.Fatal(err)
				}
				f.cache(pvObj("pv2", "pool.leak"))
			},
			wantCSI: []csiCall{listed, unpublish("pool.leak", "node-2-id")},
		},
		{
			name:     "a VolumeAttachment whose node ID is unknown wants it everywhere → nothing unpublished",
			objs:     append(base(), vaObj("va2", "pv2", withRV("4"), onNode("node-9")), pvObj("pv2", "pool.leak")),
			wantCSI:  []csiCall{listed},
			wantLeft: 0,
		},
		{
			name:     "a VolumeAttachment names a PersistentVolume that is not known → nothing is judged",
			objs:     append(base(), vaObj("va2", "missing-pv", withRV("4"))),
			wantCSI:  []csiCall{listed},
			wantLeft: 0,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, allCaps, tc.objs...)
			f.csi.published = maps.Clone(published)
			f.c.reconcile(f.Ctx)
			kubetest.Diff(t, "CSI calls of the first pass", []csiCall{listed}, f.csi.TakeCalls())
			if tc.between != nil {
				tc.between(f)
			}
			f.Clock.Step(f.c.leakGrace())
			f.c.reconcile(f.Ctx)
			calls := f.csi.TakeCalls()
			if len(calls) > 1 {
				rest := calls[1:]
				if len(rest) == 2 && rest[0].NodeID > rest[1].NodeID {
					rest[0], rest[1] = rest[1], rest[0]
				}
			}
			kubetest.Diff(t, "CSI calls of the second pass", tc.wantCSI, calls)
			if got := f.c.leaks.size(); got != tc.wantLeft {
				t.Errorf("leaks tracked: %d, want %d", got, tc.wantLeft)
			}
		})
	}
}
