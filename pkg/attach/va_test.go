package attach

import (
	"errors"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/loopvol/loopvol/internal/kube/kubetest"
	"github.com/loopvol/loopvol/pkg/csiclient"
)

func TestSyncVAAttach(t *testing.T) {
	publish := func(c csiCall) []csiCall {
		c.Method = "ControllerPublishVolume"
		if c.VolumeID == "" {
			c.VolumeID = "pool.vol1"
		}
		if c.NodeID == "" {
			c.NodeID = testNodeID
		}
		if c.Capability == "" {
			c.Capability = "mount/ext4/SINGLE_NODE_WRITER"
		}
		if c.Context == nil {
			c.Context = map[string]string{"pool": "default"}
		}
		return []csiCall{c}
	}
	tests := []struct {
		name       string
		caps       csiclient.Capabilities
		objs       []runtime.Object
		uncached   []runtime.Object // in the API server, not yet in the cache
		publishCtx map[string]string
		publishErr error
		wantErr    bool
		wantFinal  bool
		wantAPI    []apiAction
		wantCSI    []csiCall
		wantEvents []string
		wantStatus storagev1.VolumeAttachmentStatus
	}{
		{
			name: "VA added → PV finalizer, VA finalizer and node ID in one patch, publish, status attached",
			caps: allCaps,
			objs: []runtime.Object{
				vaObj("va1", "pv1"), pvObj("pv1", "pool.vol1"), csiNodeObj(testNode, testNodeID),
			},
			publishCtx: map[string]string{"devicePath": "/dev/loop3"},
			wantAPI: []apiAction{
				patchPV("pv1", addPVFinalizer),
				patchVAMeta("va1", addVAMetadata),
				patchVAStatus("va1", `{"status":{"attached":true,"attachError":null,"attachmentMetadata":{"devicePath":"/dev/loop3"}}}`),
			},
			wantCSI:    publish(csiCall{}),
			wantStatus: storagev1.VolumeAttachmentStatus{Attached: true, AttachmentMetadata: map[string]string{"devicePath": "/dev/loop3"}},
		},
		{
			name: "PV with another finalizer → ours appended after a test of the list",
			caps: allCaps,
			objs: []runtime.Object{
				vaObj("va1", "pv1"), pvObj("pv1", "pool.vol1", pvFinalizers("kubernetes.io/pv-protection")), csiNodeObj(testNode, testNodeID),
			},
			wantAPI: []apiAction{
				patchPV("pv1", `[{"op":"test","path":"/metadata/finalizers","value":["kubernetes.io/pv-protection"]},{"op":"add","path":"/metadata/finalizers/-","value":"`+finalizer+`"}]`),
				patchVAMeta("va1", addVAMetadata),
				patchVAStatus("va1", markAttached),
			},
			wantCSI:    publish(csiCall{}),
			wantStatus: storagev1.VolumeAttachmentStatus{Attached: true},
		},
		{
			name: "finalizers and annotation already there (upstream names) → publish and status only",
			caps: allCaps,
			objs: []runtime.Object{
				vaObj("va1", "pv1", withFinalizers(finalizer), withNodeIDAnnotation(testNodeID)),
				pvObj("pv1", "pool.vol1", pvFinalizers(finalizer)), csiNodeObj(testNode, testNodeID),
			},
			wantAPI:    []apiAction{get("volumeattachments", "va1"), patchVAStatus("va1", markAttached)},
			wantCSI:    publish(csiCall{}),
			wantStatus: storagev1.VolumeAttachmentStatus{Attached: true},
		},
		{
			name: "VA already attached → nothing",
			caps: allCaps,
			objs: []runtime.Object{
				vaObj("va1", "pv1", withFinalizers(finalizer), withNodeIDAnnotation(testNodeID), attached(nil)),
				pvObj("pv1", "pool.vol1", pvFinalizers(finalizer)), csiNodeObj(testNode, testNodeID),
			},
			wantStatus: storagev1.VolumeAttachmentStatus{Attached: true},
		},
		{
			name: "VA of another driver → nothing",
			caps: allCaps,
			objs: []runtime.Object{
				vaObj("va1", "pv1", func(va *storagev1.VolumeAttachment) { va.Spec.Attacher = "other.csi.io" }),
				pvObj("pv1", "pool.vol1"), csiNodeObj(testNode, testNodeID),
			},
		},
		{
			name: "inline volume → no PV finalizer, publish with the inline source",
			caps: allCaps,
			objs: []runtime.Object{vaObj("va1", "", inline("pool.inline")), csiNodeObj(testNode, testNodeID)},
			wantAPI: []apiAction{
				patchVAMeta("va1", addVAMetadata),
				patchVAStatus("va1", markAttached),
			},
			wantCSI: publish(csiCall{VolumeID: "pool.inline", Capability: "mount/xfs/SINGLE_NODE_WRITER",
				Context: map[string]string{"migrated": "yes"}}),
			wantStatus: storagev1.VolumeAttachmentStatus{Attached: true},
		},
		{
			name: "controllerPublishSecretRef → Secret read and passed to the driver",
			caps: allCaps,
			objs: []runtime.Object{
				vaObj("va1", "pv1"), pvObj("pv1", "pool.vol1", pvSecret("ns1", "creds")), csiNodeObj(testNode, testNodeID),
				secretObj("ns1", "creds", map[string]string{"password": "s3cret"}),
			},
			wantAPI: []apiAction{
				patchPV("pv1", addPVFinalizer),
				patchVAMeta("va1", addVAMetadata),
				{Verb: "get", Resource: "secrets", Namespace: "ns1", Name: "creds"},
				patchVAStatus("va1", markAttached),
			},
			wantCSI:    publish(csiCall{Secrets: map[string]string{"password": "s3cret"}}),
			wantStatus: storagev1.VolumeAttachmentStatus{Attached: true},
		},
		{
			name: "missing Secret → attachError without a code, Event, no publish",
			caps: allCaps,
			objs: []runtime.Object{
				vaObj("va1", "pv1"), pvObj("pv1", "pool.vol1", pvSecret("ns1", "creds")), csiNodeObj(testNode, testNodeID),
			},
			wantErr: true,
			wantAPI: []apiAction{
				patchPV("pv1", addPVFinalizer),
				patchVAMeta("va1", addVAMetadata),
				{Verb: "get", Resource: "secrets", Namespace: "ns1", Name: "creds"},
				patchVAStatus("va1", `{"status":{"attachError":{"message":"get the controllerPublishSecretRef Secret ns1/creds: secrets \"creds\" not found","time":"`+timeJSON+`"}}}`),
			},
			wantEvents: []string{`Warning AttachFailed get the controllerPublishSecretRef Secret ns1/creds: secrets "creds" not found`},
			wantStatus: storagev1.VolumeAttachmentStatus{AttachError: &storagev1.VolumeError{
				Message: `get the controllerPublishSecretRef Secret ns1/creds: secrets "creds" not found`}},
		},
		{
			name: "read-only PV and PUBLISH_READONLY → readonly",
			caps: allCaps,
			objs: []runtime.Object{
				vaObj("va1", "pv1", withFinalizers(finalizer), withNodeIDAnnotation(testNodeID)),
				pvObj("pv1", "pool.vol1", pvFinalizers(finalizer), pvReadOnly, pvAccessModes(corev1.ReadOnlyMany)), csiNodeObj(testNode, testNodeID),
			},
			wantAPI:    []apiAction{get("volumeattachments", "va1"), patchVAStatus("va1", markAttached)},
			wantCSI:    publish(csiCall{Readonly: true, Capability: "mount/ext4/MULTI_NODE_READER_ONLY"}),
			wantStatus: storagev1.VolumeAttachmentStatus{Attached: true},
		},
		{
			name: "read-only PV without PUBLISH_READONLY → readonly false, as CSI demands",
			caps: csiclient.Capabilities{ControllerService: true, PublishUnpublish: true},
			objs: []runtime.Object{
				vaObj("va1", "pv1", withFinalizers(finalizer), withNodeIDAnnotation(testNodeID)),
				pvObj("pv1", "pool.vol1", pvFinalizers(finalizer), pvReadOnly), csiNodeObj(testNode, testNodeID),
			},
			wantAPI:    []apiAction{get("volumeattachments", "va1"), patchVAStatus("va1", markAttached)},
			wantCSI:    publish(csiCall{}),
			wantStatus: storagev1.VolumeAttachmentStatus{Attached: true},
		},
		{
			name: "block PV → block capability",
			caps: allCaps,
			objs: []runtime.Object{
				vaObj("va1", "pv1", withFinalizers(finalizer), withNodeIDAnnotation(testNodeID)),
				pvObj("pv1", "pool.vol1", pvFinalizers(finalizer), pvBlock, pvAccessModes(corev1.ReadWriteMany)), csiNodeObj(testNode, testNodeID),
			},
			wantAPI:    []apiAction{get("volumeattachments", "va1"), patchVAStatus("va1", markAttached)},
			wantCSI:    publish(csiCall{Capability: "block/MULTI_NODE_MULTI_WRITER"}),
			wantStatus: storagev1.VolumeAttachmentStatus{Attached: true},
		},
		{
			name: "PV without fsType → --default-fstype; mount options passed",
			caps: allCaps,
			objs: []runtime.Object{
				vaObj("va1", "pv1", withFinalizers(finalizer), withNodeIDAnnotation(testNodeID)),
				pvObj("pv1", "pool.vol1", pvFinalizers(finalizer), pvNoFSType, func(pv *corev1.PersistentVolume) {
					pv.Spec.MountOptions = []string{"noatime"}
				}), csiNodeObj(testNode, testNodeID),
			},
			wantAPI:    []apiAction{get("volumeattachments", "va1"), patchVAStatus("va1", markAttached)},
			wantCSI:    publish(csiCall{Capability: "mount/ext4/SINGLE_NODE_WRITER/noatime"}),
			wantStatus: storagev1.VolumeAttachmentStatus{Attached: true},
		},
		{
			name: "SINGLE_NODE_MULTI_WRITER driver → ReadWriteOncePod is SINGLE_NODE_SINGLE_WRITER",
			caps: csiclient.Capabilities{ControllerService: true, PublishUnpublish: true, SingleNodeMultiWriter: true},
			objs: []runtime.Object{
				vaObj("va1", "pv1", withFinalizers(finalizer), withNodeIDAnnotation(testNodeID)),
				pvObj("pv1", "pool.vol1", pvFinalizers(finalizer), pvAccessModes(corev1.ReadWriteOncePod)), csiNodeObj(testNode, testNodeID),
			},
			wantAPI:    []apiAction{get("volumeattachments", "va1"), patchVAStatus("va1", markAttached)},
			wantCSI:    publish(csiCall{Capability: "mount/ext4/SINGLE_NODE_SINGLE_WRITER"}),
			wantStatus: storagev1.VolumeAttachmentStatus{Attached: true},
		},
		{
			name: "no CSINode → node ID from the annotation",
			caps: allCaps,
			objs: []runtime.Object{
				vaObj("va1", "pv1", withFinalizers(finalizer), withNodeIDAnnotation("annotated-id")),
				pvObj("pv1", "pool.vol1", pvFinalizers(finalizer)),
			},
			wantAPI:    []apiAction{get("volumeattachments", "va1"), patchVAStatus("va1", markAttached)},
			wantCSI:    publish(csiCall{NodeID: "annotated-id"}),
			wantStatus: storagev1.VolumeAttachmentStatus{Attached: true},
		},
		{
			name: "CSINode ID differs from the annotation → CSINode wins and the annotation is updated",
			caps: allCaps,
			objs: []runtime.Object{
				vaObj("va1", "pv1", withFinalizers(finalizer), withNodeIDAnnotation("old-id")),
				pvObj("pv1", "pool.vol1", pvFinalizers(finalizer)), csiNodeObj(testNode, testNodeID),
			},
			wantAPI: []apiAction{
				patchVAMeta("va1", `{"metadata":{"annotations":{"`+nodeIDAnn+`":"`+testNodeID+`"}}}`),
				patchVAStatus("va1", markAttached),
			},
			wantCSI:    publish(csiCall{}),
			wantStatus: storagev1.VolumeAttachmentStatus{Attached: true},
		},
		{
			name:    "no CSINode and no annotation → CSINode read from the API server, attachError, Event",
			caps:    allCaps,
			objs:    []runtime.Object{vaObj("va1", "pv1"), pvObj("pv1", "pool.vol1")},
			wantErr: true,
			wantAPI: []apiAction{
				get("csinodes", testNode),
				patchVAStatus("va1", `{"status":{"attachError":{"message":"the CSI node ID of node \"node-1\" is unknown: its CSINode does not list driver \"loopvol.csi.io\" and the VolumeAttachment has no csi.alpha.kubernetes.io/node-id annotation","time":"`+timeJSON+`"}}}`),
			},
			wantEvents: []string{`Warning AttachFailed the CSI node ID of node "node-1" is unknown: its CSINode does not list driver "loopvol.csi.io" and the VolumeAttachment has no csi.alpha.kubernetes.io/node-id annotation`},
			wantStatus: storagev1.VolumeAttachmentStatus{AttachError: &storagev1.VolumeError{
				Message: `the CSI node ID of node "node-1" is unknown: its CSINode does not list driver "loopvol.csi.io" and the VolumeAttachment has no csi.alpha.kubernetes.io/node-id annotation`}},
		},
		{
			name:     "PV not in the cache yet → read from the API server",
			caps:     allCaps,
			objs:     []runtime.Object{vaObj("va1", "pv1"), csiNodeObj(testNode, testNodeID)},
			uncached: []runtime.Object{pvObj("pv1", "pool.vol1")},
			wantAPI: []apiAction{
				get("persistentvolumes", "pv1"),
				patchPV("pv1", addPVFinalizer),
				patchVAMeta("va1", addVAMetadata),
				patchVAStatus("va1", markAttached),
			},
			wantCSI:    publish(csiCall{}),
			wantStatus: storagev1.VolumeAttachmentStatus{Attached: true},
		},
		{
			name: "PV being deleted → never attached: attachError, Event, final",
			caps: allCaps,
			objs: []runtime.Object{
				vaObj("va1", "pv1"), pvObj("pv1", "pool.vol1", pvDeleting, pvFinalizers("kubernetes.io/pv-protection")), csiNodeObj(testNode, testNodeID),
			},
			wantErr:   true,
			wantFinal: true,
			wantAPI: []apiAction{
				patchVAStatus("va1", `{"status":{"attachError":{"message":"PersistentVolume \"pv1\" is marked for deletion","time":"`+timeJSON+`"}}}`),
			},
			wantEvents: []string{`Warning AttachFailed PersistentVolume "pv1" is marked for deletion`},
			wantStatus: storagev1.VolumeAttachmentStatus{AttachError: &storagev1.VolumeError{Message: `PersistentVolume "pv1" is marked for deletion`}},
		},
		{
			name: "publish fails with RESOURCE_EXHAUSTED → attachError with errorCode 8, Event, not final",
			caps: allCaps,
			objs: []runtime.Object{
				vaObj("va1", "pv1", withFinalizers(finalizer), withNodeIDAnnotation(testNodeID)),
				pvObj("pv1", "pool.vol1", pvFinalizers(finalizer)), csiNodeObj(testNode, testNodeID),
			},
			publishErr: status.Error(codes.ResourceExhausted, "node-1 has 8 of 8 volumes"),
			wantErr:    true,
			wantAPI: []apiAction{
				get("volumeattachments", "va1"),
				patchVAStatus("va1", attachErrorPatch("rpc error: code = ResourceExhausted desc = node-1 has 8 of 8 volumes", 8)),
			},
			wantCSI:    publish(csiCall{}),
			wantEvents: []string{"Warning AttachFailed rpc error: code = ResourceExhausted desc = node-1 has 8 of 8 volumes"},
			wantStatus: storagev1.VolumeAttachmentStatus{AttachError: &storagev1.VolumeError{
				Message: "rpc error: code = ResourceExhausted desc = node-1 has 8 of 8 volumes", ErrorCode: ptr[int32](8)}},
		},
		{
			name: "publish fails with FAILED_PRECONDITION → errorCode 9, final",
			caps: allCaps,
			objs: []runtime.Object{
				vaObj("va1", "pv1", withFinalizers(finalizer), withNodeIDAnnotation(testNodeID)),
				pvObj("pv1", "pool.vol1", pvFinalizers(finalizer)), csiNodeObj(testNode, testNodeID),
			},
			publishErr: status.Error(codes.FailedPrecondition, "attached to node-2"),
			wantErr:    true,
			wantFinal:  true,
			wantAPI: []apiAction{
				get("volumeattachments", "va1"),
				patchVAStatus("va1", attachErrorPatch("rpc error: code = FailedPrecondition desc = attached to node-2", 9)),
			},
			wantCSI:    publish(csiCall{}),
			wantEvents: []string{"Warning AttachFailed rpc error: code = FailedPrecondition desc = attached to node-2"},
			wantStatus: storagev1.VolumeAttachmentStatus{AttachError: &storagev1.VolumeError{
				Message: "rpc error: code = FailedPrecondition desc = attached to node-2", ErrorCode: ptr[int32](9)}},
		},
		{
			name: "a success clears an earlier attachError",
			caps: allCaps,
			objs: []runtime.Object{
				vaObj("va1", "pv1", withFinalizers(finalizer), withNodeIDAnnotation(testNodeID), withAttachError(8)),
				pvObj("pv1", "pool.vol1", pvFinalizers(finalizer)), csiNodeObj(testNode, testNodeID),
			},
			wantAPI:    []apiAction{get("volumeattachments", "va1"), patchVAStatus("va1", markAttached)},
			wantCSI:    publish(csiCall{}),
			wantStatus: storagev1.VolumeAttachmentStatus{Attached: true},
		},
		{
			name:       "driver without PUBLISH_UNPUBLISH_VOLUME → attached with no CSI call and no finalizer",
			caps:       noPublishCaps,
			objs:       []runtime.Object{vaObj("va1", "pv1"), pvObj("pv1", "pool.vol1"), csiNodeObj(testNode, testNodeID)},
			wantAPI:    []apiAction{patchVAStatus("va1", markAttached)},
			wantStatus: storagev1.VolumeAttachmentStatus{Attached: true},
		},
		{
			name:       "driver without PUBLISH_UNPUBLISH_VOLUME, already attached → nothing",
			caps:       noPublishCaps,
			objs:       []runtime.Object{vaObj("va1", "pv1", attached(nil)), pvObj("pv1", "pool.vol1")},
			wantStatus: storagev1.VolumeAttachmentStatus{Attached: true},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, tc.caps, tc.objs...)
			for _, o := range tc.uncached {
				if err := f.Client.Tracker().Add(o); err != nil {
					t.Fatal(err)
				}
			}
			f.csi.publishCtx = tc.publishCtx
			f.csi.publishErr = tc.publishErr
			err := f.c.syncVA(f.Ctx, "va1")
			if (err != nil) != tc.wantErr {
				t.Fatalf("syncVA error = %v, want error %v", err, tc.wantErr)
			}
			if got := isFinal(err); got != tc.wantFinal {
				t.Errorf("isFinal(%v) = %v, want %v", err, got, tc.wantFinal)
			}
			if tc.publishErr != nil && !errors.Is(err, tc.publishErr) && status.Code(err) != status.Code(tc.publishErr) {
				t.Errorf("syncVA error = %v, want the driver's %v", err, tc.publishErr)
			}
			kubetest.Diff(t, "API actions", tc.wantAPI, f.actions())
			kubetest.Diff(t, "CSI calls", tc.wantCSI, f.csi.TakeCalls())
			kubetest.Diff(t, "Events", tc.wantEvents, f.events())
			got := f.va("va1").Status
			if got.AttachError != nil {
				got.AttachError.Time = tc.wantStatus.AttachError.Time // checked in the patch
			}
			if len(got.AttachmentMetadata) == 0 {
				got.AttachmentMetadata = nil
			}
			kubetest.Diff(t, "status", tc.wantStatus, got)
		})
	}
}

func ptr[T any](v T) *T { return &v }
