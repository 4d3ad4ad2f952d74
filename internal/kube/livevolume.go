package kube

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
)

// Volume returns the PersistentVolume name as a sync should decide on it:
// from the cache, or from the API server when the cache lacks it or has
// not seen the controller's last write of it. It returns nil (and no
// error) when the volume does not exist: its claim is queued again when it
// appears.
func (q *ClaimQueue) Volume(ctx context.Context, name string) (*corev1.PersistentVolume, error) {
	pv, err := q.PVs.Get(name)
	switch {
	case err == nil && !q.Writes.Stale(VolumeKey(name), pv.ResourceVersion):
		return pv, nil
	case err != nil && !apierrors.IsNotFound(err):
		return nil, err
	}
	pv, err = q.cfg.Client.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read PersistentVolume %s: %w", name, err)
	}
	return pv, nil
}

// ClaimAndVolume returns the claim of key and its volume as a sync should
// decide on them (Claim, Volume), or nil, nil when there is nothing to
// sync: the claim is gone or names no volume, want (nil: any claim) says
// the claim needs no sync (checked before its volume is read), or the
// volume does not exist or is not the driver's.
func (q *ClaimQueue) ClaimAndVolume(ctx context.Context, key string, want func(*corev1.PersistentVolumeClaim) bool) (*corev1.PersistentVolumeClaim, *corev1.PersistentVolume, error) {
	pvc, err := q.Claim(ctx, key)
	if err != nil || pvc == nil || want != nil && !want(pvc) {
		return nil, nil, err
	}
	pv, err := q.Volume(ctx, pvc.Spec.VolumeName)
	if err != nil || pv == nil || pv.Spec.CSI == nil || pv.Spec.CSI.Driver != q.cfg.DriverName {
		return nil, nil, err
	}
	return pvc, pv, nil
}

// PatchVolume writes the merge patch data to pv (nil: nothing to do) and
// records the resourceVersion it produced in Writes. A replica that may no
// longer hold its Lease does not write.
func (q *ClaimQueue) PatchVolume(ctx context.Context, pv *corev1.PersistentVolume, data []byte) error {
	if data == nil {
		return nil
	}
	if err := StillLeading(ctx); err != nil {
		return err
	}
	klog.FromContext(ctx).V(5).Info("Patching PersistentVolume", "patch", string(data))
	out, err := q.cfg.Client.CoreV1().PersistentVolumes().Patch(ctx, pv.Name, types.MergePatchType, data, metav1.PatchOptions{})
	if err != nil {
		return err
	}
	q.Writes.Record(VolumeKey(pv.Name), out.ResourceVersion, q.Clock.Now())
	return nil
}
