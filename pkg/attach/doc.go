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
// and corrects a status the driver contradicts. A sync it asks for reads the
// object afresh and acts only if the object has not changed since it was
// judged.
//
// The reconcile also repairs leaked publications: a volume the driver lists
// as published to a node while no VolumeAttachment wants it there (left by a
// replica that acted after losing its Lease). The rule is conservative: a
// volume that any VolumeAttachment of the driver names on that node (live or
// being deleted, of any node-deployment node), or names with a node ID that
// is not known, is never touched; nothing is judged while a VolumeAttachment
// names a PersistentVolume that is not known; the publication must be seen
// unwanted by passes at least the grace period apart (Config.LeakGrace,
// twice the reconcile period by default), and right before
// ControllerUnpublishVolume the VolumeAttachments are listed from the API
// server and the rule is applied again.
//
// Split brain: every ControllerPublishVolume, ControllerUnpublishVolume and
// status write is preceded by kube.StillLeading (under leader election the
// replica stops acting once its last Lease renewal is a lease duration old,
// even before the elector notices), and a publish or unpublish decides on
// the object as the API server has it: the metadata patch with its
// resourceVersion precondition, or a GET when no patch was needed. A copy
// from the cache of an object that is gone or replaced is never acted on.
//
// API server outages: workers wait while the API server is unreachable
// (kube.APIHealth), since a driver call whose outcome cannot be recorded
// would only be made again, and what failed meanwhile is retried at once
// when it is back, not after its backoff.
//
// A driver call that times out doubles the next call's timeout for that
// VolumeAttachment, up to TimeoutGrowthLimit × Config.Timeout; the first
// timeout is logged at level 0 and each is counted.
//
// Per-object state (pending work, own writes, reconcile verdicts, grown
// timeouts, locks, failures, leak candidates) is dropped when the object
// goes, whatever the order of events; loopvol_attacher_tracked_objects
// shows its size.
//
// The cache is never trusted over the controller's own writes: when a
// cached copy is older than the controller's last write of that object
// (resourceVersions compare), the sync reads the live object, so a late
// watch event never causes a second ControllerPublishVolume.
//
// Drivers without PUBLISH_UNPUBLISH_VOLUME get their VolumeAttachments
// marked attached with no CSI call and no finalizer.
package attach
