package attach

import (
	"context"
	"fmt"
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/loopvol/loopvol/internal/kube"
)

// Every write is a patch built by hand from the fields that change: no
// full-object marshalling, no update of fields the controller does not own.

// vaMetadataPatch is the merge patch that gives va the finalizer and the
// node-ID annotation, or nil when it has both. It carries va's
// resourceVersion, so it fails with a conflict when va was stale: a merge
// patch replaces the whole finalizer list.
func vaMetadataPatch(va *storagev1.VolumeAttachment, finalizer, nodeID string) []byte {
	type metadata struct {
		ResourceVersion string            `json:"resourceVersion,omitempty"`
		Finalizers      []string          `json:"finalizers,omitempty"`
		Annotations     map[string]string `json:"annotations,omitempty"`
	}
	var m metadata
	if !slices.Contains(va.Finalizers, finalizer) {
		m.Finalizers = append(slices.Clone(va.Finalizers), finalizer)
	}
	if va.Annotations[NodeIDAnnotation] != nodeID {
		m.Annotations = map[string]string{NodeIDAnnotation: nodeID}
	}
	if m.Finalizers == nil && m.Annotations == nil {
		return nil
	}
	m.ResourceVersion = va.ResourceVersion
	return kube.MustJSON(map[string]metadata{"metadata": m})
}

// statusPatch is a merge patch of a VolumeAttachment's status. A key with a
// nil value is written as null (the field is cleared); absent keys stay.
type statusPatch map[string]any

func (p statusPatch) bytes() []byte { return kube.MustJSON(map[string]statusPatch{"status": p}) }

// metadataPatchValue is the merge-patch value that turns the attachment
// metadata old into new: new's entries, null for keys only old has, null
// for the whole map when new is empty.
func metadataPatchValue(old, new map[string]string) any {
	if len(new) == 0 {
		return nil
	}
	v := make(map[string]*string, len(new)+len(old))
	for k := range old {
		if _, ok := new[k]; !ok {
			v[k] = nil
		}
	}
	for k, val := range new {
		v[k] = &val
	}
	return v
}

// attachedPatch marks va attached with metadata, clearing attachError; nil
// when va says exactly that already.
func attachedPatch(va *storagev1.VolumeAttachment, metadata map[string]string) []byte {
	st := va.Status
	if st.Attached && st.AttachError == nil && maps.Equal(st.AttachmentMetadata, metadata) {
		return nil
	}
	p := statusPatch{"attached": true, "attachError": nil}
	if len(metadata) > 0 || len(st.AttachmentMetadata) > 0 {
		p["attachmentMetadata"] = metadataPatchValue(st.AttachmentMetadata, metadata)
	}
	return p.bytes()
}

// detachedPatch marks va detached; nil when it says so already.
func detachedPatch(va *storagev1.VolumeAttachment) []byte {
	st := va.Status
	if !st.Attached && st.DetachError == nil && len(st.AttachmentMetadata) == 0 {
		return nil
	}
	return statusPatch{"attached": false, "attachmentMetadata": nil, "detachError": nil}.bytes()
}

// patchVA applies a patch to va (the status subresource if status) and
// remembers the resourceVersion it produced.
func (c *Controller) patchVA(ctx context.Context, name string, pt types.PatchType, data []byte, status bool) (*storagev1.VolumeAttachment, error) {
	var sub []string
	if status {
		sub = []string{"status"}
	}
	klog.FromContext(ctx).V(5).Info("Patching VolumeAttachment", "patch", string(data), "subresource", sub)
	if err := c.stillLeading(ctx); err != nil {
		return nil, err
	}
	out, err := c.client.StorageV1().VolumeAttachments().Patch(ctx, name, pt, data, metav1.PatchOptions{}, sub...)
	c.api.Observe(err)
	if err != nil {
		return nil, err
	}
	if out.DeletionTimestamp != nil && len(out.Finalizers) == 0 {
		// The last finalizer went: the object is gone, and its delete
		// event may have been handled already. Nothing to remember.
		c.forget(name)
		return out, nil
	}
	c.state.written.Record(name, out.ResourceVersion, c.clock.Now())
	c.forgetIfGone(name)
	return out, nil
}

// forgetIfGone drops the state of key when the cache no longer has the
// object. Called after recording something about key: the delete event
// drops the object's state after the cache dropped the object, so either
// this check sees the object gone, or the event comes later and drops it.
func (c *Controller) forgetIfGone(key string) {
	if _, exists, err := c.vaIndexer.GetByKey(key); err == nil && !exists {
		c.forget(key)
	}
}

// forget drops everything the controller remembers about key.
func (c *Controller) forget(key string) {
	c.state.drop(key)
	c.pending.drop(key)
}

// ensureVAMetadata gives va the finalizer and the node-ID annotation in one
// patch, and returns the updated object and whether it is as fresh as a
// read (it patched: the patch had a resourceVersion precondition; or it
// read va again). A stale cached copy makes the patch conflict; then it
// reads va afresh and tries once more (kube.RetryStale).
func (c *Controller) ensureVAMetadata(ctx context.Context, va *storagev1.VolumeAttachment, nodeID string) (*storagev1.VolumeAttachment, bool, error) {
	out, fresh := va, false
	err := kube.RetryStale(ctx, va, apierrors.IsConflict, func(ctx context.Context) (*storagev1.VolumeAttachment, error) {
		fresh = true
		return c.client.StorageV1().VolumeAttachments().Get(ctx, va.Name, metav1.GetOptions{})
	}, func(ctx context.Context, va *storagev1.VolumeAttachment) error {
		if va.DeletionTimestamp != nil {
			return fmt.Errorf("VolumeAttachment %q is being deleted", va.Name)
		}
		data := vaMetadataPatch(va, c.finalizer, nodeID)
		if data == nil {
			out = va
			return nil
		}
		patched, err := c.patchVA(ctx, va.Name, types.MergePatchType, data, false)
		if err != nil {
			return fmt.Errorf("add finalizer and node ID to VolumeAttachment %q: %w", va.Name, err)
		}
		out, fresh = patched, true
		return nil
	})
	if err != nil {
		return nil, false, err
	}
	return out, fresh, nil
}

// removeVAFinalizer removes the finalizer from va. It returns the object
// after the patch, or nil when the object is gone (the API server deletes a
// deleting object once its last finalizer goes). The test op fails on a
// stale copy, and any failed write is tried once more on the object read
// again.
func (c *Controller) removeVAFinalizer(ctx context.Context, va *storagev1.VolumeAttachment) (*storagev1.VolumeAttachment, error) {
	out := va
	err := kube.RetryStale(ctx, va, nil, c.readVA(va.Name), func(ctx context.Context, va *storagev1.VolumeAttachment) error {
		out = va
		if va == nil {
			return nil
		}
		data := kube.RemoveFinalizerPatch(va.Finalizers, c.finalizer)
		if data == nil {
			return nil
		}
		patched, err := c.patchVA(ctx, va.Name, types.JSONPatchType, data, false)
		switch {
		case apierrors.IsNotFound(err):
			out = nil
		case err != nil:
			return fmt.Errorf("remove finalizer from VolumeAttachment %q: %w", va.Name, err)
		case patched.DeletionTimestamp != nil && len(patched.Finalizers) == 0:
			out = nil
		default:
			out = patched
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// readVA reads a VolumeAttachment for kube.RetryStale: nil when it is gone.
func (c *Controller) readVA(name string) func(context.Context) (*storagev1.VolumeAttachment, error) {
	return func(ctx context.Context) (*storagev1.VolumeAttachment, error) {
		va, err := c.client.StorageV1().VolumeAttachments().Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return va, err
	}
}

// ensurePVFinalizer adds the finalizer to pv unless it has it, reading pv
// again and retrying once when the test op fails on a stale copy.
func (c *Controller) ensurePVFinalizer(ctx context.Context, pv *corev1.PersistentVolume) error {
	retriable := func(err error) bool { return !apierrors.IsNotFound(err) && !isFinal(err) }
	read := func(ctx context.Context) (*corev1.PersistentVolume, error) {
		return c.client.CoreV1().PersistentVolumes().Get(ctx, pv.Name, metav1.GetOptions{})
	}
	return kube.RetryStale(ctx, pv, retriable, read, func(ctx context.Context, pv *corev1.PersistentVolume) error {
		switch {
		case slices.Contains(pv.Finalizers, c.finalizer):
			return nil
		case pv.DeletionTimestamp != nil:
			return permanent(fmt.Errorf("PersistentVolume %q is marked for deletion", pv.Name))
		}
		data := kube.AddFinalizerPatch(pv.Finalizers, c.finalizer)
		if _, err := c.client.CoreV1().PersistentVolumes().Patch(ctx, pv.Name, types.JSONPatchType, data, metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("add finalizer to PersistentVolume %q: %w", pv.Name, err)
		}
		klog.FromContext(ctx).V(4).Info("Added finalizer to PersistentVolume", "persistentVolume", klog.KObj(pv))
		return nil
	})
}

// removePVFinalizer removes the finalizer from pv, reading pv again and
// retrying once when the test op fails on a stale copy.
func (c *Controller) removePVFinalizer(ctx context.Context, pv *corev1.PersistentVolume) error {
	read := func(ctx context.Context) (*corev1.PersistentVolume, error) {
		live, err := c.client.CoreV1().PersistentVolumes().Get(ctx, pv.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil, nil // gone: nothing to remove
		}
		return live, err
	}
	return kube.RetryStale(ctx, pv, nil, read, func(ctx context.Context, pv *corev1.PersistentVolume) error {
		if pv == nil {
			return nil
		}
		data := kube.RemoveFinalizerPatch(pv.Finalizers, c.finalizer)
		if data == nil {
			return nil
		}
		_, err := c.client.CoreV1().PersistentVolumes().Patch(ctx, pv.Name, types.JSONPatchType, data, metav1.PatchOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("remove finalizer from PersistentVolume %q: %w", pv.Name, err)
		}
		return nil
	})
}
