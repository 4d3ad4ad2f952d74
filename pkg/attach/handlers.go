package attach

import (
	"slices"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/tools/cache"
)

// Indexes of the VolumeAttachment cache.
const (
	indexByPV   = "pv"   // spec.source.persistentVolumeName
	indexByNode = "node" // spec.nodeName
)

var vaIndexers = cache.Indexers{
	indexByPV: func(obj any) ([]string, error) {
		va, ok := obj.(*storagev1.VolumeAttachment)
		if !ok || va.Spec.Source.PersistentVolumeName == nil {
			return nil, nil
		}
		return []string{*va.Spec.Source.PersistentVolumeName}, nil
	},
	indexByNode: func(obj any) ([]string, error) {
		va, ok := obj.(*storagev1.VolumeAttachment)
		if !ok {
			return nil, nil
		}
		return []string{va.Spec.NodeName}, nil
	},
}

// lastAppliedAnnotation is kubectl's copy of an applied object, often the
// largest part of a hand-made object.
const lastAppliedAnnotation = "kubectl.kubernetes.io/last-applied-configuration"

// stripForCache drops from every cached object what the controller never
// reads: managedFields and kubectl's last-applied copy everywhere, and from
// PersistentVolumes everything but their finalizers, deletion state, access
// modes, volume mode, mount options and CSI source (no labels, annotations,
// claim reference, node affinity, capacity or status). With thousands of
// objects this is most of their size.
func stripForCache(obj any) (any, error) {
	if pv, ok := obj.(*corev1.PersistentVolume); ok {
		pv.Labels, pv.Annotations, pv.OwnerReferences = nil, nil, nil
		pv.Spec = corev1.PersistentVolumeSpec{
			AccessModes:            pv.Spec.AccessModes,
			VolumeMode:             pv.Spec.VolumeMode,
			MountOptions:           pv.Spec.MountOptions,
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: pv.Spec.CSI},
		}
		pv.Status = corev1.PersistentVolumeStatus{}
	}
	a, err := meta.Accessor(obj)
	if err != nil {
		return obj, nil // a tombstone or another non-object: keep as is
	}
	a.SetManagedFields(nil)
	if ann := a.GetAnnotations(); ann != nil {
		if _, ok := ann[lastAppliedAnnotation]; ok {
			delete(ann, lastAppliedAnnotation)
			a.SetAnnotations(ann)
		}
	}
	return obj, nil
}

func (c *Controller) addEventHandlers(va, pv, csiNode cache.SharedIndexInformer) error {
	if _, err := va.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    c.vaAdded,
		UpdateFunc: c.vaUpdated,
		DeleteFunc: c.vaDeleted,
	}); err != nil {
		return err
	}
	if _, err := pv.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    c.pvChanged,
		UpdateFunc: func(_, newObj any) { c.pvChanged(newObj) },
	}); err != nil {
		return err
	}
	_, err := csiNode.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) { c.csiNodeChanged(nil, obj) },
		UpdateFunc: func(oldObj, newObj any) {
			c.csiNodeChanged(oldObj, newObj)
		},
	})
	return err
}

func (c *Controller) vaAdded(obj any) {
	if va, ok := obj.(*storagev1.VolumeAttachment); ok {
		c.enqueueVA(va)
	}
}

func (c *Controller) vaUpdated(oldObj, newObj any) {
	old, ok1 := oldObj.(*storagev1.VolumeAttachment)
	va, ok2 := newObj.(*storagev1.VolumeAttachment)
	if ok1 && ok2 && shouldEnqueueVAChange(old, va) {
		c.enqueueVA(va)
	}
}

// enqueueVA queues a VolumeAttachment of this driver: on the detach queue
// when it is being deleted, else on the attach queue.
func (c *Controller) enqueueVA(va *storagev1.VolumeAttachment) {
	if va.Spec.Attacher != c.cfg.DriverName {
		return
	}
	if va.DeletionTimestamp != nil {
		c.pending.add(va.Name, opDetach)
		c.detachQ.q.Add(va.Name)
		return
	}
	c.pending.add(va.Name, opAttach)
	c.attachQ.q.Add(va.Name)
}

// shouldEnqueueVAChange tells whether an update of a VolumeAttachment needs
// a sync. Updates whose only changes are the status, managedFields, the
// resourceVersion, this controller's finalizer or its node-ID annotation are
// the controller's own writes coming back (nobody else writes a
// VolumeAttachment's status): queuing them would sync the object again at
// once and cut its backoff short. A status someone else changed by hand is
// caught by the reconcile. Periodic resyncs (same resourceVersion) are
// queued.
func shouldEnqueueVAChange(old, va *storagev1.VolumeAttachment) bool {
	switch {
	case old.ResourceVersion == va.ResourceVersion:
		return true
	case old.UID != va.UID:
		return true
	case (old.DeletionTimestamp == nil) != (va.DeletionTimestamp == nil):
		return true
	case !equality.Semantic.DeepEqual(old.Spec, va.Spec):
		return true
	}
	return false
}

func (c *Controller) vaDeleted(obj any) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	va, ok := obj.(*storagev1.VolumeAttachment)
	if !ok {
		return
	}
	c.pending.drop(va.Name)
	c.state.drop(va.Name)
	// The PV may be waiting for its last VolumeAttachment to go.
	if pv := va.Spec.Source.PersistentVolumeName; pv != nil {
		c.pvQ.q.Add(*pv)
	}
}

// pvChanged queues a PersistentVolume that is being deleted and still
// carries the finalizer.
func (c *Controller) pvChanged(obj any) {
	pv, ok := obj.(*corev1.PersistentVolume)
	if !ok || pv.DeletionTimestamp == nil || !slices.Contains(pv.Finalizers, c.finalizer) {
		return
	}
	c.pvQ.q.Add(pv.Name)
}

// csiNodeChanged wakes the VolumeAttachments of a node that are not attached
// when the node's ID for this driver appears or changes: they may have
// failed for want of it.
func (c *Controller) csiNodeChanged(oldObj, newObj any) {
	n, ok := newObj.(*storagev1.CSINode)
	if !ok {
		return
	}
	id, found := nodeIDFromCSINode(n, c.cfg.DriverName)
	if !found {
		return
	}
	if old, ok := oldObj.(*storagev1.CSINode); ok {
		if oldID, oldFound := nodeIDFromCSINode(old, c.cfg.DriverName); oldFound && oldID == id {
			return
		}
	}
	objs, err := c.vaIndexer.ByIndex(indexByNode, n.Name)
	if err != nil {
		return
	}
	for _, obj := range objs {
		va, ok := obj.(*storagev1.VolumeAttachment)
		if ok && va.DeletionTimestamp == nil && !va.Status.Attached {
			c.enqueueVA(va)
		}
	}
}
