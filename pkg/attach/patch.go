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
	c.state.recordWrite(name, out.ResourceVersion, c.clock.Now())
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
// patch, and returns the updated object and whether it patched (then the
// object is as fresh as a read: the patch had a resourceVersion
// precondition). A stale cached copy makes the patch conflict; then it
// reads va afresh and tries once more.
func (c *Controller) ensureVAMetadata(ctx context.Context, va *storagev1.VolumeAttachment, nodeID string) (*storagev1.VolumeAttachment, bool, error) {
	for try := 0; ; try++ {
		data := vaMetadataPatch(va, c.finalizer, nodeID)
		if data == nil {
			return va, try > 0, nil
		}
		out, err := c.patchVA(ctx, va.Name, types.MergePatchType, data, false)
		if err == nil {
			return out, true, nil
		}
		if !apierrors.IsConflict(err) || try > 0 {
			return nil, false, fmt.Errorf("add finalizer and node ID to VolumeAttachment %q: %w", va.Name, err)
		}
		live, gerr := c.client.StorageV1().VolumeAttachments().Get(ctx, va.Name, metav1.GetOptions{})
		if gerr != nil {
			return nil, false, fmt.Errorf("read VolumeAttachment %q again after a conflict: %w", va.Name, gerr)
		}
		if live.DeletionTimestamp != nil {
			return nil, false, fmt.Errorf("VolumeAttachment %q is being deleted", va.Name)
		}
		va = live
	}
}

// removeVAFinalizer removes the finalizer from va. It returns the object
// after the patch, or nil when the object is gone (the API server deletes a
// deleting object once its last finalizer goes).
func (c *Controller) removeVAFinalizer(ctx context.Context, va *storagev1.VolumeAttachment) (*storagev1.VolumeAttachment, error) {
	for try := 0; ; try++ {
		data := kube.RemoveFinalizerPatch(va.Finalizers, c.finalizer)
		if data == nil {
			return va, nil
		}
		out, err := c.patchVA(ctx, va.Name, types.JSONPatchType, data, false)
		switch {
		case err == nil:
			if out.DeletionTimestamp != nil && len(out.Finalizers) == 0 {
				return nil, nil
			}
			return out, nil
		case apierrors.IsNotFound(err):
			return nil, nil
		case try > 0:
			return nil, fmt.Errorf("remove finalizer from VolumeAttachment %q: %w", va.Name, err)
		}
		// The test op failed on a stale copy, or the write failed: read the
		// object and try once more.
		live, gerr := c.client.StorageV1().VolumeAttachments().Get(ctx, va.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(gerr) {
			return nil, nil
		}
		if gerr != nil {
			return nil, fmt.Errorf("remove finalizer from VolumeAttachment %q: %w (and reading it again: %w)", va.Name, err, gerr)
		}
		va = live
	}
}

// ensurePVFinalizer adds the finalizer to pv unless it has it, reading pv
// again and retrying once when the test op fails on a stale copy.
func (c *Controller) ensurePVFinalizer(ctx context.Context, pv *corev1.PersistentVolume) error {
	for try := 0; ; try++ {
		if slices.Contains(pv.Finalizers, c.finalizer) {
			return nil
		}
		if pv.DeletionTimestamp != nil {
			return permanent(fmt.Errorf("PersistentVolume %q is marked for deletion", pv.Name))
		}
		data := kube.AddFinalizerPatch(pv.Finalizers, c.finalizer)
		_, err := c.client.CoreV1().PersistentVolumes().Patch(ctx, pv.Name, types.JSONPatchType, data, metav1.PatchOptions{})
		if err == nil {
			klog.FromContext(ctx).V(4).Info("Added finalizer to PersistentVolume", "persistentVolume", klog.KObj(pv))
			return nil
		}
		if try > 0 || apierrors.IsNotFound(err) {
			return fmt.Errorf("add finalizer to PersistentVolume %q: %w", pv.Name, err)
		}
		live, gerr := c.client.CoreV1().PersistentVolumes().Get(ctx, pv.Name, metav1.GetOptions{})
		if gerr != nil {
			return fmt.Errorf("add finalizer to PersistentVolume %q: %w (and reading it again: %w)", pv.Name, err, gerr)
		}
		pv = live
	}
}

// removePVFinalizer removes the finalizer from pv, reading pv again and
// retrying once when the test op fails on a stale copy.
func (c *Controller) removePVFinalizer(ctx context.Context, pv *corev1.PersistentVolume) error {
	for try := 0; ; try++ {
		data := kube.RemoveFinalizerPatch(pv.Finalizers, c.finalizer)
		if data == nil {
			return nil
		}
		_, err := c.client.CoreV1().PersistentVolumes().Patch(ctx, pv.Name, types.JSONPatchType, data, metav1.PatchOptions{})
		switch {
		case err == nil, apierrors.IsNotFound(err):
			return nil
		case try > 0:
			return fmt.Errorf("remove finalizer from PersistentVolume %q: %w", pv.Name, err)
		}
		live, gerr := c.client.CoreV1().PersistentVolumes().Get(ctx, pv.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(gerr) {
			return nil
		}
		if gerr != nil {
			return fmt.Errorf("remove finalizer from PersistentVolume %q: %w (and reading it again: %w)", pv.Name, err, gerr)
		}
		pv = live
	}
}
