package resize

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/loopvol/loopvol/internal/kube"
	"github.com/loopvol/loopvol/internal/kube/claimtest"
	"github.com/loopvol/loopvol/internal/kube/kubetest"
	"github.com/loopvol/loopvol/pkg/csiclient"
)

const (
	gi          = int64(1) << 30
	mountSNW    = "mount/ext4/SINGLE_NODE_WRITER[]"
	eventResize = "Normal Resizing External resizer is resizing volume pv-c"
	eventFSReq  = "Normal FileSystemResizeRequired Require file system resize of volume on node"
	eventDone   = "Normal VolumeResizeSuccessful Resize volume succeeded"
)

// The claim patches of one expansion of claim c.
func inProgressPatch(size, resizingSince string) string {
	return fmt.Sprintf(`{"metadata":{"resourceVersion":"RV"},"status":{"allocatedResources":{"storage":%q},"allocatedResourceStatuses":{"storage":"ControllerResizeInProgress"},"conditions":[{"type":"Resizing","status":"True","lastProbeTime":null,"lastTransitionTime":%q}]}}`, size, resizingSince)
}

var nodePendingPatch = `{"metadata":{"resourceVersion":"RV"},"status":{"allocatedResourceStatuses":{"storage":"NodeResizePending"},"conditions":[{"type":"FileSystemResizePending","status":"True","lastProbeTime":null,"lastTransitionTime":"` + claimtest.TimeJSON + `","message":"` + msgFileSystemResizePending + `"}]}}`

func pvCapacityPatch(size, preResize string) string {
	if preResize == "" {
		return fmt.Sprintf(`{"spec":{"capacity":{"storage":%q}}}`, size)
	}
	return fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}},"spec":{"capacity":{"storage":%q}}}`, preResizeAnn, preResize, size)
}

func TestResize(t *testing.T) {
	outOfRange := status.Error(codes.OutOfRange, "too big for the pool")
	tests := []struct {
		name        string
		caps        csiclient.Capabilities
		objs        []runtime.Object
		answer      func(*csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error)
		nodeExpand  bool
		noAnnotate  bool
		wantActions []kubetest.Action
		wantCalls   []expandCall
		wantEvents  []string
		// wantErr is what the sync returned ("" for nil); wantFinal
		// whether it is retried slowly.
		wantErr   string
		wantFinal bool
		// wantConditions and wantStatus describe the claim afterwards.
		wantConditions []string
		wantStatus     corev1.ClaimResourceStatus
	}{
		{
			name: "request above capacity → expand, PV capacity with pre-resize annotation, claim handed to the node",
			caps: expandCaps,
			objs: []runtime.Object{claimtest.Claim("c", "2Gi", "1Gi"), claimtest.Volume("c", "1Gi")},
			wantActions: []kubetest.Action{
				claimtest.ClaimStatusPatch("c", inProgressPatch("2Gi", claimtest.TimeJSON)),
				claimtest.VolumePatch("pv-c", pvCapacityPatch("2Gi", "1Gi")),
				claimtest.ClaimStatusPatch("c", nodePendingPatch),
			},
			wantCalls:      []expandCall{{VolumeID: "vol-c", RequiredBytes: 2 * gi, Capability: mountSNW}},
			wantEvents:     []string{eventResize, eventFSReq},
			wantConditions: []string{"FileSystemResizePending"},
			wantStatus:     corev1.PersistentVolumeClaimNodeResizePending,
		},
		{
			name:       "AnnotateFsResize off → no pre-resize annotation",
			caps:       expandCaps,
			noAnnotate: true,
			objs:       []runtime.Object{claimtest.Claim("c", "2Gi", "1Gi"), claimtest.Volume("c", "1Gi")},
			wantActions: []kubetest.Action{
				claimtest.ClaimStatusPatch("c", inProgressPatch("2Gi", claimtest.TimeJSON)),
				claimtest.VolumePatch("pv-c", pvCapacityPatch("2Gi", "")),
				claimtest.ClaimStatusPatch("c", nodePendingPatch),
			},
			wantCalls:      []expandCall{{VolumeID: "vol-c", RequiredBytes: 2 * gi, Capability: mountSNW}},
			wantEvents:     []string{eventResize, eventFSReq},
			wantConditions: []string{"FileSystemResizePending"},
			wantStatus:     corev1.PersistentVolumeClaimNodeResizePending,
		},
		{
			name: "no node expansion needed → capacity set, resize status and conditions gone, node-expansion-not-required",
			caps: expandCaps,
			objs: []runtime.Object{claimtest.Claim("c", "2Gi", "1Gi"), claimtest.Volume("c", "1Gi")},
			answer: func(*csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
				return &csi.ControllerExpandVolumeResponse{CapacityBytes: 3 * gi}, nil
			},
			wantActions: []kubetest.Action{
				claimtest.ClaimStatusPatch("c", inProgressPatch("2Gi", claimtest.TimeJSON)),
				claimtest.VolumePatch("pv-c", pvCapacityPatch("3Gi", "")),
				claimtest.ClaimStatusPatch("c", `{"metadata":{"annotations":{"`+notReqAnn+`":"true"},"resourceVersion":"RV"},"status":{"capacity":{"storage":"3Gi"},"allocatedResourceStatuses":{"storage":null},"conditions":null}}`),
			},
			wantCalls:  []expandCall{{VolumeID: "vol-c", RequiredBytes: 2 * gi, Capability: mountSNW}},
			wantEvents: []string{eventResize, eventDone},
		},
		{
			name: "OUT_OF_RANGE → ControllerResizeError with the driver's message, ControllerResizeInfeasible, final",
			caps: expandCaps,
			objs: []runtime.Object{claimtest.Claim("c", "2Gi", "1Gi"), claimtest.Volume("c", "1Gi")},
			answer: func(*csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
				return nil, outOfRange
			},
			wantActions: []kubetest.Action{
				claimtest.ClaimStatusPatch("c", inProgressPatch("2Gi", claimtest.TimeJSON)),
				claimtest.ClaimStatusPatch("c", `{"metadata":{"resourceVersion":"RV"},"status":{"allocatedResourceStatuses":{"storage":"ControllerResizeInfeasible"},"conditions":[`+
					`{"type":"Resizing","status":"True","lastProbeTime":null,"lastTransitionTime":"`+claimtest.TimeJSON+`"},`+
					`{"type":"ControllerResizeError","status":"True","lastProbeTime":null,"lastTransitionTime":"`+claimtest.TimeJSON+`","message":"resize of volume pv-c failed: rpc error: code = OutOfRange desc = too big for the pool"}]}}`),
			},
			wantCalls:      []expandCall{{VolumeID: "vol-c", RequiredBytes: 2 * gi, Capability: mountSNW}},
			wantEvents:     []string{eventResize, "Warning VolumeResizeFailed resize of volume pv-c failed: rpc error: code = OutOfRange desc = too big for the pool"},
			wantErr:        "resize of volume pv-c failed: rpc error: code = OutOfRange desc = too big for the pool",
			wantFinal:      true,
			wantConditions: []string{"ControllerResizeError", "Resizing"},
			wantStatus:     corev1.PersistentVolumeClaimControllerResizeInfeasible,
		},
		{
			name: "request lowered after an infeasible one → expanded to the lowered request, error condition gone",
			caps: expandCaps,
			objs: []runtime.Object{
				claimtest.Claim("c", "3Gi", "1Gi", claimtest.Allocated("100Gi", corev1.PersistentVolumeClaimControllerResizeInfeasible),
					claimtest.Condition(corev1.PersistentVolumeClaimResizing, ""), claimtest.Condition(corev1.PersistentVolumeClaimControllerResizeError, "too big")),
				claimtest.Volume("c", "1Gi"),
			},
			wantActions: []kubetest.Action{
				claimtest.ClaimStatusPatch("c", inProgressPatch("3Gi", claimtest.Earlier.UTC().Format("2006-01-02T15:04:05Z"))),
				claimtest.VolumePatch("pv-c", pvCapacityPatch("3Gi", "1Gi")),
				claimtest.ClaimStatusPatch("c", nodePendingPatch),
			},
			wantCalls:      []expandCall{{VolumeID: "vol-c", RequiredBytes: 3 * gi, Capability: mountSNW}},
			wantEvents:     []string{eventResize, eventFSReq},
			wantConditions: []string{"FileSystemResizePending"},
			wantStatus:     corev1.PersistentVolumeClaimNodeResizePending,
		},
		{
			name: "an expansion of uncertain outcome in progress (restart) → finished at its recorded size first, no status write before the call",
			caps: expandCaps,
			objs: []runtime.Object{
				claimtest.Claim("c", "3Gi", "1Gi", claimtest.Allocated("5Gi", corev1.PersistentVolumeClaimControllerResizeInProgress), claimtest.Condition(corev1.PersistentVolumeClaimResizing, "")),
				claimtest.Volume("c", "1Gi"),
			},
			wantActions: []kubetest.Action{
				claimtest.VolumePatch("pv-c", pvCapacityPatch("5Gi", "1Gi")),
				claimtest.ClaimStatusPatch("c", nodePendingPatch),
			},
			wantCalls:      []expandCall{{VolumeID: "vol-c", RequiredBytes: 5 * gi, Capability: mountSNW}},
			wantEvents:     []string{eventResize, eventFSReq},
			wantConditions: []string{"FileSystemResizePending"},
			wantStatus:     corev1.PersistentVolumeClaimNodeResizePending,
		},
		{
			name: "restart after the driver call and the PV write → the driver is asked again (a no-op), the claim handed to the node",
			caps: expandCaps,
			objs: []runtime.Object{
				claimtest.Claim("c", "2Gi", "1Gi", claimtest.Allocated("2Gi", corev1.PersistentVolumeClaimControllerResizeInProgress), claimtest.Condition(corev1.PersistentVolumeClaimResizing, "")),
				claimtest.Volume("c", "2Gi", claimtest.WithAnnotation(preResizeAnn, "1Gi")),
			},
			wantActions:    []kubetest.Action{claimtest.ClaimStatusPatch("c", nodePendingPatch)},
			wantCalls:      []expandCall{{VolumeID: "vol-c", RequiredBytes: 2 * gi, Capability: mountSNW}},
			wantEvents:     []string{eventResize, eventFSReq},
			wantConditions: []string{"FileSystemResizePending"},
			wantStatus:     corev1.PersistentVolumeClaimNodeResizePending,
		},
		{
			name: "uncertain error (ABORTED) → Event only, retried at the same size, not final",
			caps: expandCaps,
			objs: []runtime.Object{claimtest.Claim("c", "2Gi", "1Gi"), claimtest.Volume("c", "1Gi")},
			answer: func(*csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
				return nil, status.Error(codes.Aborted, "busy")
			},
			wantActions:    []kubetest.Action{claimtest.ClaimStatusPatch("c", inProgressPatch("2Gi", claimtest.TimeJSON))},
			wantCalls:      []expandCall{{VolumeID: "vol-c", RequiredBytes: 2 * gi, Capability: mountSNW}},
			wantEvents:     []string{eventResize, "Warning VolumeResizeFailed resize of volume pv-c failed: rpc error: code = Aborted desc = busy"},
			wantErr:        "resize of volume pv-c failed: rpc error: code = Aborted desc = busy",
			wantConditions: []string{"Resizing"},
			wantStatus:     corev1.PersistentVolumeClaimControllerResizeInProgress,
		},
		{
			name:       "driver without controller expansion whose node expands → no driver call, PV at the request, handed to the node",
			caps:       nodeOnlyCaps,
			nodeExpand: true,
			objs:       []runtime.Object{claimtest.Claim("c", "2Gi", "1Gi"), claimtest.Volume("c", "1Gi")},
			wantActions: []kubetest.Action{
				claimtest.ClaimStatusPatch("c", inProgressPatch("2Gi", claimtest.TimeJSON)),
				claimtest.VolumePatch("pv-c", pvCapacityPatch("2Gi", "1Gi")),
				claimtest.ClaimStatusPatch("c", nodePendingPatch),
			},
			wantEvents:     []string{eventResize, eventFSReq},
			wantConditions: []string{"FileSystemResizePending"},
			wantStatus:     corev1.PersistentVolumeClaimNodeResizePending,
		},
		{
			name:      "driver that expands nowhere → nothing written, retried slowly",
			caps:      nodeOnlyCaps,
			objs:      []runtime.Object{claimtest.Claim("c", "2Gi", "1Gi"), claimtest.Volume("c", "1Gi")},
			wantErr:   "driver loopvol.csi.io expands volumes neither in its controller (EXPAND_VOLUME) nor on the node (node EXPAND_VOLUME)",
			wantFinal: true,
		},
		{
			name: "controllerExpandSecretRef → the Secret read with a GET and passed to the driver",
			caps: expandCaps,
			objs: []runtime.Object{
				claimtest.Claim("c", "2Gi", "1Gi"), claimtest.Volume("c", "1Gi", claimtest.ExpandSecret("kube-system", "expand")),
				&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "expand"}, Data: map[string][]byte{"key": []byte("s3cret")}},
			},
			wantActions: []kubetest.Action{
				claimtest.ClaimStatusPatch("c", inProgressPatch("2Gi", claimtest.TimeJSON)),
				claimtest.Get("secrets", "kube-system", "expand"),
				claimtest.VolumePatch("pv-c", pvCapacityPatch("2Gi", "1Gi")),
				claimtest.ClaimStatusPatch("c", nodePendingPatch),
			},
			wantCalls:      []expandCall{{VolumeID: "vol-c", RequiredBytes: 2 * gi, Capability: mountSNW, Secrets: map[string]string{"key": "s3cret"}}},
			wantEvents:     []string{eventResize, eventFSReq},
			wantConditions: []string{"FileSystemResizePending"},
			wantStatus:     corev1.PersistentVolumeClaimNodeResizePending,
		},
		{
			name: "missing Secret → Event, no driver call, retried (not final)",
			caps: expandCaps,
			objs: []runtime.Object{claimtest.Claim("c", "2Gi", "1Gi"), claimtest.Volume("c", "1Gi", claimtest.ExpandSecret("kube-system", "expand"))},
			wantActions: []kubetest.Action{
				claimtest.ClaimStatusPatch("c", inProgressPatch("2Gi", claimtest.TimeJSON)),
				claimtest.Get("secrets", "kube-system", "expand"),
			},
			wantEvents:     []string{eventResize, `Warning VolumeResizeFailed resize of volume pv-c failed: get the controllerExpandSecretRef Secret kube-system/expand: secrets "expand" not found`},
			wantErr:        `resize of volume pv-c failed: get the controllerExpandSecretRef Secret kube-system/expand: secrets "expand" not found`,
			wantConditions: []string{"Resizing"},
			wantStatus:     corev1.PersistentVolumeClaimControllerResizeInProgress,
		},
		{
			name: "block volume, ReadWriteMany → block capability, multi-node writer",
			caps: expandCaps,
			objs: []runtime.Object{claimtest.Claim("c", "2Gi", "1Gi"), claimtest.Volume("c", "1Gi", func(pv *corev1.PersistentVolume) {
				m := corev1.PersistentVolumeBlock
				pv.Spec.VolumeMode = &m
				pv.Spec.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany}
			})},
			wantActions: []kubetest.Action{
				claimtest.ClaimStatusPatch("c", inProgressPatch("2Gi", claimtest.TimeJSON)),
				claimtest.VolumePatch("pv-c", pvCapacityPatch("2Gi", "1Gi")),
				claimtest.ClaimStatusPatch("c", nodePendingPatch),
			},
			wantCalls:      []expandCall{{VolumeID: "vol-c", RequiredBytes: 2 * gi, Capability: "block/MULTI_NODE_MULTI_WRITER"}},
			wantEvents:     []string{eventResize, eventFSReq},
			wantConditions: []string{"FileSystemResizePending"},
			wantStatus:     corev1.PersistentVolumeClaimNodeResizePending,
		},
		{
			name: "capacity caught up with the volume → pre-resize annotation removed, nothing else",
			caps: expandCaps,
			objs: []runtime.Object{claimtest.Claim("c", "2Gi", "2Gi"), claimtest.Volume("c", "2Gi", claimtest.WithAnnotation(preResizeAnn, "1Gi"))},
			wantActions: []kubetest.Action{
				claimtest.VolumePatch("pv-c", `{"metadata":{"annotations":{"`+preResizeAnn+`":null}}}`),
			},
		},
	}
	for _, tc := range tests {
		for _, eager := range []bool{false, true} {
			name := tc.name
			if eager {
				name += " (watch faster than the patch response)"
			}
			t.Run(name, func(t *testing.T) {
				var opts []fixtureOption
				if tc.noAnnotate {
					opts = append(opts, func(c *Config) { c.AnnotatePreResizeCapacity = false })
				}
				f := newFixture(t, tc.caps, tc.objs, opts...)
				f.Eager = eager
				f.csi.answer, f.csi.nodeExpand = tc.answer, tc.nodeExpand
				f.QueueAll()
				f.Drain()
				// One sync: the controller's own writes coming back did not
				// queue the claim again.
				if len(f.Errs) != 1 {
					t.Fatalf("%d syncs, want 1 (own writes must not queue the claim): %v", len(f.Errs), f.Errs)
				}
				err := f.Errs[0]
				gotErr := ""
				if err != nil {
					gotErr = err.Error()
				}
				kubetest.Diff(t, "sync error", tc.wantErr, gotErr)
				if err != nil && kube.IsFinal(err) != tc.wantFinal {
					t.Errorf("isFinal(%v) = %v, want %v", err, kube.IsFinal(err), tc.wantFinal)
				}
				kubetest.Diff(t, "API actions", tc.wantActions, f.Actions())
				kubetest.Diff(t, "driver calls", tc.wantCalls, f.csi.TakeCalls())
				kubetest.Diff(t, "events", tc.wantEvents, f.Events())
				pvc := f.PVC("c")
				kubetest.Diff(t, "conditions", tc.wantConditions, conditionTypes(pvc))
				kubetest.Diff(t, "allocatedResourceStatuses", tc.wantStatus, pvc.Status.AllocatedResourceStatuses[corev1.ResourceStorage])
			})
		}
	}
}

// TestNothingToDo: claims that need no expansion, or are not this
// driver's, cause no API write, no driver call and no Event.
func TestNothingToDo(t *testing.T) {
	tests := []struct {
		name string
		objs []runtime.Object
	}{
		{name: "request equals capacity", objs: []runtime.Object{claimtest.Claim("c", "1Gi", "1Gi"), claimtest.Volume("c", "1Gi")}},
		{name: "request below capacity", objs: []runtime.Object{claimtest.Claim("c", "1Gi", "2Gi"), claimtest.Volume("c", "2Gi")}},
		{name: "claim not bound yet", objs: []runtime.Object{claimtest.Claim("c", "2Gi", "1Gi", claimtest.Pending), claimtest.Volume("c", "1Gi")}},
		{name: "claim without a volume name", objs: []runtime.Object{claimtest.Claim("c", "2Gi", "1Gi", func(p *corev1.PersistentVolumeClaim) { p.Spec.VolumeName = "" })}},
		{name: "volume of another driver", objs: []runtime.Object{claimtest.Claim("c", "2Gi", "1Gi"), claimtest.Volume("c", "1Gi", claimtest.OfDriver("other.csi.io"))}},
		{name: "volume of another driver keeps its pre-resize annotation", objs: []runtime.Object{claimtest.Claim("c", "2Gi", "2Gi"), claimtest.Volume("c", "2Gi", claimtest.OfDriver("other.csi.io"), claimtest.WithAnnotation(preResizeAnn, "1Gi"))}},
		{name: "volume without a CSI source", objs: []runtime.Object{claimtest.Claim("c", "2Gi", "1Gi"), claimtest.Volume("c", "1Gi", func(pv *corev1.PersistentVolume) { pv.Spec.CSI = nil })}},
		{name: "volume bound to another claim of that name (other UID)", objs: []runtime.Object{claimtest.Claim("c", "2Gi", "1Gi"), claimtest.Volume("c", "1Gi", func(pv *corev1.PersistentVolume) { pv.Spec.ClaimRef.UID = types.UID("older") })}},
		{name: "node expansion pending", objs: []runtime.Object{
			claimtest.Claim("c", "2Gi", "1Gi", claimtest.Allocated("2Gi", corev1.PersistentVolumeClaimNodeResizePending), claimtest.Condition(corev1.PersistentVolumeClaimFileSystemResizePending, "")),
			claimtest.Volume("c", "2Gi"),
		}},
		{name: "raised again while the node has not finished the last expansion", objs: []runtime.Object{
			claimtest.Claim("c", "3Gi", "1Gi", claimtest.Allocated("2Gi", corev1.PersistentVolumeClaimNodeResizeInProgress)),
			claimtest.Volume("c", "2Gi"),
		}},
		{name: "pre-resize annotation kept while the node has not caught up", objs: []runtime.Object{
			claimtest.Claim("c", "2Gi", "1Gi", claimtest.Allocated("2Gi", corev1.PersistentVolumeClaimNodeResizePending)),
			claimtest.Volume("c", "2Gi", claimtest.WithAnnotation(preResizeAnn, "1Gi")),
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, expandCaps, tc.objs)
			f.QueueAll()
			f.Drain()
			for _, err := range f.Errs {
				if err != nil {
					t.Errorf("sync: %v", err)
				}
			}
			kubetest.Diff(t, "API actions", nil, f.Actions())
			kubetest.Diff(t, "driver calls", nil, f.csi.TakeCalls())
			kubetest.Diff(t, "events", nil, f.Events())
		})
	}
}

// TestMissingVolume: a claim whose volume is in neither the cache nor the
// API server waits for it; the volume's arrival queues the claim.
func TestMissingVolume(t *testing.T) {
	f := newFixture(t, expandCaps, []runtime.Object{claimtest.Claim("c", "2Gi", "1Gi")})
	f.QueueAll()
	f.Drain()
	kubetest.Diff(t, "API actions", []kubetest.Action{claimtest.Get("persistentvolumes", "", "pv-c")}, f.Actions())
	if err := f.Errs[0]; err != nil {
		t.Fatalf("sync: %v", err)
	}
	pv := claimtest.Volume("c", "1Gi")
	if err := f.Client.Tracker().Add(pv); err != nil {
		t.Fatal(err)
	}
	f.Cache(pv)
	f.c.claims.VolumeAdded(pv)
	f.Drain()
	kubetest.Diff(t, "driver calls after the volume appeared", []expandCall{{VolumeID: "vol-c", RequiredBytes: 2 * gi, Capability: mountSNW}}, f.csi.TakeCalls())
}

// TestRecoveryAfterFinalError: a final error that is not infeasible
// (INTERNAL) leaves the claim in progress at the failed size; once the
// user lowers the request, the controller knows the driver is not working
// on the failed size and expands to the lowered request. An uncertain
// error does not allow that.
func TestRecoveryAfterFinalError(t *testing.T) {
	tests := []struct {
		name     string
		err      error
		wantSize int64
	}{
		{name: "final error (INTERNAL) → the lowered request", err: status.Error(codes.Internal, "disk on fire"), wantSize: 3 * gi},
		{name: "uncertain error (DEADLINE_EXCEEDED) → the recorded size again", err: status.Error(codes.DeadlineExceeded, "slow"), wantSize: 10 * gi},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, expandCaps, []runtime.Object{claimtest.Claim("c", "10Gi", "1Gi"), claimtest.Volume("c", "1Gi")})
			fail := true
			f.csi.answer = func(req *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
				if fail {
					return nil, tc.err
				}
				return &csi.ControllerExpandVolumeResponse{CapacityBytes: req.GetCapacityRange().GetRequiredBytes(), NodeExpansionRequired: true}, nil
			}
			f.QueueAll()
			f.Drain()
			_ = f.csi.TakeCalls()
			_ = f.Events()
			pvc := f.PVC("c")
			if got := pvc.Status.AllocatedResourceStatuses[corev1.ResourceStorage]; got != corev1.PersistentVolumeClaimControllerResizeInProgress {
				t.Fatalf("after the failure: resize status %q, want ControllerResizeInProgress", got)
			}

			// The user lowers the request.
			fail = false
			pvc.Spec.Resources.Requests[corev1.ResourceStorage] = *resourceQ("3Gi")
			if err := f.Client.Tracker().Update(corev1.SchemeGroupVersion.WithResource("persistentvolumeclaims"), pvc, claimtest.Namespace); err != nil {
				t.Fatal(err)
			}
			f.Client.ClearActions()
			f.Observe()
			f.Drain()
			calls := f.csi.TakeCalls()
			if len(calls) != 1 || calls[0].RequiredBytes != tc.wantSize {
				t.Fatalf("driver calls after the request was lowered: %+v, want one of %d bytes", calls, tc.wantSize)
			}
			pvc = f.PVC("c")
			if got := pvc.Status.AllocatedResources[corev1.ResourceStorage]; got.Value() != tc.wantSize {
				t.Errorf("allocatedResources %s, want %d bytes", got.String(), tc.wantSize)
			}
			kubetest.Diff(t, "conditions", []string{"FileSystemResizePending"}, conditionTypes(pvc))
		})
	}
}

// TestVolumeInUse: a driver that refused an expansion because the volume
// was in use (FAILED_PRECONDITION) is not called again while a running pod
// uses the claim; once the pod is gone it is.
func TestVolumeInUse(t *testing.T) {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: claimtest.Namespace, Name: "app"},
		Spec: corev1.PodSpec{Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "c"},
		}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
	for _, handle := range []bool{true, false} {
		t.Run(fmt.Sprintf("handle-volume-inuse-error=%v", handle), func(t *testing.T) {
			f := newFixture(t, expandCaps, []runtime.Object{claimtest.Claim("c", "2Gi", "1Gi"), claimtest.Volume("c", "1Gi"), pod},
				func(c *Config) { c.HandleVolumeInUseError = handle })
			inUse := true
			f.csi.answer = func(req *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
				if inUse {
					return nil, status.Error(codes.FailedPrecondition, "volume is published")
				}
				return &csi.ControllerExpandVolumeResponse{CapacityBytes: req.GetCapacityRange().GetRequiredBytes(), NodeExpansionRequired: true}, nil
			}
			f.QueueAll()
			f.Drain()
			if n := len(f.csi.TakeCalls()); n != 1 {
				t.Fatalf("%d driver calls, want 1", n)
			}
			_ = f.Events()
			f.Client.ClearActions()

			// The retry while the pod runs.
			f.c.claims.Queue.Q.Add(claimtest.Namespace + "/c")
			f.Drain()
			calls := f.csi.TakeCalls()
			if handle {
				kubetest.Diff(t, "driver calls while the pod runs", nil, calls)
				kubetest.Diff(t, "API actions while the pod runs", []kubetest.Action{{Verb: "list", Resource: "pods", Namespace: claimtest.Namespace}}, f.Actions())
				kubetest.Diff(t, "events while the pod runs", []string{"Warning VolumeResizeFailed Unable to expand apps/c: driver loopvol.csi.io expands only volumes not in use, and a pod uses it"}, f.Events())
			} else if len(calls) != 1 {
				t.Fatalf("driver calls while the pod runs, without the in-use handling: %d, want 1", len(calls))
			}

			// The pod ends; the driver can expand now.
			inUse = false
			pod := pod.DeepCopy()
			pod.Status.Phase = corev1.PodSucceeded
			if err := f.Client.Tracker().Update(corev1.SchemeGroupVersion.WithResource("pods"), pod, claimtest.Namespace); err != nil {
				t.Fatal(err)
			}
			f.c.claims.Queue.Q.Add(claimtest.Namespace + "/c")
			f.Drain()
			if n := len(f.csi.TakeCalls()); n != 1 {
				t.Fatalf("driver calls after the pod ended: %d, want 1", n)
			}
			kubetest.Diff(t, "conditions", []string{"FileSystemResizePending"}, conditionTypes(f.PVC("c")))
		})
	}
}

// TestStaleCache: a sync that finds the cache older than the controller's
// own last write of the claim decides on the live claim; so does the sync
// after a write that conflicted with someone else's.
func TestStaleCache(t *testing.T) {
	f := newFixture(t, expandCaps, []runtime.Object{claimtest.Claim("c", "2Gi", "1Gi"), claimtest.Volume("c", "1Gi")})
	f.csi.answer = func(*csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
		return nil, status.Error(codes.Unavailable, "restarting")
	}
	f.QueueAll()
	key, _ := f.c.claims.Queue.Q.Get()
	_ = f.c.sync(f.Ctx, key) // marks the claim in progress; the cache does not see it
	f.c.claims.Queue.Q.Done(key)
	_ = f.csi.TakeCalls()
	f.Client.ClearActions()

	f.csi.answer = nil
	if err := f.c.sync(f.Ctx, key); err != nil {
		t.Fatalf("sync: %v", err)
	}
	// The live claim says in progress with Resizing already: no second
	// in-progress write, straight to the driver.
	kubetest.Diff(t, "API actions", []kubetest.Action{
		claimtest.Get("persistentvolumeclaims", claimtest.Namespace, "c"),
		claimtest.VolumePatch("pv-c", pvCapacityPatch("2Gi", "1Gi")),
		claimtest.ClaimStatusPatch("c", nodePendingPatch),
	}, f.Actions())

	// Someone else writes the claim; the cache lags; the controller's
	// write conflicts, and its next sync reads the live claim.
	g := newFixture(t, expandCaps, []runtime.Object{claimtest.Claim("c", "2Gi", "1Gi"), claimtest.Volume("c", "1Gi")})
	live := g.PVC("c")
	live.ResourceVersion = "7"
	live.Labels = map[string]string{"someone": "else"}
	if err := g.Client.Tracker().Update(corev1.SchemeGroupVersion.WithResource("persistentvolumeclaims"), live, claimtest.Namespace); err != nil {
		t.Fatal(err)
	}
	err := g.c.sync(g.Ctx, key)
	if err == nil || !strings.Contains(err.Error(), "the object has been modified") {
		t.Fatalf("sync on a stale cache: %v, want a conflict", err)
	}
	g.Client.ClearActions()
	if err := g.c.sync(g.Ctx, key); err != nil {
		t.Fatalf("sync after the conflict: %v", err)
	}
	acts := g.Actions()
	if len(acts) == 0 || acts[0] != claimtest.Get("persistentvolumeclaims", claimtest.Namespace, "c") {
		t.Errorf("the sync after a conflict did not read the live claim first: %+v", acts)
	}
	if n := len(g.csi.TakeCalls()); n != 1 {
		t.Errorf("%d driver calls after the conflict, want 1", n)
	}
}

func TestMetrics(t *testing.T) {
	f := newFixture(t, expandCaps, []runtime.Object{
		claimtest.Claim("c", "2Gi", "1Gi"), claimtest.Volume("c", "1Gi"),
		claimtest.Claim("d", "2Pi", "1Gi"), claimtest.Volume("d", "1Gi"),
	})
	f.csi.answer = func(req *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
		if req.VolumeId == "vol-d" {
			return nil, status.Error(codes.OutOfRange, "too big")
		}
		return &csi.ControllerExpandVolumeResponse{CapacityBytes: req.GetCapacityRange().GetRequiredBytes()}, nil
	}
	f.QueueAll()
	f.Drain()
	want := `
# HELP loopvol_resizer_resize_errors_total Failed expansion attempts by gRPC code (None: failed before the driver answered, e.g. a missing Secret).
# TYPE loopvol_resizer_resize_errors_total counter
loopvol_resizer_resize_errors_total{grpc_status_code="OutOfRange"} 1
# HELP loopvol_resizer_resizes_total Volume expansions the controller finished its part of: the volume has its new capacity and the claim is handed to the node or done.
# TYPE loopvol_resizer_resizes_total counter
loopvol_resizer_resizes_total 1
`
	if err := testutil.GatherAndCompare(f.Registry, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}

// TestNoExpandWithoutTheLease: a replica that can no longer be sure it
// holds its Lease does not call the driver; once it is sure again, the
// claim is expanded.
func TestNoExpandWithoutTheLease(t *testing.T) {
	f := newFixture(t, expandCaps, []runtime.Object{claimtest.Claim("c", "2Gi", "1Gi"), claimtest.Volume("c", "1Gi")})
	leading := false
	ctx := f.Ctx
	f.Ctx = kube.WithLeaderCheck(ctx, func() error {
		if !leading {
			return kube.ErrNotLeading
		}
		return nil
	})
	f.QueueAll()
	f.Drain()
	if calls := f.csi.TakeCalls(); len(calls) != 0 {
		t.Fatalf("driver called while not sure of the Lease: %+v", calls)
	}
	for _, a := range f.Actions() {
		if a.Verb != "get" {
			t.Fatalf("API write while not sure of the Lease: %+v", a)
		}
	}
	if err := f.Errs[len(f.Errs)-1]; !errors.Is(err, kube.ErrNotLeading) {
		t.Fatalf("sync: %v, want ErrNotLeading", err)
	}
	leading = true
	f.c.claims.Queue.ResetBackoff()
	f.QueueAll()
	f.Drain()
	kubetest.Diff(t, "driver calls once leading", []expandCall{{VolumeID: "vol-c", RequiredBytes: 2 * gi, Capability: mountSNW}}, f.csi.TakeCalls())
}
