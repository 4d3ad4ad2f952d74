// Package modify is the VolumeAttributesClass modify controller of the
// loopvol sidecar: a drop-in replacement for the upstream
// external-resizer's (pkg/modifycontroller). cmd/attacher runs it with the
// resize controller (pkg/resize) under the resizer's Lease, as upstream's
// one binary runs both.
//
// It owns the modification of a bound claim's volume to the
// VolumeAttributesClass the claim asks for (spec.volumeAttributesClassName):
// reading the class, recording the operation in the claim's
// status.modifyVolumeStatus and conditions before the driver is called,
// ControllerModifyVolume with the class's parameters as mutable_parameters
// (and the modify Secret, read with a GET, never cached or logged), then
// the class on the PersistentVolume and in the claim's
// status.currentVolumeAttributesClassName. Controller says what each
// outcome of the driver leads to; the Event reasons, condition types,
// status values and messages are upstream's.
//
// What it keeps between syncs of a claim is its own (modifyState: an
// uncertain outcome whose target is kept, an infeasible class not tried
// again before the maximum retry interval); the work loop, the claim and
// volume caches, the record of its own writes and the writes themselves
// are the claim controllers' shared kube.ClaimQueue, so that its status
// writes coming back from the watch never queue a claim again and never
// cut a backoff short. Its queue is named "<driver>-pvc-modify"
// (QueueName); its metrics are loopvol_resizer_modifies_total and
// loopvol_resizer_modify_errors_total{grpc_status_code}.
package modify
