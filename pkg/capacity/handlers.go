package capacity

import (
	"context"
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/loopvol/loopvol/internal/kube"
)

// indexByItem indexes the objects by the item they belong to.
const indexByItem = "item"

func indexItem(obj any) ([]string, error) {
	o, ok := obj.(*storagev1.CSIStorageCapacity)
	if !ok {
		return nil, nil
	}
	return []string{itemIndexKey(itemOf(o))}, nil
}

// itemIndexKey is the index value of it. A class name cannot contain a
// NUL, so the join is unambiguous.
func itemIndexKey(it workItem) string { return it.class + "\x00" + it.segment }

// itemOf is the item an object belongs to.
func itemOf(o *storagev1.CSIStorageCapacity) workItem {
	return workItem{class: o.StorageClassName, segment: objectSegmentKey(o.NodeTopology, o.UID)}
}

// addEventHandlers adds the controller's handlers to the informers. On an
// error the handlers added so far are removed again.
func (c *Controller) addEventHandlers(ctx context.Context) (*kube.Handlers, error) {
	logger := klog.FromContext(ctx)
	hs := &kube.Handlers{}
	err := hs.Add(c.scInformer, cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { c.classChanged(logger, nil, obj) },
		UpdateFunc: func(oldObj, newObj any) { c.classChanged(logger, oldObj, newObj) },
		DeleteFunc: func(obj any) { c.classChanged(logger, nil, kube.Tombstoned(obj)) },
	}, 0)
	if err == nil {
		err = hs.Add(c.pvInformer, cache.ResourceEventHandlerDetailedFuncs{
			AddFunc: func(obj any, initial bool) {
				// Run queues everything once the caches are synced.
				if !initial {
					c.pvChanged(logger, nil, obj)
				}
			},
			UpdateFunc: func(oldObj, newObj any) { c.pvChanged(logger, oldObj, newObj) },
			DeleteFunc: func(obj any) { c.pvChanged(logger, nil, kube.Tombstoned(obj)) },
		}, 0)
	}
	if err == nil {
		err = hs.Add(c.objInformer, cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { c.objectChanged(logger, obj) },
			UpdateFunc: func(_, newObj any) { c.objectChanged(logger, newObj) },
			DeleteFunc: func(obj any) { c.objectDeleted(logger, kube.Tombstoned(obj)) },
		}, 0)
	}
	if err == nil && c.csiNodeInformer != nil {
		err = hs.Add(c.csiNodeInformer, cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { c.csiNodeChanged(logger, nil, obj) },
			UpdateFunc: func(oldObj, newObj any) { c.csiNodeChanged(logger, oldObj, newObj) },
			DeleteFunc: func(obj any) { c.csiNodeChanged(logger, nil, kube.Tombstoned(obj)) },
		}, 0)
	}
	if err == nil && c.nodeInformer != nil {
		err = hs.Add(c.nodeInformer, cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { c.nodeChanged(logger, nil, obj) },
			UpdateFunc: func(oldObj, newObj any) { c.nodeChanged(logger, oldObj, newObj) },
			DeleteFunc: func(obj any) { c.nodeChanged(logger, nil, kube.Tombstoned(obj)) },
		}, 0)
	}
	if err != nil {
		hs.Remove(logger)
		return nil, err
	}
	return hs, nil
}

// classChanged queues the items of a StorageClass of the driver that
// appeared, went or changed: every segment for it, and every object of it
// (those of a class that is gone or no longer wanted are deleted).
func (c *Controller) classChanged(logger klog.Logger, oldObj, obj any) {
	sc, ok := obj.(*storagev1.StorageClass)
	if !ok || sc.Provisioner != c.cfg.DriverName {
		return
	}
	if old, ok := oldObj.(*storagev1.StorageClass); ok &&
		old.Provisioner == sc.Provisioner && equality.Semantic.DeepEqual(old.Parameters, sc.Parameters) &&
		equality.Semantic.DeepEqual(old.VolumeBindingMode, sc.VolumeBindingMode) {
		// Metadata or a resync: nothing that changes the objects.
		return
	}
	logger.V(4).Info("StorageClass changed", "storageClass", klog.KObj(sc))
	for _, seg := range c.topo.keys() {
		c.q.Q.Add(workItem{class: sc.Name, segment: seg})
	}
	c.enqueueObjects(func(it workItem) bool { return it.class == sc.Name })
}

// enqueueObjects queues the items of the objects whose item matches.
func (c *Controller) enqueueObjects(match func(workItem) bool) {
	for _, obj := range c.objects.List() {
		if o, ok := obj.(*storagev1.CSIStorageCapacity); ok {
			if it := itemOf(o); match(it) {
				c.q.Q.Add(it)
			}
		}
	}
}

// pvChanged refreshes the items a PersistentVolume of the driver touches
// when it appears, goes, or changes size, class or node affinity: the
// driver's capacity changed when it was made, resized or deleted.
func (c *Controller) pvChanged(logger klog.Logger, oldObj, obj any) {
	pv, ok := obj.(*corev1.PersistentVolume)
	if !ok || pv.Spec.CSI == nil || pv.Spec.CSI.Driver != c.cfg.DriverName {
		return
	}
	if old, ok := oldObj.(*corev1.PersistentVolume); ok {
		if old.ResourceVersion == pv.ResourceVersion ||
			equality.Semantic.DeepEqual(old.Spec.Capacity, pv.Spec.Capacity) &&
				old.Spec.StorageClassName == pv.Spec.StorageClassName &&
				equality.Semantic.DeepEqual(old.Spec.NodeAffinity, pv.Spec.NodeAffinity) {
			return // a resync, or a change that leaves the capacity alone
		}
		c.refreshPV(logger, old)
	}
	c.refreshPV(logger, pv)
}

// refreshPV refreshes the items of every wanted class in the segments
// pv's node affinity allows: all of them for a volume without node
// affinity, none for a volume in a segment this controller does not
// publish (another node's, with --node-deployment). Every class, not only
// pv's: classes of one driver may share a pool, and only the driver knows
// which.
func (c *Controller) refreshPV(logger klog.Logger, pv *corev1.PersistentVolume) {
	var segs []string
	for _, seg := range c.topo.keys() {
		if affinityMatches(pv.Spec.NodeAffinity, segmentLabels(seg)) {
			segs = append(segs, seg)
		}
	}
	if len(segs) == 0 {
		return
	}
	classes := c.wantedClasses()
	logger.V(5).Info("PersistentVolume changed, refreshing its segments", "persistentVolume", klog.KObj(pv), "segments", segs, "storageClasses", classes)
	for _, class := range classes {
		for _, seg := range segs {
			c.refresh(workItem{class: class, segment: seg})
		}
	}
}

// objectChanged queues the item of an object that appeared or changed,
// unless it is the object the last sync left, unchanged: the controller's
// own writes coming back (and resyncs) cost nothing. A hand edit, a
// duplicate or an object of an earlier run or of upstream is synced.
func (c *Controller) objectChanged(logger klog.Logger, obj any) {
	o, ok := obj.(*storagev1.CSIStorageCapacity)
	if !ok {
		return
	}
	it := itemOf(o)
	if c.upToDate(it, o) {
		return
	}
	logger.V(5).Info("CSIStorageCapacity changed", "csiStorageCapacity", klog.KObj(o), "storageClass", it.class, "segment", it.segment)
	c.q.Q.Add(it)
}

// objectDeleted queues the item of a deleted object: if it is still
// wanted, the sync makes it again. A duplicate going (the item has another
// object) queues nothing.
func (c *Controller) objectDeleted(logger klog.Logger, obj any) {
	o, ok := obj.(*storagev1.CSIStorageCapacity)
	if !ok {
		return
	}
	it := itemOf(o)
	if !c.forgetObject(it, o.UID) {
		return
	}
	logger.V(5).Info("CSIStorageCapacity deleted", "csiStorageCapacity", klog.KObj(o), "storageClass", it.class, "segment", it.segment)
	c.q.Q.Add(it)
}

// csiNodeChanged recomputes the segment of a node whose CSINode appeared,
// went, or changed the driver's entry.
func (c *Controller) csiNodeChanged(logger klog.Logger, oldObj, obj any) {
	n, ok := obj.(*storagev1.CSINode)
	if !ok {
		return
	}
	if old, ok := oldObj.(*storagev1.CSINode); ok {
		oldKeys, oldHas := driverTopologyKeys(old, c.cfg.DriverName)
		keys, has := driverTopologyKeys(n, c.cfg.DriverName)
		if oldHas == has && slices.Equal(oldKeys, keys) {
			return
		}
	}
	c.updateNode(logger, n.Name)
}

// nodeChanged recomputes the segment of a Node that appeared, went, or
// changed its labels.
func (c *Controller) nodeChanged(logger klog.Logger, oldObj, obj any) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return
	}
	if old, ok := oldObj.(*corev1.Node); ok && maps.Equal(old.Labels, n.Labels) {
		return
	}
	c.updateNode(logger, n.Name)
}

// updateNode recomputes the segment of node and queues the items of a
// segment that appeared or vanished with it.
func (c *Controller) updateNode(logger klog.Logger, node string) {
	key, has := c.nodeSegment(node)
	added, addedOK, removed, removedOK := c.topo.setNode(node, key, has)
	if addedOK {
		logger.V(2).Info("Topology segment appeared", "segment", added, "node", node)
		c.enqueueSegment(added)
	}
	if removedOK {
		logger.V(2).Info("Topology segment vanished", "segment", removed, "node", node)
		c.enqueueSegment(removed)
	}
}

// enqueueSegment queues every wanted class in segment key and every object
// of it.
func (c *Controller) enqueueSegment(key string) {
	for _, class := range c.wantedClasses() {
		c.q.Q.Add(workItem{class: class, segment: key})
	}
	c.enqueueObjects(func(it workItem) bool { return it.segment == key })
}

// nodeSegment is the segment node contributes: none unless its CSINode
// lists the driver and its Node exists with every topology label the
// driver names there (a label not set yet comes with a later Node update).
// A driver without topology contributes the empty segment.
func (c *Controller) nodeSegment(node string) (string, bool) {
	csiNode, err := c.csiNodeLister.Get(node)
	if err != nil {
		return "", false
	}
	keys, has := driverTopologyKeys(csiNode, c.cfg.DriverName)
	if !has {
		return "", false
	}
	n, err := c.nodeLister.Get(node)
	if err != nil {
		return "", false
	}
	if !c.topologyCapable {
		return "", true
	}
	labels := make(map[string]string, len(keys))
	for _, k := range keys {
		v, ok := n.Labels[k]
		if !ok {
			return "", false
		}
		labels[k] = v
	}
	return segmentKey(labels), true
}

// resyncTopology recomputes the segment of every node known to the CSINode
// cache or to the topology.
func (c *Controller) resyncTopology(ctx context.Context) {
	logger := klog.FromContext(ctx)
	names := map[string]bool{}
	for _, obj := range c.csiNodeInformer.GetIndexer().List() {
		if n, ok := obj.(*storagev1.CSINode); ok {
			names[n.Name] = true
		}
	}
	for _, n := range c.topo.nodeNames() {
		names[n] = true
	}
	for _, n := range slices.Sorted(maps.Keys(names)) {
		c.updateNode(logger, n)
	}
}

// driverTopologyKeys returns the topology keys the CSINode lists for
// driver, sorted, and whether it lists the driver at all.
func driverTopologyKeys(n *storagev1.CSINode, driver string) ([]string, bool) {
	for _, d := range n.Spec.Drivers {
		if d.Name == driver {
			return slices.Sorted(slices.Values(d.TopologyKeys)), true
		}
	}
	return nil, false
}
