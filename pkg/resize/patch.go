package resize

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/loopvol/loopvol/internal/kube"
)

// The steps of an expansion, as changes of a claim. Each is applied to a
// copy; patchClaim writes what changed.

// markInProgress records that the controller expands the claim to
// d.target. A new target replaces the resize conditions with Resizing and
// sets ControllerResizeInProgress; a retry of the recorded target only
// adds Resizing and keeps the rest (the last error stays visible while it
// is retried).
func markInProgress(pvc *corev1.PersistentVolumeClaim, d decision, now time.Time) {
	resizing := corev1.PersistentVolumeClaimCondition{Type: corev1.PersistentVolumeClaimResizing}
	if d.retry {
		setConditions(pvc, now, resizeConditions, resizing)
	} else {
		setConditions(pvc, now, nil, resizing)
		setAllocated(pvc, d.target)
		setResourceStatus(pvc, corev1.PersistentVolumeClaimControllerResizeInProgress)
	}
	setAnnotation(pvc, NodeExpansionNotRequiredAnnotation, false)
}

// markNodePending hands the claim to the node: the controller's part is
// done, kubelet grows the filesystem.
func markNodePending(pvc *corev1.PersistentVolumeClaim, now time.Time) {
	setConditions(pvc, now, nil, corev1.PersistentVolumeClaimCondition{
		Type:    corev1.PersistentVolumeClaimFileSystemResizePending,
		Message: msgFileSystemResizePending,
	})
	setResourceStatus(pvc, corev1.PersistentVolumeClaimNodeResizePending)
	setAnnotation(pvc, NodeExpansionNotRequiredAnnotation, false)
}

// markFinished ends an expansion the node has nothing to add to: the claim
// has its new capacity, no resize status and no resize conditions.
func markFinished(pvc *corev1.PersistentVolumeClaim, size resource.Quantity, now time.Time) {
	if pvc.Status.Capacity == nil {
		pvc.Status.Capacity = corev1.ResourceList{}
	}
	pvc.Status.Capacity[corev1.ResourceStorage] = size
	setConditions(pvc, now, nil)
	setResourceStatus(pvc, "")
	setAnnotation(pvc, NodeExpansionNotRequiredAnnotation, true)
}

// markFailed records a final error: the ControllerResizeError condition
// with msg next to the others, and ControllerResizeInfeasible when the
// request cannot work.
func markFailed(pvc *corev1.PersistentVolumeClaim, msg string, infeasible bool, now time.Time) {
	setConditions(pvc, now, resizeConditions, corev1.PersistentVolumeClaimCondition{
		Type:    corev1.PersistentVolumeClaimControllerResizeError,
		Message: msg,
	})
	if infeasible {
		setResourceStatus(pvc, corev1.PersistentVolumeClaimControllerResizeInfeasible)
	}
}

// patchClaim applies change to a copy of pvc and writes the difference to
// the status subresource, with pvc's resourceVersion as a precondition. It
// returns the claim as written (pvc itself when nothing changed or the
// write failed). On a conflict it reads the claim again and, when onLive,
// applies change to the live copy once more (kube.RetryStale): the
// outcome of a driver call is a fact about the volume and holds for any
// version of the claim. Otherwise, or when that write conflicts too, it
// fails, and the next sync decides afresh on the live claim.
func (c *Controller) patchClaim(ctx context.Context, pvc *corev1.PersistentVolumeClaim, onLive bool, change func(*corev1.PersistentVolumeClaim)) (*corev1.PersistentVolumeClaim, error) {
	key, claims := claimKey(pvc), c.client.CoreV1().PersistentVolumeClaims(pvc.Namespace)
	written, tries := pvc, 0
	read := func(ctx context.Context) (*corev1.PersistentVolumeClaim, error) {
		return claims.Get(ctx, pvc.Name, metav1.GetOptions{})
	}
	err := kube.RetryStale(ctx, pvc, func(err error) bool { return onLive && apierrors.IsConflict(err) }, read, func(ctx context.Context, cur *corev1.PersistentVolumeClaim) error {
		tries++
		next := cur.DeepCopy()
		change(next)
		data := claimPatch(cur, next)
		if data == nil {
			written = cur
			return nil
		}
		klog.FromContext(ctx).V(5).Info("Patching PersistentVolumeClaim status", "patch", string(data))
		out, err := claims.Patch(ctx, cur.Name, types.MergePatchType, data, metav1.PatchOptions{}, "status")
		if apierrors.IsConflict(err) && (!onLive || tries > 1) {
			c.state.writes.Invalidate(key)
		}
		if err != nil {
			return err
		}
		c.state.writes.Record(key, out.ResourceVersion, c.clock.Now())
		written = out
		return nil
	})
	if err != nil {
		return pvc, err
	}
	return written, nil
}

// patchVolume writes a merge patch (nil: nothing to do) to pv and
// remembers the resourceVersion it produced.
func (c *Controller) patchVolume(ctx context.Context, pv *corev1.PersistentVolume, data []byte) error {
	if data == nil {
		return nil
	}
	klog.FromContext(ctx).V(5).Info("Patching PersistentVolume", "patch", string(data))
	out, err := c.client.CoreV1().PersistentVolumes().Patch(ctx, pv.Name, types.MergePatchType, data, metav1.PatchOptions{})
	if err != nil {
		return err
	}
	c.state.writes.Record(kube.VolumeKey(pv.Name), out.ResourceVersion, c.clock.Now())
	return nil
}

// preResizeCaughtUp tells whether pv has the pre-resize capacity
// annotation and the claim's capacity has caught up with the volume's: the
// node has grown the filesystem, and the annotation can go.
func preResizeCaughtUp(pvc *corev1.PersistentVolumeClaim, pv *corev1.PersistentVolume) bool {
	if _, ok := pv.Annotations[PreResizeCapacityAnnotation]; !ok {
		return false
	}
	claimCap, volumeCap := pvc.Status.Capacity[corev1.ResourceStorage], pv.Spec.Capacity[corev1.ResourceStorage]
	return claimCap.Cmp(volumeCap) >= 0
}

// dropPreResizeAnnotation removes the pre-resize capacity annotation from
// pv.
func (c *Controller) dropPreResizeAnnotation(ctx context.Context, pv *corev1.PersistentVolume) error {
	if err := c.patchVolume(ctx, pv, removePreResizePatch()); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("remove annotation %s from PersistentVolume %s: %w", PreResizeCapacityAnnotation, pv.Name, err)
	}
	klog.FromContext(ctx).V(4).Info("Removed the pre-resize capacity annotation: the node has caught up")
	return nil
}

// claimInUse tells whether a pod that has not ended uses pvc. It lists the
// pods of the claim's namespace, from the API server's cache: it is asked
// only for claims whose driver refused an expansion because the volume was
// in use, which does not justify watching every pod of the cluster.
func (c *Controller) claimInUse(ctx context.Context, pvc *corev1.PersistentVolumeClaim) (bool, error) {
	pods, err := c.client.CoreV1().Pods(pvc.Namespace).List(ctx, metav1.ListOptions{ResourceVersion: "0"})
	if err != nil {
		return false, fmt.Errorf("list the pods of namespace %s: %w", pvc.Namespace, err)
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		for _, v := range p.Spec.Volumes {
			if v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == pvc.Name {
				return true, nil
			}
		}
	}
	return false, nil
}
