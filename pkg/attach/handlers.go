package attach

import (
	"slices"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/loopvol/loopvol/internal/kube"
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

// addEventHandlers adds the controller's handlers to the informers. On an
// error the handlers added so far are removed again.
func (c *Controller) addEventHandlers(logger klog.Logger, va, pv, csiNode cache.SharedIndexInformer) (*kube.Handlers, error) {
	hs := &kube.Handlers{}
	err := hs.Add(va, cache.ResourceEventHandlerFuncs{
		AddFunc:    c.vaAdded,
		UpdateFunc: c.vaUpdated,
		DeleteFunc: c.vaDeleted,
	}, 0)
	if err == nil {
		err = hs.Add(pv, cache.ResourceEventHandlerFuncs{
			AddFunc:    c.pvChanged,
			UpdateFunc: func(_, newObj any) { c.pvChanged(newObj) },
		}, 0)
	}
	if err == nil {
		err = hs.Add(csiNode, cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { c.csiNodeChanged(nil, obj) },
			UpdateFunc: c.csiNodeChanged,
		}, 0)
	}
	if err != nil {
		hs.Remove(logger)
		return nil, err
	}
	return hs, nil
}

func (c *Controller) vaAdded(obj any) {
	if va, ok := obj.(*storagev1.VolumeAttachment); ok {
		c.delivered(va)
		c.enqueueVA(va)
	}
}

func (c *Controller) vaUpdated(oldObj, newObj any) {
	old, ok1 := oldObj.(*storagev1.VolumeAttachment)
	va, ok2 := newObj.(*storagev1.VolumeAttachment)
	if ok2 {
		c.delivered(va)
	}
	if ok1 && ok2 && shouldEnqueueVAChange(old, va) {
		c.enqueueVA(va)
	}
}

// delivered notes that the handlers received va (the reconcile judges only
// such objects).
func (c *Controller) delivered(va *storagev1.VolumeAttachment) {
	if c.ours(va) {
		c.state.deliver(va.Name, va.ResourceVersion)
	}
}

// enqueueVA queues a VolumeAttachment of this driver: on the detach queue
// when it is being deleted, else on the attach queue.
func (c *Controller) enqueueVA(va *storagev1.VolumeAttachment) {
	if !c.ours(va) {
		return
	}
	if va.DeletionTimestamp != nil {
		c.pending.add(va.Name, opDetach)
		c.detachQ.Q.Add(va.Name)
		return
	}
	c.pending.add(va.Name, opAttach)
	c.attachQ.Q.Add(va.Name)
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

// ours tells whether va is this controller's to handle: of its driver and,
// with Config.NodeName, of its node.
func (c *Controller) ours(va *storagev1.VolumeAttachment) bool {
	return va.Spec.Attacher == c.cfg.DriverName && (c.cfg.NodeName == "" || va.Spec.NodeName == c.cfg.NodeName)
}

func (c *Controller) vaDeleted(obj any) {
	obj = kube.Tombstoned(obj)
	va, ok := obj.(*storagev1.VolumeAttachment)
	if !ok {
		return
	}
	c.forget(va.Name)
	c.attachQ.Drop(va.Name)
	c.detachQ.Drop(va.Name)
	// The PV may be waiting for its last VolumeAttachment to go.
	if pv := va.Spec.Source.PersistentVolumeName; pv != nil {
		c.pvQ.Q.Add(*pv)
	}
}

// pvChanged queues a PersistentVolume that is being deleted and still
// carries the finalizer.
func (c *Controller) pvChanged(obj any) {
	pv, ok := obj.(*corev1.PersistentVolume)
	if !ok || pv.DeletionTimestamp == nil || !slices.Contains(pv.Finalizers, c.finalizer) {
		return
	}
	c.pvQ.Q.Add(pv.Name)
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
