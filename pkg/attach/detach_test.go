package attach

import (
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/loopvol/loopvol/internal/kube/kubetest"
	"github.com/loopvol/loopvol/pkg/csiclient"
)

func TestSyncVADetach(t *testing.T) {
	unpublish := func(volumeID, nodeID string, secrets map[string]string) []csiCall {
		return []csiCall{{Method: "ControllerUnpublishVolume", VolumeID: volumeID, NodeID: nodeID, Secrets: secrets}}
	}
	removeFinalizerAt := func(i string) string {
		return `[{"op":"test","path":"/metadata/finalizers/` + i + `","value":"` + finalizer + `"},{"op":"remove","path":"/metadata/finalizers/` + i + `"}]`
	}
	tests := []struct {
		name           string
		caps           csiclient.Capabilities
		objs           []runtime.Object
		unpublishErr   error
		wantErr        bool
		wantAPI        []apiAction
		wantCSI        []csiCall
		wantEvents     []string
		wantFinalizers []string
		wantStatus     *storagev1.VolumeAttachmentStatus // nil: not checked
	}{
		{
			name: "deleted VA → unpublish, then the finalizer goes in one patch; no status patch as the object goes away",
			caps: allCaps,
			objs: []runtime.Object{
				vaObj("va1", "pv1", deleting, withFinalizers(finalizer), withNodeIDAnnotation(testNodeID), attached(nil)),
				pvObj("pv1", "pool.vol1", pvFinalizers(finalizer)), csiNodeObj(testNode, testNodeID),
			},
			wantAPI:        []apiAction{get("volumeattachments", "va1"), patchVAJSON("va1", removeFinalizerAt("0"))},
			wantCSI:        unpublish("pool.vol1", testNodeID, nil),
			wantFinalizers: nil,
		},
		{
			name: "deleted VA carrying the upstream finalizer and annotation, node and CSINode gone → detached with the annotated node ID",
			caps: allCaps,
			objs: []runtime.Object{
				vaObj("va1", "pv1", deleting, withFinalizers(finalizer), withNodeIDAnnotation("upstream-node-id"), attached(map[string]string{"k": "v"})),
				pvObj("pv1", "pool.vol1", pvFinalizers(finalizer)),
			},
			wantAPI:        []apiAction{get("volumeattachments", "va1"), patchVAJSON("va1", removeFinalizerAt("0"))},
			wantCSI:        unpublish("pool.vol1", "upstream-node-id", nil),
			wantFinalizers: nil,
		},
		{
			name: "detach asks the annotation first: it names the node ID the volume was published to",
			caps: allCaps,
			objs: []runtime.Object{
				vaObj("va1", "pv1", deleting, withFinalizers(finalizer), withNodeIDAnnotation("published-id"), attached(nil)),
				pvObj("pv1", "pool.vol1", pvFinalizers(finalizer)), csiNodeObj(testNode, "re-registered-id"),
			},
			wantAPI: []apiAction{get("volumeattachments", "va1"), patchVAJSON("va1", removeFinalizerAt("0"))},
			wantCSI: unpublish("pool.vol1", "published-id", nil),
		},
		{
			name: "another finalizer keeps the object → finalizer removed by index, then status detached",
			caps: allCaps,
			objs: []runtime.Object{
				vaObj("va1", "pv1", deleting, withFinalizers(otherFin, finalizer), withNodeIDAnnotation(testNodeID), attached(map[string]string{"k": "v"})),
				pvObj("pv1", "pool.vol1", pvFinalizers(finalizer)), csiNodeObj(testNode, testNodeID),
			},
			wantAPI: []apiAction{
				get("volumeattachments", "va1"),
				patchVAJSON("va1", removeFinalizerAt("1")),
				patchVAStatus("va1", `{"status":{"attached":false,"attachmentMetadata":null,"detachError":null}}`),
			},
			wantCSI:        unpublish("pool.vol1", testNodeID, nil),
			wantFinalizers: []string{otherFin},
			wantStatus:     &storagev1.VolumeAttachmentStatus{},
		},
		{
			name: "controllerPublishSecretRef → the same Secret is passed to unpublish",
			caps: allCaps,
			objs: []runtime.Object{
				vaObj("va1", "pv1", deleting, withFinalizers(finalizer), withNodeIDAnnotation(testNodeID), attached(nil)),
				pvObj("pv1", "pool.vol1", pvFinalizers(finalizer), pvSecret("ns1", "creds")),
				secretObj("ns1", "creds", map[string]string{"token": "t0k3n"}),
			},
			wantAPI: []apiAction{
				get("volumeattachments", "va1"),
				{Verb: "get", Resource: "secrets", Namespace: "ns1", Name: "creds"},
				patchVAJSON("va1", removeFinalizerAt("0")),
			},
			wantCSI: unpublish("pool.vol1", testNodeID, map[string]string{"token": "t0k3n"}),
		},
		{
			name: "inline volume → unpublished with the inline handle",
			caps: allCaps,
			objs: []runtime.Object{
				vaObj("va1", "", inline("pool.inline"), deleting, withFinalizers(finalizer), withNodeIDAnnotation(testNodeID), attached(nil)),
			},
			wantAPI: []apiAction{get("volumeattachments", "va1"), patchVAJSON("va1", removeFinalizerAt("0"))},
			wantCSI: unpublish("pool.inline", testNodeID, nil),
		},
		{
			name: "unpublish fails → detachError with errorCode, Event, finalizer kept",
			caps: allCaps,
			objs: []runtime.Object{
				vaObj("va1", "pv1", deleting, withFinalizers(finalizer), withNodeIDAnnotation(testNodeID), attached(nil)),
				pvObj("pv1", "pool.vol1", pvFinalizers(finalizer)),
			},
			unpublishErr: status.Error(codes.Internal, "disk on fire"),
			wantErr:      true,
			wantAPI: []apiAction{
				get("volumeattachments", "va1"),
				patchVAStatus("va1", detachErrorPatch("rpc error: code = Internal desc = disk on fire", 13)),
			},
			wantCSI:        unpublish("pool.vol1", testNodeID, nil),
			wantEvents:     []string{"Warning DetachFailed rpc error: code = Internal desc = disk on fire"},
			wantFinalizers: []string{finalizer},
			wantStatus: &storagev1.VolumeAttachmentStatus{Attached: true, DetachError: &storagev1.VolumeError{
				Message: "rpc error: code = Internal desc = disk on fire", ErrorCode: ptr[int32](13)}},
		},
		{
			name: "deleted VA without our finalizer → nothing",
			caps: allCaps,
			objs: []runtime.Object{
				vaObj("va1", "pv1", deleting, withFinalizers(otherFin)), pvObj("pv1", "pool.vol1"),
			},
			wantFinalizers: []string{otherFin},
		},
		{
			name: "driver without PUBLISH_UNPUBLISH_VOLUME → finalizer removed with no CSI call",
			caps: noPublishCaps,
			objs: []runtime.Object{
				vaObj("va1", "pv1", deleting, withFinalizers(finalizer), attached(nil)), pvObj("pv1", "pool.vol1"),
			},
			wantAPI: []apiAction{patchVAJSON("va1", removeFinalizerAt("0"))},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, tc.caps, tc.objs...)
			f.csi.unpublishErr = tc.unpublishErr
			err := f.c.syncVA(f.Ctx, "va1")
			if (err != nil) != tc.wantErr {
				t.Fatalf("syncVA error = %v, want error %v", err, tc.wantErr)
			}
			if tc.unpublishErr != nil && status.Code(err) != status.Code(tc.unpublishErr) {
				t.Errorf("syncVA error code = %s, want %s", status.Code(err), status.Code(tc.unpublishErr))
			}
			kubetest.Diff(t, "API actions", tc.wantAPI, f.actions())
			kubetest.Diff(t, "CSI calls", tc.wantCSI, f.csi.TakeCalls())
			kubetest.Diff(t, "Events", tc.wantEvents, f.events())
			va := f.va("va1")
			if len(va.Finalizers) == 0 {
				va.Finalizers = nil
			}
			kubetest.Diff(t, "finalizers", tc.wantFinalizers, va.Finalizers)
			if tc.wantStatus != nil {
				got := va.Status
				if got.DetachError != nil {
					got.DetachError.Time = tc.wantStatus.DetachError.Time
				}
				if len(got.AttachmentMetadata) == 0 {
					got.AttachmentMetadata = nil
				}
				kubetest.Diff(t, "status", *tc.wantStatus, got)
			}
		})
	}
}

func TestSyncPV(t *testing.T) {
	tests := []struct {
		name           string
		objs           []runtime.Object
		live           []string // the PV's finalizers in the API server, when the cache is stale
		wantAPI        []apiAction
		wantFinalizers []string
	}{
		{
			name: "PV being deleted, no VA → finalizer removed by index after a test",
			objs: []runtime.Object{pvObj("pv1", "pool.vol1", pvDeleting, pvFinalizers("kubernetes.io/pv-protection", finalizer))},
			wantAPI: []apiAction{patchPV("pv1",
				`[{"op":"test","path":"/metadata/finalizers/1","value":"`+finalizer+`"},{"op":"remove","path":"/metadata/finalizers/1"}]`)},
			wantFinalizers: []string{"kubernetes.io/pv-protection"},
		},
		{
			name: "PV being deleted while a VA (being deleted too) refers to it → kept",
			objs: []runtime.Object{
				pvObj("pv1", "pool.vol1", pvDeleting, pvFinalizers(finalizer)),
				vaObj("va1", "pv1", deleting, withFinalizers(finalizer)),
			},
			wantFinalizers: []string{finalizer},
		},
		{
			name:           "PV not being deleted → kept, it may be attached again",
			objs:           []runtime.Object{pvObj("pv1", "pool.vol1", pvFinalizers(finalizer))},
			wantFinalizers: []string{finalizer},
		},
		{
			name: "stale cache: the test op fails → PV read again, removed at its live index",
			objs: []runtime.Object{pvObj("pv1", "pool.vol1", pvDeleting, pvFinalizers("kubernetes.io/pv-protection", finalizer))},
			live: []string{finalizer},
			wantAPI: []apiAction{
				patchPV("pv1", `[{"op":"test","path":"/metadata/finalizers/1","value":"`+finalizer+`"},{"op":"remove","path":"/metadata/finalizers/1"}]`),
				get("persistentvolumes", "pv1"),
				patchPV("pv1", `[{"op":"test","path":"/metadata/finalizers/0","value":"`+finalizer+`"},{"op":"remove","path":"/metadata/finalizers/0"}]`),
			},
			wantFinalizers: nil,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, allCaps, tc.objs...)
			if tc.live != nil {
				pv := f.pv("pv1")
				pv.Finalizers = tc.live
				if err := f.Client.Tracker().Update(corev1.SchemeGroupVersion.WithResource("persistentvolumes"), pv, ""); err != nil {
					t.Fatal(err)
				}
				f.Client.ClearActions()
			}
			if err := f.c.syncPV(f.Ctx, "pv1"); err != nil {
				t.Fatalf("syncPV: %v", err)
			}
			kubetest.Diff(t, "API actions", tc.wantAPI, f.actions())
			fins := f.pv("pv1").Finalizers
			if len(fins) == 0 {
				fins = nil
			}
			kubetest.Diff(t, "PV finalizers", tc.wantFinalizers, fins)
		})
	}
}

func TestEnsurePVFinalizerStaleCache(t *testing.T) {
	// The cache says the PV has no finalizer; another controller has added
	// one since. The test op keeps ours from replacing theirs.
	f := newFixture(t, allCaps, pvObj("pv1", "pool.vol1"))
	pv := f.pv("pv1")
	pv.Finalizers = []string{"kubernetes.io/pv-protection"}
	if err := f.Client.Tracker().Update(corev1.SchemeGroupVersion.WithResource("persistentvolumes"), pv, ""); err != nil {
		t.Fatal(err)
	}
	f.Client.ClearActions()
	cached, _ := f.c.pvLister.Get("pv1")
	if err := f.c.ensurePVFinalizer(f.Ctx, cached); err != nil {
		t.Fatalf("ensurePVFinalizer: %v", err)
	}
	kubetest.Diff(t, "API actions", []apiAction{
		patchPV("pv1", addPVFinalizer),
		get("persistentvolumes", "pv1"),
		patchPV("pv1", `[{"op":"test","path":"/metadata/finalizers","value":["kubernetes.io/pv-protection"]},{"op":"add","path":"/metadata/finalizers/-","value":"`+finalizer+`"}]`),
	}, f.actions())
	kubetest.Diff(t, "PV finalizers", []string{"kubernetes.io/pv-protection", finalizer}, f.pv("pv1").Finalizers)
}
