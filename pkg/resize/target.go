package resize

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/loopvol/loopvol/internal/kube"
)

// decision is what a sync of a claim that asks for more than its capacity
// does next.
type decision struct {
	// act: call the driver (or, for a driver that only expands on the
	// node, hand the volume to the node) with target. False: nothing to
	// do now, e.g. the node has not finished the last expansion.
	act    bool
	target resource.Quantity
	// retry: target is the size the claim's allocatedResources already
	// names, so this continues the operation recorded there rather than
	// starting a new one.
	retry bool
}

// decide picks the size to expand a bound claim's volume to, given the
// claim (whose request is above its capacity), the volume's current size,
// whether the last driver call for the claim ended in a final error (it is
// certainly not in progress in the driver) and whether the driver expands
// on the controller at all.
//
// The rules are those of the upstream external-resizer with
// RecoverVolumeExpansionFailure (GA): an operation recorded in
// allocatedResources whose outcome is uncertain is finished at its own
// size before the claim's current request is considered, because the
// driver may still be working on it; once an operation has failed for sure
// (a final error, or ControllerResizeInfeasible), the claim's request —
// which the user may have lowered again — is the target. Node expansion
// that is pending or running is left to finish first.
//
// One difference: upstream retries the recorded size of a failed operation
// (ControllerResizeInfeasible, or a final error in progress) even when the
// volume already holds the lowered request, which then never succeeds; here
// the lowered request is the target, and the driver call is a no-op that
// hands the volume to the node.
func decide(pvc *corev1.PersistentVolumeClaim, pvSize resource.Quantity, finalError, controllerExpansion bool) decision {
	request := pvc.Spec.Resources.Requests[corev1.ResourceStorage]
	status := pvc.Status.AllocatedResourceStatuses[corev1.ResourceStorage]
	allocated, hasAllocated := pvc.Status.AllocatedResources[corev1.ResourceStorage]
	orAllocated := func() resource.Quantity {
		if hasAllocated {
			return allocated
		}
		return request
	}
	target, act := request, true
	if pvSize.Cmp(request) < 0 {
		// The volume is smaller than the request: an expansion is due,
		// but an earlier one still in flight goes first.
		switch status {
		case corev1.PersistentVolumeClaimNodeResizeInfeasible:
			// The node failed for good: hand it the recorded size again
			// so that kubelet may retry it.
			target = orAllocated()
		case corev1.PersistentVolumeClaimNodeResizePending, corev1.PersistentVolumeClaimNodeResizeInProgress:
			target = orAllocated()
			// The controller part of that operation is done: let the
			// node finish it before the next one starts.
			act = pvSize.Cmp(target) < 0
		case corev1.PersistentVolumeClaimControllerResizeInProgress:
			if !finalError {
				target = orAllocated()
			}
		}
	} else {
		// The volume holds the request already.
		switch status {
		case corev1.PersistentVolumeClaimNodeResizePending, corev1.PersistentVolumeClaimNodeResizeInProgress:
			// Waiting for the node (a spurious event).
			act = false
		case corev1.PersistentVolumeClaimNodeResizeInfeasible:
			// The node failed for good: reset the claim so that kubelet
			// may retry.
			if controllerExpansion && hasAllocated {
				target = allocated
			}
		case corev1.PersistentVolumeClaimControllerResizeInProgress:
			// Expanded, but the outcome may not be recorded yet: finish
			// recording it at the recorded size, unless that size failed
			// for sure.
			if !finalError {
				target = orAllocated()
			}
		case corev1.PersistentVolumeClaimControllerResizeInfeasible:
			// The recorded size failed for sure: the request, which the
			// volume already holds, is what is left to do.
		default:
			switch {
			case hasAllocated:
				target = allocated
			case kube.ClaimHasCondition(pvc, corev1.PersistentVolumeClaimFileSystemResizePending):
				// An API server without allocatedResources: the
				// condition says the node's turn has come.
				act = false
			}
		}
	}
	return decision{act: act, target: target, retry: hasAllocated && allocated.Cmp(target) == 0}
}

// needsResize tells whether a claim asks for more than it has: bound, and
// its request above its capacity.
func needsResize(pvc *corev1.PersistentVolumeClaim) bool {
	if pvc.Status.Phase != corev1.ClaimBound || pvc.Spec.VolumeName == "" {
		return false
	}
	request := pvc.Spec.Resources.Requests[corev1.ResourceStorage]
	capacity := pvc.Status.Capacity[corev1.ResourceStorage]
	return request.Cmp(capacity) > 0
}
