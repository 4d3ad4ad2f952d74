// Package attach is the VolumeAttachment controller of the loopvol sidecar:
// a drop-in replacement for the upstream external-attacher.
//
// For every VolumeAttachment whose spec.attacher is the driver's name it
// makes the driver's view (ControllerPublishVolume /
// ControllerUnpublishVolume) match the object, and reports the outcome in
// the object's status. Finalizers, the node-ID annotation, the Lease and the
// metric names are the upstream ones, so a cluster can switch between the
// two in either direction.
//
// Attach, for a live VolumeAttachment that is not attached:
//
//  1. resolve the volume (PersistentVolume or inline CSI source), its
//     capability, readonly flag, publish secret reference and the node's CSI
//     node ID (CSINode, else the node-ID annotation);
//  2. refuse a PersistentVolume that is being deleted;
//  3. add the finalizer to the PersistentVolume (JSON patch with a test op, so
//     a stale cache never drops another controller's finalizer);
//  4. add the finalizer and the node-ID annotation to the VolumeAttachment in
//     one merge patch (resourceVersion precondition);
//  5. call ControllerPublishVolume once;
//  6. write attached, attachmentMetadata and a cleared attachError with one
//     patch of the status subresource.
//
// Detach, for a VolumeAttachment being deleted that still carries the
// finalizer: ControllerUnpublishVolume, then the finalizer goes in one patch
// (and the status is patched only if the object stays, held by other
// finalizers). The PersistentVolume finalizer goes once the volume is being
// deleted and no VolumeAttachment refers to it.
//
// Failures are written to attachError / detachError (message, time, gRPC
// code) and reported as an Event. Each object retries with its own
// exponential backoff; update events caused only by the controller's own
// writes are not queued again, so they never cut a backoff short. Final
// errors (see csiclient.IsFinal; also a bad spec or a PersistentVolume being
// deleted) wait at least 32 initial retry intervals before the next try,
// unless a detach on the same volume or node, or a node's CSINode getting
// the driver, frees what blocked them.
//
// Work is split into three queues: csi-attacher-va (attaches),
// csi-attacher-va-detach (detaches) and csi-attacher-pv (PersistentVolume
// finalizers), each with its own workers, so a burst of detaches never
// starves attaches. A VolumeAttachment is processed by one worker at a time
// whichever queue holds it.
//
// A periodic reconcile (drivers with LIST_VOLUMES and
// LIST_VOLUMES_PUBLISHED_NODES) compares ListVolumes published_node_ids with
// the VolumeAttachments the controller believes done, and sends those that
// disagree through the normal sync: it re-publishes what a live object wants
// and corrects a status the driver contradicts. It never unpublishes. A sync
// it asks for reads the object afresh and acts only if the object has not
// changed since it was judged.
//
// The cache is never trusted over the controller's own writes: when a
// cached copy is older than the controller's last write of that object
// (resourceVersions compare), the sync reads the live object, so a late
// watch event never causes a second ControllerPublishVolume.
//
// Drivers without PUBLISH_UNPUBLISH_VOLUME get their VolumeAttachments
// marked attached with no CSI call and no finalizer.
package attach
