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

var nodePendingPatch = `{"metadata":{"resourceVersion":"RV"},"status":{"allocatedResourceStatuses":{"storage":"NodeResizePending"},"conditions":[{"type":"FileSystemResizePending","status":"True","lastProbeTime":null,"lastTransitionTime":"` + timeJSON + `","message":"` + msgFileSystemResizePending + `"}]}}`

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
		wantActions []apiAction
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
			objs: []runtime.Object{claim("c", "2Gi", "1Gi"), volume("c", "1Gi")},
			wantActions: []apiAction{
				claimStatusPatch("c", inProgressPatch("2Gi", timeJSON)),
				volumePatchAction("pv-c", pvCapacityPatch("2Gi", "1Gi")),
				claimStatusPatch("c", nodePendingPatch),
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
			objs:       []runtime.Object{claim("c", "2Gi", "1Gi"), volume("c", "1Gi")},
			wantActions: []apiAction{
				claimStatusPatch("c", inProgressPatch("2Gi", timeJSON)),
				volumePatchAction("pv-c", pvCapacityPatch("2Gi", "")),
				claimStatusPatch("c", nodePendingPatch),
			},
			wantCalls:      []expandCall{{VolumeID: "vol-c", RequiredBytes: 2 * gi, Capability: mountSNW}},
			wantEvents:     []string{eventResize, eventFSReq},
			wantConditions: []string{"FileSystemResizePending"},
			wantStatus:     corev1.PersistentVolumeClaimNodeResizePending,
		},
		{
			name: "no node expansion needed → capacity set, resize status and conditions gone, node-expansion-not-required",
			caps: expandCaps,
			objs: []runtime.Object{claim("c", "2Gi", "1Gi"), volume("c", "1Gi")},
			answer: func(*csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
				return &csi.ControllerExpandVolumeResponse{CapacityBytes: 3 * gi}, nil
			},
			wantActions: []apiAction{
				claimStatusPatch("c", inProgressPatch("2Gi", timeJSON)),
				volumePatchAction("pv-c", pvCapacityPatch("3Gi", "")),
				claimStatusPatch("c", `{"metadata":{"annotations":{"`+notReqAnn+`":"true"},"resourceVersion":"RV"},"status":{"capacity":{"storage":"3Gi"},"allocatedResourceStatuses":{"storage":null},"conditions":null}}`),
			},
			wantCalls:  []expandCall{{VolumeID: "vol-c", RequiredBytes: 2 * gi, Capability: mountSNW}},
			wantEvents: []string{eventResize, eventDone},
		},
		{
			name: "OUT_OF_RANGE → ControllerResizeError with the driver's message, ControllerResizeInfeasible, final",
			caps: expandCaps,
			objs: []runtime.Object{claim("c", "2Gi", "1Gi"), volume("c", "1Gi")},
			answer: func(*csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
				return nil, outOfRange
			},
			wantActions: []apiAction{
				claimStatusPatch("c", inProgressPatch("2Gi", timeJSON)),
				claimStatusPatch("c", `{"metadata":{"resourceVersion":"RV"},"status":{"allocatedResourceStatuses":{"storage":"ControllerResizeInfeasible"},"conditions":[`+
					`{"type":"Resizing","status":"True","lastProbeTime":null,"lastTransitionTime":"`+timeJSON+`"},`+
					`{"type":"ControllerResizeError","status":"True","lastProbeTime":null,"lastTransitionTime":"`+timeJSON+`","message":"resize of volume pv-c failed: rpc error: code = OutOfRange desc = too big for the pool"}]}}`),
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
				claim("c", "3Gi", "1Gi", allocated("100Gi", corev1.PersistentVolumeClaimControllerResizeInfeasible),
					condition(corev1.PersistentVolumeClaimResizing, ""), condition(corev1.PersistentVolumeClaimControllerResizeError, "too big")),
				volume("c", "1Gi"),
			},
			wantActions: []apiAction{
				claimStatusPatch("c", inProgressPatch("3Gi", earlier.UTC().Format("2006-01-02T15:04:05Z"))),
				volumePatchAction("pv-c", pvCapacityPatch("3Gi", "1Gi")),
				claimStatusPatch("c", nodePendingPatch),
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
				claim("c", "3Gi", "1Gi", allocated("5Gi", corev1.PersistentVolumeClaimControllerResizeInProgress), condition(corev1.PersistentVolumeClaimResizing, "")),
				volume("c", "1Gi"),
			},
			wantActions: []apiAction{
				volumePatchAction("pv-c", pvCapacityPatch("5Gi", "1Gi")),
				claimStatusPatch("c", nodePendingPatch),
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
				claim("c", "2Gi", "1Gi", allocated("2Gi", corev1.PersistentVolumeClaimControllerResizeInProgress), condition(corev1.PersistentVolumeClaimResizing, "")),
				volume("c", "2Gi", withAnnotation(preResizeAnn, "1Gi")),
			},
			wantActions:    []apiAction{claimStatusPatch("c", nodePendingPatch)},
			wantCalls:      []expandCall{{VolumeID: "vol-c", RequiredBytes: 2 * gi, Capability: mountSNW}},
			wantEvents:     []string{eventResize, eventFSReq},
			wantConditions: []string{"FileSystemResizePending"},
			wantStatus:     corev1.PersistentVolumeClaimNodeResizePending,
		},
		{
			name: "uncertain error (ABORTED) → Event only, retried at the same size, not final",
			caps: expandCaps,
			objs: []runtime.Object{claim("c", "2Gi", "1Gi"), volume("c", "1Gi")},
			answer: func(*csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
				return nil, status.Error(codes.Aborted, "busy")
			},
			wantActions:    []apiAction{claimStatusPatch("c", inProgressPatch("2Gi", timeJSON))},
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
			objs:       []runtime.Object{claim("c", "2Gi", "1Gi"), volume("c", "1Gi")},
			wantActions: []apiAction{
				claimStatusPatch("c", inProgressPatch("2Gi", timeJSON)),
				volumePatchAction("pv-c", pvCapacityPatch("2Gi", "1Gi")),
				claimStatusPatch("c", nodePendingPatch),
			},
			wantEvents:     []string{eventResize, eventFSReq},
			wantConditions: []string{"FileSystemResizePending"},
			wantStatus:     corev1.PersistentVolumeClaimNodeResizePending,
		},
		{
			name:      "driver that expands nowhere → nothing written, retried slowly",
			caps:      nodeOnlyCaps,
			objs:      []runtime.Object{claim("c", "2Gi", "1Gi"), volume("c", "1Gi")},
			wantErr:   "driver loopvol.csi.io expands volumes neither in its controller (EXPAND_VOLUME) nor on the node (node EXPAND_VOLUME)",
			wantFinal: true,
		},
		{
			name: "controllerExpandSecretRef → the Secret read with a GET and passed to the driver",
			caps: expandCaps,
			objs: []runtime.Object{
				claim("c", "2Gi", "1Gi"), volume("c", "1Gi", expandSecret("kube-system", "expand")),
				&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "expand"}, Data: map[string][]byte{"key": []byte("s3cret")}},
			},
			wantActions: []apiAction{
				claimStatusPatch("c", inProgressPatch("2Gi", timeJSON)),
				get("secrets", "kube-system", "expand"),
				volumePatchAction("pv-c", pvCapacityPatch("2Gi", "1Gi")),
				claimStatusPatch("c", nodePendingPatch),
			},
			wantCalls:      []expandCall{{VolumeID: "vol-c", RequiredBytes: 2 * gi, Capability: mountSNW, Secrets: map[string]string{"key": "s3cret"}}},
			wantEvents:     []string{eventResize, eventFSReq},
			wantConditions: []string{"FileSystemResizePending"},
			wantStatus:     corev1.PersistentVolumeClaimNodeResizePending,
		},
		{
			name: "missing Secret → Event, no driver call, retried (not final)",
			caps: expandCaps,
			objs: []runtime.Object{claim("c", "2Gi", "1Gi"), volume("c", "1Gi", expandSecret("kube-system", "expand"))},
			wantActions: []apiAction{
				claimStatusPatch("c", inProgressPatch("2Gi", timeJSON)),
				get("secrets", "kube-system", "expand"),
			},
			wantEvents:     []string{eventResize, `Warning VolumeResizeFailed resize of volume pv-c failed: get the controllerExpandSecretRef Secret kube-system/expand: secrets "expand" not found`},
			wantErr:        `resize of volume pv-c failed: get the controllerExpandSecretRef Secret kube-system/expand: secrets "expand" not found`,
			wantConditions: []string{"Resizing"},
			wantStatus:     corev1.PersistentVolumeClaimControllerResizeInProgress,
		},
		{
			name: "block volume, ReadWriteMany → block capability, multi-node writer",
			caps: expandCaps,
			objs: []runtime.Object{claim("c", "2Gi", "1Gi"), volume("c", "1Gi", func(pv *corev1.PersistentVolume) {
				m := corev1.PersistentVolumeBlock
				pv.Spec.VolumeMode = &m
				pv.Spec.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany}
			})},
			wantActions: []apiAction{
				claimStatusPatch("c", inProgressPatch("2Gi", timeJSON)),
				volumePatchAction("pv-c", pvCapacityPatch("2Gi", "1Gi")),
				claimStatusPatch("c", nodePendingPatch),
			},
			wantCalls:      []expandCall{{VolumeID: "vol-c", RequiredBytes: 2 * gi, Capability: "block/MULTI_NODE_MULTI_WRITER"}},
			wantEvents:     []string{eventResize, eventFSReq},
			wantConditions: []string{"FileSystemResizePending"},
			wantStatus:     corev1.PersistentVolumeClaimNodeResizePending,
		},
		{
			name: "capacity caught up with the volume → pre-resize annotation removed, nothing else",
			caps: expandCaps,
			objs: []runtime.Object{claim("c", "2Gi", "2Gi"), volume("c", "2Gi", withAnnotation(preResizeAnn, "1Gi"))},
			wantActions: []apiAction{
				volumePatchAction("pv-c", `{"metadata":{"annotations":{"`+preResizeAnn+`":null}}}`),
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
				f.eager = eager
				f.csi.answer, f.csi.nodeExpand = tc.answer, tc.nodeExpand
				f.queueAll()
				f.drain()
				// One sync: the controller's own writes coming back did not
				// queue the claim again.
				if len(f.errs) != 1 {
					t.Fatalf("%d syncs, want 1 (own writes must not queue the claim): %v", len(f.errs), f.errs)
				}
				err := f.errs[0]
				gotErr := ""
				if err != nil {
					gotErr = err.Error()
				}
				diff(t, "sync error", tc.wantErr, gotErr)
				if err != nil && isFinal(err) != tc.wantFinal {
					t.Errorf("isFinal(%v) = %v, want %v", err, isFinal(err), tc.wantFinal)
				}
				diff(t, "API actions", tc.wantActions, f.actions())
				diff(t, "driver calls", tc.wantCalls, f.csi.takeCalls())
				diff(t, "events", tc.wantEvents, f.events())
				pvc := f.pvc("c")
				diff(t, "conditions", tc.wantConditions, conditionTypes(pvc))
				diff(t, "allocatedResourceStatuses", tc.wantStatus, pvc.Status.AllocatedResourceStatuses[corev1.ResourceStorage])
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
		{name: "request equals capacity", objs: []runtime.Object{claim("c", "1Gi", "1Gi"), volume("c", "1Gi")}},
		{name: "request below capacity", objs: []runtime.Object{claim("c", "1Gi", "2Gi"), volume("c", "2Gi")}},
		{name: "claim not bound yet", objs: []runtime.Object{claim("c", "2Gi", "1Gi", pending), volume("c", "1Gi")}},
		{name: "claim without a volume name", objs: []runtime.Object{claim("c", "2Gi", "1Gi", func(p *corev1.PersistentVolumeClaim) { p.Spec.VolumeName = "" })}},
		{name: "volume of another driver", objs: []runtime.Object{claim("c", "2Gi", "1Gi"), volume("c", "1Gi", ofDriver("other.csi.io"))}},
		{name: "volume of another driver keeps its pre-resize annotation", objs: []runtime.Object{claim("c", "2Gi", "2Gi"), volume("c", "2Gi", ofDriver("other.csi.io"), withAnnotation(preResizeAnn, "1Gi"))}},
		{name: "volume without a CSI source", objs: []runtime.Object{claim("c", "2Gi", "1Gi"), volume("c", "1Gi", func(pv *corev1.PersistentVolume) { pv.Spec.CSI = nil })}},
		{name: "volume bound to another claim of that name (other UID)", objs: []runtime.Object{claim("c", "2Gi", "1Gi"), volume("c", "1Gi", func(pv *corev1.PersistentVolume) { pv.Spec.ClaimRef.UID = types.UID("older") })}},
		{name: "node expansion pending", objs: []runtime.Object{
			claim("c", "2Gi", "1Gi", allocated("2Gi", corev1.PersistentVolumeClaimNodeResizePending), condition(corev1.PersistentVolumeClaimFileSystemResizePending, "")),
			volume("c", "2Gi"),
		}},
		{name: "raised again while the node has not finished the last expansion", objs: []runtime.Object{
			claim("c", "3Gi", "1Gi", allocated("2Gi", corev1.PersistentVolumeClaimNodeResizeInProgress)),
			volume("c", "2Gi"),
		}},
		{name: "pre-resize annotation kept while the node has not caught up", objs: []runtime.Object{
			claim("c", "2Gi", "1Gi", allocated("2Gi", corev1.PersistentVolumeClaimNodeResizePending)),
			volume("c", "2Gi", withAnnotation(preResizeAnn, "1Gi")),
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, expandCaps, tc.objs)
			f.queueAll()
			f.drain()
			for _, err := range f.errs {
				if err != nil {
					t.Errorf("sync: %v", err)
				}
			}
			diff(t, "API actions", nil, f.actions())
			diff(t, "driver calls", nil, f.csi.takeCalls())
			diff(t, "events", nil, f.events())
		})
	}
}

// TestMissingVolume: a claim whose volume is in neither the cache nor the
// API server waits for it; the volume's arrival queues the claim.
func TestMissingVolume(t *testing.T) {
	f := newFixture(t, expandCaps, []runtime.Object{claim("c", "2Gi", "1Gi")})
	f.queueAll()
	f.drain()
	diff(t, "API actions", []apiAction{get("persistentvolumes", "", "pv-c")}, f.actions())
	if err := f.errs[0]; err != nil {
		t.Fatalf("sync: %v", err)
	}
	pv := volume("c", "1Gi")
	if err := f.client.Tracker().Add(pv); err != nil {
		t.Fatal(err)
	}
	f.cache(pv)
	f.c.volumeAdded(pv)
	f.drain()
	diff(t, "driver calls after the volume appeared", []expandCall{{VolumeID: "vol-c", RequiredBytes: 2 * gi, Capability: mountSNW}}, f.csi.takeCalls())
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
			f := newFixture(t, expandCaps, []runtime.Object{claim("c", "10Gi", "1Gi"), volume("c", "1Gi")})
			fail := true
			f.csi.answer = func(req *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
				if fail {
					return nil, tc.err
				}
				return &csi.ControllerExpandVolumeResponse{CapacityBytes: req.GetCapacityRange().GetRequiredBytes(), NodeExpansionRequired: true}, nil
			}
			f.queueAll()
			f.drain()
			_ = f.csi.takeCalls()
			_ = f.events()
			pvc := f.pvc("c")
			if got := pvc.Status.AllocatedResourceStatuses[corev1.ResourceStorage]; got != corev1.PersistentVolumeClaimControllerResizeInProgress {
				t.Fatalf("after the failure: resize status %q, want ControllerResizeInProgress", got)
			}

			// The user lowers the request.
			fail = false
			pvc.Spec.Resources.Requests[corev1.ResourceStorage] = *resourceQ("3Gi")
			if err := f.client.Tracker().Update(corev1.SchemeGroupVersion.WithResource("persistentvolumeclaims"), pvc, ns); err != nil {
				t.Fatal(err)
			}
			f.client.ClearActions()
			f.observe()
			f.drain()
			calls := f.csi.takeCalls()
			if len(calls) != 1 || calls[0].RequiredBytes != tc.wantSize {
				t.Fatalf("driver calls after the request was lowered: %+v, want one of %d bytes", calls, tc.wantSize)
			}
			pvc = f.pvc("c")
			if got := pvc.Status.AllocatedResources[corev1.ResourceStorage]; got.Value() != tc.wantSize {
				t.Errorf("allocatedResources %s, want %d bytes", got.String(), tc.wantSize)
			}
			diff(t, "conditions", []string{"FileSystemResizePending"}, conditionTypes(pvc))
		})
	}
}

// TestVolumeInUse: a driver that refused an expansion because the volume
// was in use (FAILED_PRECONDITION) is not called again while a running pod
// uses the claim; once the pod is gone it is.
func TestVolumeInUse(t *testing.T) {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "app"},
		Spec: corev1.PodSpec{Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "c"},
		}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
	for _, handle := range []bool{true, false} {
		t.Run(fmt.Sprintf("handle-volume-inuse-error=%v", handle), func(t *testing.T) {
			f := newFixture(t, expandCaps, []runtime.Object{claim("c", "2Gi", "1Gi"), volume("c", "1Gi"), pod},
				func(c *Config) { c.HandleVolumeInUseError = handle })
			inUse := true
			f.csi.answer = func(req *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
				if inUse {
					return nil, status.Error(codes.FailedPrecondition, "volume is published")
				}
				return &csi.ControllerExpandVolumeResponse{CapacityBytes: req.GetCapacityRange().GetRequiredBytes(), NodeExpansionRequired: true}, nil
			}
			f.queueAll()
			f.drain()
			if n := len(f.csi.takeCalls()); n != 1 {
				t.Fatalf("%d driver calls, want 1", n)
			}
			_ = f.events()
			f.client.ClearActions()

			// The retry while the pod runs.
			f.c.queue.Q.Add(ns + "/c")
			f.drain()
			calls := f.csi.takeCalls()
			if handle {
				diff(t, "driver calls while the pod runs", nil, calls)
				diff(t, "API actions while the pod runs", []apiAction{{Verb: "list", Resource: "pods", Namespace: ns}}, f.actions())
				diff(t, "events while the pod runs", []string{"Warning VolumeResizeFailed Unable to expand apps/c: driver loopvol.csi.io expands only volumes not in use, and a pod uses it"}, f.events())
			} else if len(calls) != 1 {
				t.Fatalf("driver calls while the pod runs, without the in-use handling: %d, want 1", len(calls))
			}

			// The pod ends; the driver can expand now.
			inUse = false
			pod := pod.DeepCopy()
			pod.Status.Phase = corev1.PodSucceeded
			if err := f.client.Tracker().Update(corev1.SchemeGroupVersion.WithResource("pods"), pod, ns); err != nil {
				t.Fatal(err)
			}
			f.c.queue.Q.Add(ns + "/c")
			f.drain()
			if n := len(f.csi.takeCalls()); n != 1 {
				t.Fatalf("driver calls after the pod ended: %d, want 1", n)
			}
			diff(t, "conditions", []string{"FileSystemResizePending"}, conditionTypes(f.pvc("c")))
		})
	}
}

// TestStaleCache: a sync that finds the cache older than the controller's
// own last write of the claim decides on the live claim; so does the sync
// after a write that conflicted with someone else's.
func TestStaleCache(t *testing.T) {
	f := newFixture(t, expandCaps, []runtime.Object{claim("c", "2Gi", "1Gi"), volume("c", "1Gi")})
	f.csi.answer = func(*csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
		return nil, status.Error(codes.Unavailable, "restarting")
	}
	f.queueAll()
	key, _ := f.c.queue.Q.Get()
	_ = f.c.sync(f.ctx, key) // marks the claim in progress; the cache does not see it
	f.c.queue.Q.Done(key)
	_ = f.csi.takeCalls()
	f.client.ClearActions()

	f.csi.answer = nil
	if err := f.c.sync(f.ctx, key); err != nil {
		t.Fatalf("sync: %v", err)
	}
	// The live claim says in progress with Resizing already: no second
	// in-progress write, straight to the driver.
	diff(t, "API actions", []apiAction{
		get("persistentvolumeclaims", ns, "c"),
		volumePatchAction("pv-c", pvCapacityPatch("2Gi", "1Gi")),
		claimStatusPatch("c", nodePendingPatch),
	}, f.actions())

	// Someone else writes the claim; the cache lags; the controller's
	// write conflicts, and its next sync reads the live claim.
	g := newFixture(t, expandCaps, []runtime.Object{claim("c", "2Gi", "1Gi"), volume("c", "1Gi")})
	live := g.pvc("c")
	live.ResourceVersion = "7"
	live.Labels = map[string]string{"someone": "else"}
	if err := g.client.Tracker().Update(corev1.SchemeGroupVersion.WithResource("persistentvolumeclaims"), live, ns); err != nil {
		t.Fatal(err)
	}
	err := g.c.sync(g.ctx, key)
	if err == nil || !strings.Contains(err.Error(), "the object has been modified") {
		t.Fatalf("sync on a stale cache: %v, want a conflict", err)
	}
	g.client.ClearActions()
	if err := g.c.sync(g.ctx, key); err != nil {
		t.Fatalf("sync after the conflict: %v", err)
	}
	acts := g.actions()
	if len(acts) == 0 || acts[0] != get("persistentvolumeclaims", ns, "c") {
		t.Errorf("the sync after a conflict did not read the live claim first: %+v", acts)
	}
	if n := len(g.csi.takeCalls()); n != 1 {
		t.Errorf("%d driver calls after the conflict, want 1", n)
	}
}

func TestMetrics(t *testing.T) {
	f := newFixture(t, expandCaps, []runtime.Object{
		claim("c", "2Gi", "1Gi"), volume("c", "1Gi"),
		claim("d", "2Pi", "1Gi"), volume("d", "1Gi"),
	})
	f.csi.answer = func(req *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
		if req.VolumeId == "vol-d" {
			return nil, status.Error(codes.OutOfRange, "too big")
		}
		return &csi.ControllerExpandVolumeResponse{CapacityBytes: req.GetCapacityRange().GetRequiredBytes()}, nil
	}
	f.queueAll()
	f.drain()
	want := `
# HELP loopvol_resizer_resize_errors_total Failed expansion attempts by gRPC code (None: failed before the driver answered, e.g. a missing Secret).
# TYPE loopvol_resizer_resize_errors_total counter
loopvol_resizer_resize_errors_total{grpc_status_code="OutOfRange"} 1
# HELP loopvol_resizer_resizes_total Volume expansions the controller finished its part of: the volume has its new capacity and the claim is handed to the node or done.
# TYPE loopvol_resizer_resizes_total counter
loopvol_resizer_resizes_total 1
`
	if err := testutil.GatherAndCompare(f.registry, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}

// TestNoExpandWithoutTheLease: a replica that can no longer be sure it
// holds its Lease does not call the driver; once it is sure again, the
// claim is expanded.
func TestNoExpandWithoutTheLease(t *testing.T) {
	f := newFixture(t, expandCaps, []runtime.Object{claim("c", "2Gi", "1Gi"), volume("c", "1Gi")})
	leading := false
	ctx := f.ctx
	f.ctx = kube.WithLeaderCheck(ctx, func() error {
		if !leading {
			return kube.ErrNotLeading
		}
		return nil
	})
	f.queueAll()
	f.drain()
	if calls := f.csi.takeCalls(); len(calls) != 0 {
		t.Fatalf("driver called while not sure of the Lease: %+v", calls)
	}
	for _, a := range f.actions() {
		if a.Verb != "get" {
			t.Fatalf("API write while not sure of the Lease: %+v", a)
		}
	}
	if err := f.errs[len(f.errs)-1]; !errors.Is(err, kube.ErrNotLeading) {
		t.Fatalf("sync: %v, want ErrNotLeading", err)
	}
	leading = true
	f.c.queue.ResetBackoff()
	f.queueAll()
	f.drain()
	diff(t, "driver calls once leading", []expandCall{{VolumeID: "vol-c", RequiredBytes: 2 * gi, Capability: mountSNW}}, f.csi.takeCalls())
}
