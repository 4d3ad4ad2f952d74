package kube

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// Claim returns the claim of key as a sync should decide on it: from the
// cache, or from the API server when the cache has not seen the
// controller's last write of it or a write of it conflicted. It returns nil
// (and no error) when the claim is gone or names no volume.
func (q *ClaimQueue) Claim(ctx context.Context, key string) (*corev1.PersistentVolumeClaim, error) {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil, Permanent(fmt.Errorf("bad claim key %q: %w", key, err))
	}
	pvc, err := q.PVCs.PersistentVolumeClaims(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if pvc.Spec.VolumeName == "" {
		return nil, nil
	}
	if !q.Writes.Stale(key, pvc.ResourceVersion) {
		return pvc, nil
	}
	pvc, err = q.cfg.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read PersistentVolumeClaim %s: %w", key, err)
	}
	return pvc, nil
}

// PatchClaimStatus applies change to a copy of pvc and writes the
// difference, as patchOf computes it (nil: no difference; the patch
// carries pvc's resourceVersion as a precondition), to the status
// subresource. It returns the claim as written, or pvc itself when nothing
// changed or the write failed, and records the write in Writes.
//
// On a conflict (someone else wrote the claim) it reads the claim again
// and, when onLive, applies change to the live copy once more: the outcome
// of a driver call is a fact about the volume, true of any version of the
// claim. Otherwise, or when that write conflicts too, it fails and the
// claim's next sync reads it live and decides afresh. A replica that may
// no longer hold its Lease does not write.
func (q *ClaimQueue) PatchClaimStatus(ctx context.Context, pvc *corev1.PersistentVolumeClaim, onLive bool,
	change func(*corev1.PersistentVolumeClaim), patchOf func(old, new *corev1.PersistentVolumeClaim) []byte) (*corev1.PersistentVolumeClaim, error) {
	key, claims := ClaimKey(pvc), q.cfg.Client.CoreV1().PersistentVolumeClaims(pvc.Namespace)
	written, tries := pvc, 0
	read := func(ctx context.Context) (*corev1.PersistentVolumeClaim, error) {
		return claims.Get(ctx, pvc.Name, metav1.GetOptions{})
	}
	write := func(ctx context.Context, cur *corev1.PersistentVolumeClaim) error {
		tries++
		next := cur.DeepCopy()
		change(next)
		data := patchOf(cur, next)
		if data == nil {
			written = cur
			return nil
		}
		if err := StillLeading(ctx); err != nil {
			return err
		}
		klog.FromContext(ctx).V(5).Info("Patching PersistentVolumeClaim status", "patch", string(data))
		out, err := claims.Patch(ctx, cur.Name, types.MergePatchType, data, metav1.PatchOptions{}, "status")
		if err != nil {
			if apierrors.IsConflict(err) && (!onLive || tries > 1) {
				q.Writes.Invalidate(key)
			}
			return err
		}
		q.Writes.Record(key, out.ResourceVersion, q.Clock.Now())
		written = out
		return nil
	}
	if err := RetryStale(ctx, pvc, func(err error) bool { return onLive && apierrors.IsConflict(err) }, read, write); err != nil {
		return pvc, err
	}
	return written, nil
}

// ClaimHasCondition tells whether pvc has the condition typ with status
// True.
func ClaimHasCondition(pvc *corev1.PersistentVolumeClaim, typ corev1.PersistentVolumeClaimConditionType) bool {
	for _, c := range pvc.Status.Conditions {
		if c.Type == typ && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}
