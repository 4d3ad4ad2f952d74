// Package resize is the volume expansion controller of the loopvol
// sidecar: a drop-in replacement for the upstream external-resizer's
// resize controller.
//
// For every PersistentVolumeClaim bound to a PersistentVolume of the driver
// (spec.csi.driver) whose storage request is above its capacity, it grows
// the volume and reports the outcome on both objects:
//
//  1. decide the target size (decide): the claim's request, unless an
//     earlier expansion recorded in status.allocatedResources may still be
//     in progress in the driver, or the node has not finished the last
//     one;
//  2. record the operation in the claim's status (allocatedResources,
//     allocatedResourceStatuses ControllerResizeInProgress, condition
//     Resizing) before the driver is called;
//  3. call ControllerExpandVolume with the volume's capability and the
//     controllerExpandSecretRef secrets (read with a GET, never cached or
//     logged); a driver without the controller's EXPAND_VOLUME whose node
//     expands volumes is not called at all;
//  4. patch the volume's spec.capacity (and the pre-resize capacity
//     annotation when the node still has work to do);
//  5. when the driver says node_expansion_required, hand the claim to
//     kubelet (NodeResizePending, condition FileSystemResizePending);
//     otherwise set the claim's capacity and clear the resize status.
//
// A failure is reported as a VolumeResizeFailed Event. A final one also as
// the ControllerResizeError condition with the driver's message, and an
// infeasible one (INVALID_ARGUMENT, OUT_OF_RANGE, NOT_FOUND) as
// ControllerResizeInfeasible: the user may then lower the request (to no
// less than the capacity) and the controller expands to that instead
// (RecoverVolumeExpansionFailure, GA since Kubernetes 1.34). An error
// whose outcome is uncertain (a timeout, ABORTED, RESOURCE_EXHAUSTED) is
// retried at the recorded size: the driver may still be working on it.
//
// Every step is idempotent and recorded before the next starts, so a
// restart in the middle of an expansion finishes it. Writes are patches of
// what changed (claims through the status subresource, with a
// resourceVersion precondition), and the controller's own writes coming
// back as watch events do not queue the claim again, so they never cut a
// backoff short.
//
// One queue, named "<driver>-pvc" as upstream's, with exponential backoff
// per claim; final errors wait at least 32 initial retry intervals. The
// work loop, its handlers, the claim and volume caches and reads, and the
// record of the controller's own writes are kube.ClaimQueue, which the
// modify controller (pkg/modify) runs on too; what stays here is the
// expansion. The Lease,
// annotations, Event reasons and condition types are upstream's.
package resize
