package attach

import (
	"context"
	"fmt"
	"slices"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/loopvol/loopvol/pkg/csiclient"
)

// Reasons of the Events recorded on VolumeAttachments.
const (
	ReasonAttachFailed = "AttachFailed"
	ReasonDetachFailed = "DetachFailed"
)

// syncVA brings one VolumeAttachment to what its spec and deletion state
// ask. It returns nil when the object is gone or not this driver's.
func (c *Controller) syncVA(ctx context.Context, name string) error {
	va, err := c.vaLister.Get(name)
	if apierrors.IsNotFound(err) {
		c.state.drop(name)
		return nil
	}
	if err != nil {
		return err
	}
	if va.Spec.Attacher != c.cfg.DriverName {
		return nil
	}
	logger := klog.LoggerWithValues(klog.FromContext(ctx), "volumeAttachment", klog.KObj(va), "node", va.Spec.NodeName)
	ctx = klog.NewContext(ctx, logger)

	judged, force := c.state.forced(name)
	fresh := false
	if force || c.state.written.Stale(name, va.ResourceVersion) {
		// Decide on the live object: the reconcile judged a copy that may
		// have changed since, or the cache has not seen our last write yet.
		live, err := c.client.StorageV1().VolumeAttachments().Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			c.state.drop(name)
			return nil
		}
		if err != nil {
			return fmt.Errorf("read VolumeAttachment %q: %w", name, err)
		}
		// A reconcile verdict holds for the version it judged, and after
		// the controller's own writes since (a failed forced attempt
		// writes attachError); a change by anyone else voids it.
		own, _ := c.state.written.Last(name)
		force = force && (live.ResourceVersion == judged || live.ResourceVersion == own)
		va, fresh = live, true
	}

	caps := c.csi.Capabilities()
	if va.DeletionTimestamp != nil {
		err = c.detach(ctx, va, caps, fresh)
	} else {
		err = c.attach(ctx, va, caps, force, fresh)
	}
	if err == nil {
		c.state.clearForce(name)
	}
	return err
}

// attach publishes the volume of a live VolumeAttachment unless it is
// attached already (force: the reconcile found the driver disagreeing, so
// publish again anyway). fresh says va was just read from the API server,
// not from the cache.
func (c *Controller) attach(ctx context.Context, va *storagev1.VolumeAttachment, caps csiclient.Capabilities, force, fresh bool) error {
	logger := klog.FromContext(ctx)
	if !caps.PublishUnpublish {
		return c.attachWithoutDriver(ctx, va)
	}
	if va.Status.Attached && !force {
		logger.V(5).Info("Already attached")
		return nil
	}
	t, err := c.resolve(ctx, va, caps, forAttach)
	if err != nil {
		return c.attachFailed(ctx, va, err)
	}
	// Write order: PV finalizer, VA finalizer + node ID, then the driver.
	// Once the driver may have published the volume, both objects must stay
	// until it is unpublished, and the node ID must be known even if the
	// node's CSINode goes away.
	if t.pv != nil {
		if err := c.ensurePVFinalizer(ctx, t.pv); err != nil {
			return c.attachFailed(ctx, va, err)
		}
	}
	updated, patched, err := c.ensureVAMetadata(ctx, va, t.nodeID)
	if err != nil {
		return c.attachFailed(ctx, va, err)
	}
	va = updated
	if !patched && !fresh {
		// ControllerPublishVolume cannot be taken back: decide on the
		// object as it is now, not on a cached copy that may be long gone
		// (a replica that was paused, a cache that missed the deletion).
		// The metadata patch above carries a resourceVersion precondition
		// and proves the same when it was needed.
		live, err := c.liveVA(ctx, va)
		if err != nil || live == nil {
			return err
		}
		if live.DeletionTimestamp != nil || (live.Status.Attached && !force) {
			return nil // its update event queues what it needs
		}
		va = live
	}
	secrets, err := c.publishSecrets(ctx, t.secretRef)
	if err != nil {
		return c.attachFailed(ctx, va, err)
	}
	if err := c.stillLeading(ctx); err != nil {
		return err
	}
	logger.V(4).Info("Publishing volume", "volumeID", t.handle, "nodeID", t.nodeID, "readOnly", t.readOnly, "force", force)
	callCtx, timeout := c.callContext(ctx, va.Name)
	pc, err := c.csi.ControllerPublish(callCtx, &csi.ControllerPublishVolumeRequest{
		VolumeId:         t.handle,
		NodeId:           t.nodeID,
		VolumeCapability: t.capability,
		Readonly:         t.readOnly,
		Secrets:          secrets,
		VolumeContext:    t.attributes,
	})
	c.noteCallResult(ctx, va.Name, "ControllerPublishVolume", timeout, err)
	if err != nil {
		return c.attachFailed(ctx, va, err)
	}
	if data := attachedPatch(va, pc); data != nil {
		if _, err := c.patchVA(ctx, va.Name, types.MergePatchType, data, true); err != nil {
			// Published but not recorded: the next try publishes again
			// (idempotent) and records it.
			return fmt.Errorf("mark VolumeAttachment %q attached: %w", va.Name, err)
		}
	}
	c.metrics.attaches.Inc()
	logger.V(2).Info("Attached", "volumeID", t.handle, "nodeID", t.nodeID)
	return nil
}

// attachWithoutDriver marks a VolumeAttachment attached for a driver that
// has no ControllerPublishVolume: there is nothing to call and nothing to
// undo, so no finalizer either.
func (c *Controller) attachWithoutDriver(ctx context.Context, va *storagev1.VolumeAttachment) error {
	data := attachedPatch(va, va.Status.AttachmentMetadata)
	if data == nil {
		return nil
	}
	if _, err := c.patchVA(ctx, va.Name, types.MergePatchType, data, true); err != nil {
		return fmt.Errorf("mark VolumeAttachment %q attached: %w", va.Name, err)
	}
	c.metrics.attaches.Inc()
	klog.FromContext(ctx).V(2).Info("Attached without a CSI call: the driver does not publish volumes")
	return nil
}

// detach unpublishes the volume of a VolumeAttachment being deleted that
// still carries the finalizer, then removes the finalizer. fresh says va
// was just read from the API server.
func (c *Controller) detach(ctx context.Context, va *storagev1.VolumeAttachment, caps csiclient.Capabilities, fresh bool) error {
	logger := klog.FromContext(ctx)
	if !slices.Contains(va.Finalizers, c.finalizer) {
		logger.V(5).Info("Already detached")
		return nil
	}
	var t *target
	if caps.PublishUnpublish {
		var err error
		if t, err = c.resolve(ctx, va, caps, forDetach); err != nil {
			return c.detachFailed(ctx, va, err)
		}
		if !fresh {
			// As for a publish: unpublish only what the object still
			// asks for now. A copy from the cache may be of an object
			// that another replica detached and the attach/detach
			// controller created again for the same volume and node.
			live, err := c.liveVA(ctx, va)
			if err != nil || live == nil {
				return err
			}
			if !slices.Contains(live.Finalizers, c.finalizer) {
				logger.V(5).Info("Already detached")
				return nil
			}
			va = live
		}
		secrets, err := c.publishSecrets(ctx, t.secretRef)
		if err != nil {
			return c.detachFailed(ctx, va, err)
		}
		if err := c.stillLeading(ctx); err != nil {
			return err
		}
		logger.V(4).Info("Unpublishing volume", "volumeID", t.handle, "nodeID", t.nodeID)
		callCtx, timeout := c.callContext(ctx, va.Name)
		err = c.csi.ControllerUnpublish(callCtx, &csi.ControllerUnpublishVolumeRequest{
			VolumeId: t.handle,
			NodeId:   t.nodeID,
			Secrets:  secrets,
		})
		c.noteCallResult(ctx, va.Name, "ControllerUnpublishVolume", timeout, err)
		if err != nil {
			return c.detachFailed(ctx, va, err)
		}
	}
	// The finalizer goes first, the status after (only if the object stays,
	// held by another finalizer). A deleting VolumeAttachment without our
	// finalizer is detached whatever its status says; the other order would
	// leave "attached: false" with the finalizer, which looks like an attach
	// that timed out and costs a second ControllerUnpublishVolume.
	out, err := c.removeVAFinalizer(ctx, va)
	if err != nil {
		return err // unpublished; the next try unpublishes again (idempotent)
	}
	if out != nil {
		if data := detachedPatch(out); data != nil {
			if _, err := c.patchVA(ctx, va.Name, types.MergePatchType, data, true); err != nil && !apierrors.IsNotFound(err) {
				logger.Error(err, "Marking the VolumeAttachment detached failed; its finalizer is gone, so it is detached anyway")
			}
		}
	}
	c.metrics.detaches.Inc()
	if t != nil {
		logger.V(2).Info("Detached", "volumeID", t.handle, "nodeID", t.nodeID)
	} else {
		logger.V(2).Info("Detached without a CSI call: the driver does not publish volumes")
	}
	c.wakeBlockedBy(va)
	return nil
}

// attachFailed records an attach failure in the status and as an Event,
// and returns cause for the retry.
func (c *Controller) attachFailed(ctx context.Context, va *storagev1.VolumeAttachment, cause error) error {
	code := c.recordFailure(ctx, va, cause, "attachError", ReasonAttachFailed)
	c.metrics.attachErrors.WithLabelValues(code).Inc()
	return cause
}

// detachFailed records a detach failure in the status and as an Event, and
// returns cause for the retry.
func (c *Controller) detachFailed(ctx context.Context, va *storagev1.VolumeAttachment, cause error) error {
	code := c.recordFailure(ctx, va, cause, "detachError", ReasonDetachFailed)
	c.metrics.detachErrors.WithLabelValues(code).Inc()
	return cause
}

// recordFailure writes cause to the status field (attachError or
// detachError) with its gRPC code, records an Event, and returns the code's
// metric label.
func (c *Controller) recordFailure(ctx context.Context, va *storagev1.VolumeAttachment, cause error, field, reason string) string {
	ve := &storagev1.VolumeError{Message: cause.Error(), Time: metav1.NewTime(c.clock.Now())}
	label := noCode
	if code, ok := csiclient.Code(cause); ok {
		n := int32(code)
		ve.ErrorCode = &n
		label = code.String()
	}
	if err := c.stillLeading(ctx); err != nil {
		// Another replica may own the object now: write nothing.
		return label
	}
	if _, err := c.patchVA(ctx, va.Name, types.MergePatchType, statusPatch{field: ve}.bytes(), true); err != nil {
		klog.FromContext(ctx).Error(err, "Saving the error in the VolumeAttachment status failed", "field", field)
	}
	c.recorder.Event(va, corev1.EventTypeWarning, reason, cause.Error())
	return label
}

// liveVA reads va from the API server. It returns nil (and no error) when
// the object is gone or is another object of the same name (then its state
// is forgotten).
func (c *Controller) liveVA(ctx context.Context, va *storagev1.VolumeAttachment) (*storagev1.VolumeAttachment, error) {
	live, err := c.client.StorageV1().VolumeAttachments().Get(ctx, va.Name, metav1.GetOptions{})
	c.api.Observe(err)
	switch {
	case apierrors.IsNotFound(err):
		klog.FromContext(ctx).V(4).Info("VolumeAttachment is gone; its cached copy was stale")
		c.forget(va.Name)
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("read VolumeAttachment %q: %w", va.Name, err)
	case live.UID != va.UID:
		klog.FromContext(ctx).V(4).Info("VolumeAttachment was replaced by another of the same name; its cached copy was stale")
		return nil, nil
	}
	return live, nil
}

// wakeBlockedBy queues, after va was detached, the VolumeAttachments whose
// attach failed on the same volume or node: the detach may have removed
// what blocked them (a single-node volume attached elsewhere, a node at its
// attachment limit). They would otherwise wait out their backoff.
func (c *Controller) wakeBlockedBy(va *storagev1.VolumeAttachment) {
	var candidates []any
	if pv := va.Spec.Source.PersistentVolumeName; pv != nil {
		objs, _ := c.vaIndexer.ByIndex(indexByPV, *pv)
		candidates = append(candidates, objs...)
	}
	objs, _ := c.vaIndexer.ByIndex(indexByNode, va.Spec.NodeName)
	candidates = append(candidates, objs...)
	for _, obj := range candidates {
		other, ok := obj.(*storagev1.VolumeAttachment)
		if !ok || other.Name == va.Name || other.DeletionTimestamp != nil ||
			other.Status.Attached || other.Status.AttachError == nil {
			continue
		}
		c.enqueueVA(other)
	}
}
