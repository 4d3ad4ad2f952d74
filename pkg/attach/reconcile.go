package attach

import (
	"context"
	"slices"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/klog/v2"
)

// reconcile compares the driver's ListVolumes published_node_ids with the
// VolumeAttachments the controller believes done (live, seen by its event
// handlers, not pending, not written since the driver was asked) and sends
// every one that disagrees through the normal sync, marked so that it
// publishes again even when its status says attached. A live object wants
// its volume attached and published; so both "status attached, driver has
// no record" (the driver lost it) and "status not attached" (someone
// changed it by hand) are repaired by publishing, which is idempotent. A
// volume a VolumeAttachment wants is never unpublished here: the
// attach/detach controller decides that, by deleting the object. What no
// VolumeAttachment wants at all is unpublished after a grace period
// (repairLeaks).
func (c *Controller) reconcile(ctx context.Context) {
	logger := klog.LoggerWithName(klog.FromContext(ctx), "reconcile")
	ctx = klog.NewContext(ctx, logger)
	if !c.api.Up() {
		logger.V(4).Info("Skipped: the API server is unreachable")
		return
	}
	caps := c.csi.Capabilities()
	if !caps.PublishUnpublish || !caps.CanListPublished() {
		logger.V(5).Info("Skipped: the driver cannot list where volumes are published")
		return
	}
	// Anything the controller writes after this instant may not be in the
	// driver's answer; such objects are judged at the next pass.
	asked := c.clock.Now()
	published, err := c.csi.ListVolumes(ctx)
	if err != nil {
		logger.Error(err, "Listing the driver's volumes failed; reconcile skipped")
		return
	}
	vas, err := c.vaLister.List(labels.Everything())
	if err != nil {
		logger.Error(err, "Listing VolumeAttachments failed; reconcile skipped")
		return
	}
	repaired := 0
	for _, va := range vas {
		// Judged only once the handlers have this version: the cache
		// holds a new object before its add event queues it, and a
		// burst of them can wait there past a pass.
		_, wrote := c.state.written.Last(va.Name)
		if va.Spec.Attacher != c.cfg.DriverName || va.DeletionTimestamp != nil ||
			!c.state.isDelivered(va.Name, va.ResourceVersion) ||
			c.pending.has(va.Name) || !wrote.Before(asked) ||
			c.state.written.Stale(va.Name, va.ResourceVersion) {
			continue
		}
		t, err := c.resolve(ctx, va, caps, forReconcile)
		if err != nil {
			logger.V(4).Info("Skipped a VolumeAttachment that does not resolve", "volumeAttachment", klog.KObj(va), "err", err)
			continue
		}
		onNode := slices.Contains(published[t.handle], t.nodeID)
		if va.Status.Attached && onNode {
			continue
		}
		logger.Info("VolumeAttachment disagrees with the driver; syncing it again",
			"volumeAttachment", klog.KObj(va), "volumeID", t.handle, "nodeID", t.nodeID,
			"attached", va.Status.Attached, "publishedOnNode", onNode)
		c.state.setForce(va.Name, va.ResourceVersion)
		c.enqueueVA(va)
		repaired++
	}
	c.metrics.reconcileRepairs.Add(float64(repaired))
	logger.V(4).Info("Reconciled VolumeAttachments with the driver", "volumes", len(published), "volumeAttachments", len(vas), "resynced", repaired)
	c.repairLeaks(ctx, published, vas)
}
