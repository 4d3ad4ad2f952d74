package modify

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/loopvol/loopvol/internal/kube"
	"github.com/loopvol/loopvol/pkg/csiclient"
)

// sync brings one claim's volume to the VolumeAttributesClass the claim
// asks for. It returns nil when there is nothing to do: the claim is gone,
// not bound, not this driver's, or has its class.
func (c *Controller) sync(ctx context.Context, key string) error {
	pvc, pv, err := c.claims.ClaimAndVolume(ctx, key, bound)
	if err != nil || pv == nil {
		return err
	}
	if ref := pv.Spec.ClaimRef; ref == nil || ref.Namespace != pvc.Namespace || ref.Name != pvc.Name || ref.UID != pvc.UID {
		return nil // the volume is not (or no longer) this claim's
	}
	logger := klog.LoggerWithValues(klog.FromContext(ctx), "persistentVolumeClaim", klog.KObj(pvc), "persistentVolume", klog.KObj(pv))
	ctx = klog.NewContext(ctx, logger)

	want := ptr.Deref(pvc.Spec.VolumeAttributesClassName, "")
	current := ptr.Deref(pvc.Status.CurrentVolumeAttributesClassName, "")
	st := pvc.Status.ModifyVolumeStatus
	if st == nil && want == current {
		logger.V(5).Info("Claim has its VolumeAttributesClass")
		return nil
	}
	if mine, err := c.claims.OnNode(ctx, pv); err != nil || !mine {
		return err
	}
	// The same infeasible class is not tried again before
	// RetryIntervalMax; a new class is tried at once.
	if left, ok := c.mods.recentlyInfeasible(key, pvc, c.claims.Clock.Now(), c.cfg.RetryIntervalMax); ok {
		return kube.Permanent(fmt.Errorf("modifying to VolumeAttributesClass %s was infeasible; the driver is asked again in %s, or at once when the claim's class changes",
			st.TargetVolumeAttributesClassName, left.Round(time.Second)))
	}
	inProgress := st != nil && st.Status == corev1.PersistentVolumeClaimModifyVolumeInProgress
	if want == "" && !inProgress {
		// The user took the class back before it was applied (the API
		// server allows that only while no class was ever applied).
		return c.rolledBack(ctx, pvc)
	}
	if !c.cfg.CSI.Capabilities().ModifyVolume {
		return kube.Permanent(fmt.Errorf("driver %s does not offer MODIFY_VOLUME (ControllerModifyVolume)", c.cfg.DriverName))
	}
	if (inProgress && c.mods.uncertain(key)) || want == "" {
		// The driver may still be applying the recorded target: finish it
		// before anything else, whatever the claim asks for now.
		vac, err := c.class(pvc, st.TargetVolumeAttributesClassName)
		if err != nil {
			return err
		}
		logger.V(4).Info("Continuing a modification whose outcome is not known", "volumeAttributesClass", vac.Name)
		return c.modifyTo(ctx, key, pvc, pv, vac)
	}
	vac, err := c.class(pvc, want)
	if apierrors.IsNotFound(err) {
		if _, err := c.patchClaim(ctx, pvc, false, func(p *corev1.PersistentVolumeClaim) { markModifyPending(p, want) }); err != nil {
			return fmt.Errorf("mark the modification of PersistentVolumeClaim %s as pending: %w", key, err)
		}
		logger.V(2).Info("VolumeAttributesClass does not exist; the modification is pending", "volumeAttributesClass", want)
		return nil
	}
	if err != nil {
		return err
	}
	if vac.DriverName != c.cfg.DriverName {
		return c.modifyFailed(ctx, key, pvc, vac, otherDriver(vac, c.cfg.DriverName))
	}
	if err := kube.StillLeading(ctx); err != nil {
		return err
	}
	pvc, err = c.patchClaim(ctx, pvc, false, func(p *corev1.PersistentVolumeClaim) {
		markModifyStatus(p, corev1.PersistentVolumeClaimModifyVolumeInProgress, vac.Name, nil, c.claims.Clock.Now())
	})
	if err != nil {
		return fmt.Errorf("mark PersistentVolumeClaim %s as modifying: %w", key, err)
	}
	c.claims.Recorder.Event(pvc, corev1.EventTypeNormal, ReasonModify, fmt.Sprintf("external resizer is modifying volume %s with vac %s", pvc.Name, vac.Name))
	return c.modifyTo(ctx, key, pvc, pv, vac)
}

// bound tells whether pvc is bound: only a bound claim is modified.
func bound(pvc *corev1.PersistentVolumeClaim) bool { return pvc.Status.Phase == corev1.ClaimBound }

// class returns the VolumeAttributesClass name from the cache. One that
// does not exist is recorded as a VolumeModifyFailed Event, and its
// NotFound returned.
func (c *Controller) class(pvc *corev1.PersistentVolumeClaim, name string) (*storagev1.VolumeAttributesClass, error) {
	vac, err := c.vacLister.Get(name)
	if apierrors.IsNotFound(err) {
		c.claims.Recorder.Eventf(pvc, corev1.EventTypeWarning, ReasonModifyFailed, "VAC %q does not exist.", name)
	}
	if err != nil {
		return nil, fmt.Errorf("get VolumeAttributesClass %s: %w", name, err)
	}
	return vac, nil
}

// modifyTo calls ControllerModifyVolume with vac's parameters and records
// the outcome: on success the volume's and then the claim's class (the
// volume first: a crash between the two leaves a claim still in progress,
// whose retry is a no-op in the driver); on failure the claim's
// modification status and conditions.
func (c *Controller) modifyTo(ctx context.Context, key string, pvc *corev1.PersistentVolumeClaim, pv *corev1.PersistentVolume, vac *storagev1.VolumeAttributesClass) error {
	logger := klog.FromContext(ctx)
	if vac.DriverName != c.cfg.DriverName {
		return c.modifyFailed(ctx, key, pvc, vac, otherDriver(vac, c.cfg.DriverName))
	}
	params := vac.Parameters
	if c.cfg.ExtraModifyMetadata {
		params = maps.Clone(params)
		if params == nil {
			params = map[string]string{}
		}
		params[ParameterPVCName], params[ParameterPVCNamespace], params[ParameterPVName] = pvc.Name, pvc.Namespace, pv.Name
	}
	src := pv.Spec.CSI
	if src.VolumeHandle == "" {
		return kube.Permanent(errors.New("the PersistentVolume's CSI source has an empty volumeHandle"))
	}
	secrets, err := c.modifySecrets(ctx, pv)
	if err != nil {
		return err
	}
	// A replica that may have lost its Lease leaves the driver alone.
	if err := kube.StillLeading(ctx); err != nil {
		return err
	}
	logger.V(4).Info("Modifying volume", "volumeID", src.VolumeHandle, "volumeAttributesClass", vac.Name)
	_, err = c.cfg.CSI.ControllerModifyVolume(ctx, &csi.ControllerModifyVolumeRequest{
		VolumeId:          src.VolumeHandle,
		Secrets:           secrets,
		MutableParameters: params,
	})
	if err != nil {
		return c.modifyFailed(ctx, key, pvc, vac, err)
	}
	c.mods.setUncertain(key, false)
	c.mods.clearInfeasible(key)
	if err := c.claims.PatchVolume(ctx, pv, volumeClassPatch(pv, vac.Name)); err != nil {
		return fmt.Errorf("set the VolumeAttributesClass of PersistentVolume %s to %s: %w", pv.Name, vac.Name, err)
	}
	if _, err := c.patchClaim(ctx, pvc, true, func(p *corev1.PersistentVolumeClaim) { markModifyCompleted(p, vac.Name) }); err != nil {
		return fmt.Errorf("mark PersistentVolumeClaim %s as modified: %w", key, err)
	}
	c.claims.Recorder.Eventf(pvc, corev1.EventTypeNormal, ReasonModifySucceeded, "external resizer modified volume %s with vac %s successfully", pvc.Name, vac.Name)
	c.claims.Metrics.Done.Inc()
	logger.V(2).Info("Modified volume", "volumeAttributesClass", vac.Name)
	return nil
}

// otherDriver is the outcome of a class of another driver: INVALID_ARGUMENT,
// infeasible, as the driver would answer parameters that mean nothing to
// it. Upstream passes them on to the driver.
func otherDriver(vac *storagev1.VolumeAttributesClass, driver string) error {
	return status.Errorf(codes.InvalidArgument, "VolumeAttributesClass %s is of driver %s, not %s", vac.Name, vac.DriverName, driver)
}

// modifyFailed records a failed ControllerModifyVolume as upstream does:
// INVALID_ARGUMENT is Infeasible (tried again with the same class only
// after RetryIntervalMax); any other code leaves the modification
// InProgress, with the ModifyVolumeError condition, and an uncertain one
// (not final) keeps its target. An error without a gRPC status (a missing
// Secret) changes nothing in the claim. It returns cause for the retry.
func (c *Controller) modifyFailed(ctx context.Context, key string, pvc *corev1.PersistentVolumeClaim, vac *storagev1.VolumeAttributesClass, cause error) error {
	code, hasCode := c.claims.Metrics.Failed(cause)
	err := fmt.Errorf("modify volume %s to VolumeAttributesClass %s: %w", pvc.Spec.VolumeName, vac.Name, cause)
	if !hasCode {
		return err
	}
	outcome := corev1.PersistentVolumeClaimModifyVolumeInProgress
	msg := cause.Error()
	if !csiclient.IsFinal(cause) {
		c.mods.setUncertain(key, true)
		msg += ". Still modifying to VAC " + vac.Name
	} else {
		if code == codes.InvalidArgument {
			outcome = corev1.PersistentVolumeClaimModifyVolumeInfeasible
			c.mods.setInfeasible(key, c.claims.Clock.Now())
		}
		c.mods.setUncertain(key, false)
	}
	now := c.claims.Clock.Now()
	if _, perr := c.patchClaim(ctx, pvc, true, func(p *corev1.PersistentVolumeClaim) {
		markModifyStatus(p, outcome, vac.Name, cause, now)
	}); perr != nil {
		klog.FromContext(ctx).Error(perr, "Recording the failed modification in the claim's status failed")
	}
	c.claims.Recorder.Event(pvc, corev1.EventTypeWarning, ReasonModifyFailed, msg)
	return err
}

// rolledBack ends a modification the user took back: the ModifyingVolume
// condition goes (Event VolumeModifyCanceled). The modification status
// stays: it tells what happened last, as upstream keeps it.
func (c *Controller) rolledBack(ctx context.Context, pvc *corev1.PersistentVolumeClaim) error {
	if !kube.ClaimHasCondition(pvc, corev1.PersistentVolumeClaimVolumeModifyingVolume) {
		return nil
	}
	if err := kube.StillLeading(ctx); err != nil {
		return err
	}
	if _, err := c.patchClaim(ctx, pvc, false, markModifyRolledBack); err != nil {
		return fmt.Errorf("mark the modification of PersistentVolumeClaim %s as cancelled: %w", kube.ClaimKey(pvc), err)
	}
	c.claims.Recorder.Event(pvc, corev1.EventTypeNormal, ReasonModifyCancelled, "Cancelled modify.")
	klog.FromContext(ctx).V(2).Info("Modification cancelled: the claim asks for no VolumeAttributesClass any more")
	return nil
}

// modifySecrets reads the secrets of ControllerModifyVolume: the Secret the
// volume's modify-secret annotations name, else its
// controllerExpandSecretRef, else none (kube.ReadSecret: read when needed,
// never cached, watched or logged).
func (c *Controller) modifySecrets(ctx context.Context, pv *corev1.PersistentVolume) (map[string]string, error) {
	ref := pv.Spec.CSI.ControllerExpandSecretRef
	if name, ns := pv.Annotations[SecretNameAnnotation], pv.Annotations[SecretNamespaceAnnotation]; name != "" && ns != "" {
		ref = &corev1.SecretReference{Namespace: ns, Name: name}
	}
	return kube.ReadSecret(ctx, c.cfg.Client, ref, "modify")
}
