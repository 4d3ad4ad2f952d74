package resize

import (
	"context"
	"errors"
	"fmt"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/klog/v2"

	"github.com/loopvol/loopvol/internal/kube"
	"github.com/loopvol/loopvol/pkg/csiclient"
)

// sync brings one claim's volume to the size the claim asks for, as far as
// the controller's part goes. It returns nil when there is nothing to do:
// the claim is gone, not bound, not this driver's, or not asking for more.
func (c *Controller) sync(ctx context.Context, key string) error {
	pvc, pv, err := c.claims.ClaimAndVolume(ctx, key, nil)
	if err != nil || pv == nil {
		return err
	}
	logger := klog.LoggerWithValues(klog.FromContext(ctx), "persistentVolumeClaim", klog.KObj(pvc), "persistentVolume", klog.KObj(pv))
	ctx = klog.NewContext(ctx, logger)

	dropAnnotation, resize := preResizeCaughtUp(pvc, pv), needsResize(pvc)
	if !dropAnnotation && !resize {
		logger.V(5).Info("Claim needs no expansion")
		return nil
	}
	if mine, err := c.claims.OnNode(ctx, pv); err != nil || !mine {
		return err
	}
	if dropAnnotation {
		if err := c.dropPreResizeAnnotation(ctx, pv); err != nil {
			return err
		}
	}
	if !resize {
		return nil
	}
	if ref := pv.Spec.ClaimRef; ref == nil || ref.Namespace != pvc.Namespace || ref.UID != pvc.UID {
		logger.V(4).Info("The PersistentVolume is not bound to this claim; not expanding")
		return nil
	}
	caps := c.csi.Capabilities()
	controllerExpansion := caps.ExpandVolume
	if !controllerExpansion {
		ok, err := c.nodeExpands(ctx)
		if err != nil {
			return err
		}
		if !ok {
			return kube.Permanent(fmt.Errorf("driver %s expands volumes neither in its controller (EXPAND_VOLUME) nor on the node (node EXPAND_VOLUME)", c.cfg.DriverName))
		}
	}
	d := decide(pvc, pv.Spec.Capacity[corev1.ResourceStorage], c.state.hasFinalError(key), controllerExpansion)
	if !d.act {
		logger.V(4).Info("Waiting for the node to finish the last expansion",
			"resizeStatus", pvc.Status.AllocatedResourceStatuses[corev1.ResourceStorage])
		return nil
	}
	return c.expand(ctx, key, pvc, pv, d, caps)
}

// nodeExpands asks the driver whether its node service expands volumes
// (node EXPAND_VOLUME).
func (c *Controller) nodeExpands(ctx context.Context) (bool, error) {
	rsp, err := c.csi.NodeGetCapabilities(ctx)
	if err != nil {
		return false, err
	}
	for _, cp := range rsp.GetCapabilities() {
		if cp.GetRpc().GetType() == csi.NodeServiceCapability_RPC_EXPAND_VOLUME {
			return true, nil
		}
	}
	return false, nil
}

// expand runs one expansion step of a claim to d.target:
//
//  1. record the operation in the claim's status (allocatedResources,
//     ControllerResizeInProgress, condition Resizing) before the driver
//     is called, so that a restart, or a user who lowers the request
//     meanwhile, finds the operation the driver may be working on;
//  2. call ControllerExpandVolume (none for a driver that expands only
//     on the node);
//  3. give the PersistentVolume its new capacity;
//  4. hand the claim to the node (NodeResizePending, condition
//     FileSystemResizePending), or finish it (capacity, no resize
//     status or conditions).
//
// The volume goes before the claim: kubelet grows the filesystem to the
// volume's capacity once the claim says NodeResizePending, and a crash
// between the two leaves a claim still in progress, whose next sync calls
// the driver again (a no-op) and records the outcome.
func (c *Controller) expand(ctx context.Context, key string, pvc *corev1.PersistentVolumeClaim, pv *corev1.PersistentVolume, d decision, caps csiclient.Capabilities) error {
	logger := klog.FromContext(ctx)
	// Neither the claim nor the driver is touched by a replica that may
	// have lost its Lease (checked again before the driver call).
	if err := kube.StillLeading(ctx); err != nil {
		return err
	}
	pvc, err := c.patchClaim(ctx, pvc, false, func(p *corev1.PersistentVolumeClaim) { markInProgress(p, d, c.clock.Now()) })
	if err != nil {
		return fmt.Errorf("mark PersistentVolumeClaim %s as resizing: %w", key, err)
	}
	uid := string(pvc.UID)
	if c.cfg.HandleVolumeInUseError && c.state.hadInUseError(uid) {
		inUse, err := c.claimInUse(ctx, pvc)
		if err != nil {
			return err
		}
		if inUse {
			// Calling the driver again would only fail the same way.
			msg := fmt.Sprintf("Unable to expand %s: driver %s expands only volumes not in use, and a pod uses it", key, c.cfg.DriverName)
			c.claims.Recorder.Event(pvc, corev1.EventTypeWarning, ReasonResizeFailed, msg)
			return errors.New(msg)
		}
	}
	c.claims.Recorder.Event(pvc, corev1.EventTypeNormal, ReasonResizing, fmt.Sprintf("External resizer is resizing volume %s", pv.Name))
	c.state.setInUse(uid, false)
	size, nodeNeeded, err := c.resizeVolume(ctx, pv, d.target, caps)
	if err != nil {
		return c.failed(ctx, key, pvc, pv, err)
	}
	c.state.setFinalError(key, false)
	var preResize *resource.Quantity
	if cur, ok := pvc.Status.Capacity[corev1.ResourceStorage]; ok && nodeNeeded && c.cfg.AnnotatePreResizeCapacity {
		preResize = &cur
	}
	if err := c.patchVolume(ctx, pv, volumePatch(pv, size, preResize)); err != nil {
		return fmt.Errorf("set the capacity of PersistentVolume %s to %s: %w", pv.Name, size.String(), err)
	}
	now := c.clock.Now()
	if nodeNeeded {
		if _, err := c.patchClaim(ctx, pvc, true, func(p *corev1.PersistentVolumeClaim) { markNodePending(p, now) }); err != nil {
			return fmt.Errorf("mark PersistentVolumeClaim %s for node expansion: %w", key, err)
		}
		c.claims.Recorder.Event(pvc, corev1.EventTypeNormal, ReasonFileSystemResizeRequired, "Require file system resize of volume on node")
		logger.V(2).Info("Expanded volume; the node grows the filesystem", "size", size.String())
	} else {
		if _, err := c.patchClaim(ctx, pvc, true, func(p *corev1.PersistentVolumeClaim) { markFinished(p, size, now) }); err != nil {
			return fmt.Errorf("mark PersistentVolumeClaim %s as resized: %w", key, err)
		}
		c.claims.Recorder.Event(pvc, corev1.EventTypeNormal, ReasonResizeSuccessful, "Resize volume succeeded")
		logger.V(2).Info("Expanded volume", "size", size.String())
	}
	c.claims.Metrics.Done.Inc()
	return nil
}

// resizeVolume asks the driver to grow pv to target, and returns the size
// it reports and whether the node must expand the volume too. A driver
// without ControllerExpandVolume is not called: the node does it all.
func (c *Controller) resizeVolume(ctx context.Context, pv *corev1.PersistentVolume, target resource.Quantity, caps csiclient.Capabilities) (resource.Quantity, bool, error) {
	if !caps.ExpandVolume {
		return target, true, nil
	}
	src := pv.Spec.CSI
	if src.VolumeHandle == "" {
		return target, false, kube.Permanent(errors.New("the PersistentVolume's CSI source has an empty volumeHandle"))
	}
	capability, err := kube.VolumeCapability(&pv.Spec, caps.SingleNodeMultiWriter, "")
	if err != nil {
		return target, false, kube.Permanent(err)
	}
	secrets, err := kube.ReadSecret(ctx, c.client, src.ControllerExpandSecretRef, "controllerExpandSecretRef")
	if err != nil {
		return target, false, err
	}
	// A replica that may have lost its Lease leaves the driver alone: the
	// new leader is about to act on the same claim.
	if err := kube.StillLeading(ctx); err != nil {
		return target, false, err
	}
	klog.FromContext(ctx).V(4).Info("Expanding volume", "volumeID", src.VolumeHandle, "requiredBytes", target.Value())
	rsp, err := c.csi.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{
		VolumeId:         src.VolumeHandle,
		CapacityRange:    &csi.CapacityRange{RequiredBytes: target.Value()},
		Secrets:          secrets,
		VolumeCapability: capability,
	})
	if err != nil {
		return target, false, err
	}
	if rsp.GetCapacityBytes() <= 0 {
		// The driver did not say: it grew the volume to at least the
		// request.
		return target, rsp.GetNodeExpansionRequired(), nil
	}
	return *resource.NewQuantity(rsp.GetCapacityBytes(), resource.BinarySI), rsp.GetNodeExpansionRequired(), nil
}

// failed records a failed expansion attempt: an Event always; for a final
// error also the ControllerResizeError condition with the error, and for an
// infeasible request (INVALID_ARGUMENT, OUT_OF_RANGE, NOT_FOUND)
// ControllerResizeInfeasible, which lets the user lower the request again.
// It returns cause for the retry.
func (c *Controller) failed(ctx context.Context, key string, pvc *corev1.PersistentVolumeClaim, pv *corev1.PersistentVolume, cause error) error {
	code, hasCode := c.claims.Metrics.Failed(cause)
	if hasCode && code == codes.FailedPrecondition {
		c.state.setInUse(string(pvc.UID), true)
	}
	final := hasCode && csiclient.IsFinal(cause)
	c.state.setFinalError(key, final)
	err := fmt.Errorf("resize of volume %s failed: %w", pv.Name, cause)
	msg := err.Error()
	if final {
		infeasible := code == codes.InvalidArgument || code == codes.OutOfRange || code == codes.NotFound
		now := c.clock.Now()
		if _, err := c.patchClaim(ctx, pvc, true, func(p *corev1.PersistentVolumeClaim) { markFailed(p, msg, infeasible, now) }); err != nil {
			klog.FromContext(ctx).Error(err, "Recording the failed expansion in the claim's status failed")
		}
	}
	c.claims.Recorder.Event(pvc, corev1.EventTypeWarning, ReasonResizeFailed, msg)
	return err
}
