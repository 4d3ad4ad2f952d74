package attach

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/loopvol/loopvol/internal/kube/kubetest"
	"github.com/loopvol/loopvol/pkg/csiclient"
)

func TestReconcile(t *testing.T) {
	listed := csiCall{Method: "ListVolumes"}
	republish := csiCall{Method: "ControllerPublishVolume", VolumeID: "pool.vol1", NodeID: testNodeID,
		Capability: "mount/ext4/SINGLE_NODE_WRITER", Context: map[string]string{"pool": "default"}}
	done := func(opts ...func(*storagev1.VolumeAttachment)) *storagev1.VolumeAttachment {
		return vaObj("va1", "pv1", append([]func(*storagev1.VolumeAttachment){
			withRV("3"), withFinalizers(finalizer), withNodeIDAnnotation(testNodeID)}, opts...)...)
	}
	pv := pvObj("pv1", "pool.vol1", pvFinalizers(finalizer))
	tests := []struct {
		name      string
		caps      csiclient.Capabilities
		objs      []runtime.Object
		published map[string][]string
		setup     func(*fixture)
		wantQueue bool // va1 queued with a forced sync
		wantCSI   []csiCall
		wantAPI   []apiAction
		wantAfter storagev1.VolumeAttachmentStatus
	}{
		{
			name:      "attached and published → nothing",
			caps:      allCaps,
			objs:      []runtime.Object{done(attached(nil)), pv},
			published: map[string][]string{"pool.vol1": {testNodeID}},
			wantCSI:   []csiCall{listed},
			wantAfter: storagev1.VolumeAttachmentStatus{Attached: true},
		},
		{
			name:      "attached but the driver lost it → published again; status unchanged, no write",
			caps:      allCaps,
			objs:      []runtime.Object{done(attached(nil)), pv},
			published: map[string][]string{"pool.vol1": {"other-node-id"}},
			wantQueue: true,
			wantCSI:   []csiCall{listed, republish},
			wantAPI:   []apiAction{get("volumeattachments", "va1")},
			wantAfter: storagev1.VolumeAttachmentStatus{Attached: true},
		},
		{
			name:      "status flipped to not attached by hand, still published → synced again and marked attached",
			caps:      allCaps,
			objs:      []runtime.Object{done(), pv},
			published: map[string][]string{"pool.vol1": {testNodeID}},
			wantQueue: true,
			wantCSI:   []csiCall{listed, republish},
			wantAPI:   []apiAction{get("volumeattachments", "va1"), patchVAStatus("va1", markAttached)},
			wantAfter: storagev1.VolumeAttachmentStatus{Attached: true},
		},
		{
			name:      "pending VA (attach in progress or in backoff) → left to its own sync",
			caps:      allCaps,
			objs:      []runtime.Object{done(), pv},
			setup:     func(f *fixture) { f.c.pending.add("va1", opAttach) },
			wantCSI:   []csiCall{listed},
			wantAfter: storagev1.VolumeAttachmentStatus{},
		},
		{
			name:      "new VA in the cache before its add event reached the handlers → judged once it has",
			caps:      allCaps,
			objs:      []runtime.Object{done(), pv},
			setup:     func(f *fixture) { f.c.state.drop("va1") },
			wantCSI:   []csiCall{listed},
			wantAfter: storagev1.VolumeAttachmentStatus{},
		},
		{
			name:      "the cache a version ahead of the handlers → judged once they have it",
			caps:      allCaps,
			objs:      []runtime.Object{done(), pv},
			setup:     func(f *fixture) { f.c.state.deliver("va1", "2") },
			wantCSI:   []csiCall{listed},
			wantAfter: storagev1.VolumeAttachmentStatus{},
		},
		{
			name:      "written after the driver was asked → judged at the next pass",
			caps:      allCaps,
			objs:      []runtime.Object{done(attached(nil)), pv},
			setup:     func(f *fixture) { f.c.state.written.Record("va1", "3", testNow.Add(time.Second)) },
			wantCSI:   []csiCall{listed},
			wantAfter: storagev1.VolumeAttachmentStatus{Attached: true},
		},
		{
			name: "VA being deleted, still published → never unpublished by the reconcile",
			caps: allCaps,
			objs: []runtime.Object{done(attached(nil), deleting), pv},
			published: map[string][]string{
				"pool.vol1":    {testNodeID},
				"pool.orphan7": {testNodeID}, // no VolumeAttachment at all: left alone too
			},
			wantCSI:   []csiCall{listed},
			wantAfter: storagev1.VolumeAttachmentStatus{Attached: true},
		},
		{
			name:      "driver without LIST_VOLUMES_PUBLISHED_NODES → no reconcile",
			caps:      csiclient.Capabilities{ControllerService: true, PublishUnpublish: true, ListVolumes: true},
			objs:      []runtime.Object{done(attached(nil)), pv},
			wantAfter: storagev1.VolumeAttachmentStatus{Attached: true},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, tc.caps, tc.objs...)
			f.csi.published = tc.published
			if tc.setup != nil {
				tc.setup(f)
			}
			f.Clock.Step(time.Second) // the pass starts after the setup's writes
			f.c.reconcile(f.Ctx)
			if got := f.c.attachQ.Q.Len() == 1; got != tc.wantQueue {
				t.Fatalf("va1 queued = %v, want %v", got, tc.wantQueue)
			}
			if _, forced := f.c.state.forced("va1"); forced != tc.wantQueue {
				t.Errorf("forced sync = %v, want %v", forced, tc.wantQueue)
			}
			if tc.wantQueue {
				f.c.processNextVA(f.Ctx, f.c.attachQ)
				if _, forced := f.c.state.forced("va1"); forced {
					t.Errorf("the forced sync is still pending after a successful sync")
				}
			}
			kubetest.Diff(t, "CSI calls", tc.wantCSI, f.csi.TakeCalls())
			kubetest.Diff(t, "API actions", tc.wantAPI, f.actions())
			got := f.va("va1").Status
			if len(got.AttachmentMetadata) == 0 {
				got.AttachmentMetadata = nil
			}
			kubetest.Diff(t, "status", tc.wantAfter, got)
			want := 0
			if tc.wantQueue {
				want = 1
			}
			if err := testutil.GatherAndCompare(f.Registry, strings.NewReader(`
# HELP loopvol_attacher_reconcile_resyncs_total VolumeAttachments the ListVolumes reconcile found disagreeing with the driver and synced again.
# TYPE loopvol_attacher_reconcile_resyncs_total counter
loopvol_attacher_reconcile_resyncs_total `+itoa(want)+`
`), "loopvol_attacher_reconcile_resyncs_total"); err != nil {
				t.Error(err)
			}
		})
	}
}

func TestForcedSyncOfAChangedObjectIsNormal(t *testing.T) {
	// The reconcile judged resourceVersion 3; the object has changed since
	// (and says attached): the verdict no longer holds, so nothing is
	// published again.
	f := newFixture(t, allCaps,
		vaObj("va1", "pv1", withRV("3"), withFinalizers(finalizer), withNodeIDAnnotation(testNodeID), attached(nil)),
		pvObj("pv1", "pool.vol1", pvFinalizers(finalizer)))
	live := f.va("va1")
	live.ResourceVersion = "4"
	if err := f.Client.Tracker().Update(vaGVR, live, ""); err != nil {
		t.Fatal(err)
	}
	f.c.state.setForce("va1", "3")
	if err := f.c.syncVA(f.Ctx, "va1"); err != nil {
		t.Fatalf("syncVA: %v", err)
	}
	kubetest.Diff(t, "CSI calls", nil, f.csi.TakeCalls())
}

func itoa(n int) string { return strconv.Itoa(n) }

func TestForcedSyncSurvivesItsOwnFailure(t *testing.T) {
	// The driver lost an attached volume; the forced publish fails once
	// (writing attachError, a new resourceVersion); the retry still
	// publishes.
	f := newFixture(t, allCaps,
		vaObj("va1", "pv1", withRV("3"), withFinalizers(finalizer), withNodeIDAnnotation(testNodeID), attached(nil)),
		pvObj("pv1", "pool.vol1", pvFinalizers(finalizer)))
	kubetest.Serve(f.Client, kubetest.Options{})
	f.c.state.setForce("va1", "3")
	f.csi.publishErr = status.Error(codes.Unavailable, "restarting")
	if err := f.c.syncVA(f.Ctx, "va1"); status.Code(err) != codes.Unavailable {
		t.Fatalf("first forced sync = %v, want Unavailable", err)
	}
	f.csi.publishErr = nil
	if err := f.c.syncVA(f.Ctx, "va1"); err != nil {
		t.Fatalf("retry: %v", err)
	}
	kubetest.Diff(t, "CSI calls", map[string]int{"ControllerPublishVolume": 2}, countCalls(f.csi.TakeCalls()))
	if _, forced := f.c.state.forced("va1"); forced {
		t.Error("the forced sync is still pending after it succeeded")
	}
	if st := f.va("va1").Status; !st.Attached || st.AttachError != nil {
		t.Errorf("status = %+v, want attached without error", st)
	}
}
