package capacity

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/loopvol/loopvol/internal/kube"
)

// createdTTL is how long an object the controller created counts as
// existing while the cache does not show it yet. The watch delivers it in
// milliseconds; the limit only matters when an object was created and
// deleted while the watch was down, so neither event ever came.
const createdTTL = 30 * time.Second

// figures are what GetCapacity says about an item.
type figures struct {
	capacity resource.Quantity
	maxSize  *resource.Quantity // nil: the driver did not say
}

func (f figures) equal(capacity, maxSize *resource.Quantity) bool {
	return sameQuantity(&f.capacity, capacity) && sameQuantity(f.maxSize, maxSize)
}

func sameQuantity(a, b *resource.Quantity) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Cmp(*b) == 0
}

// itemState is what the controller remembers of one item between syncs.
type itemState struct {
	// lastSync is when the last sync started (refresh coalesces by it).
	lastSync time.Time
	// checked is when the last sync that succeeded started: the object
	// was then as the driver's answer says (loopvol_capacity_oldest_check_seconds).
	checked time.Time
	// published is the object the last successful sync left in place, and
	// its figures: an event showing that object with those figures is the
	// controller's own write coming back.
	publishedUID types.UID
	published    *figures
	// ahead is the object as the controller's last write returned it,
	// until the cache shows that write (Controller.writes knows its
	// resourceVersion and time): after a create, the object the cache
	// does not have yet (created); after a patch, the object whose cached
	// copy is older. A sync never writes twice because its cache lags
	// behind its own write.
	ahead   *storagev1.CSIStorageCapacity
	created bool
}

// state returns the state of it, made if missing. Call with c.mu held.
func (c *Controller) state(it workItem) *itemState {
	st := c.items[it]
	if st == nil {
		st = &itemState{}
		c.items[it] = st
	}
	return st
}

// upToDate tells whether o is the object the last sync of it left (or the
// one a create in flight is making), with the figures it published and the
// right owner.
func (c *Controller) upToDate(it workItem, o *storagev1.CSIStorageCapacity) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.items[it]
	return st != nil && st.published != nil && (st.publishedUID == o.UID || st.publishedUID == "") &&
		st.published.equal(o.Capacity, o.MaximumVolumeSize) && !c.ownerMissing(o)
}

// intend records, before a write, what the object of it will be: the watch
// event of the write may come before the write's answer, and must be known
// for the controller's own. uid is "" for a create. A failed write undoes
// it with unintend.
func (c *Controller) intend(it workItem, uid types.UID, want figures) {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.state(it)
	st.publishedUID, st.published = uid, &want
}

func (c *Controller) unintend(it workItem) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if st := c.items[it]; st != nil {
		st.publishedUID, st.published = "", nil
	}
}

// forgetObject drops what the controller remembers of a deleted object.
// It returns false when the item's published object is another one: the
// deleted one was a duplicate, and the item needs nothing.
func (c *Controller) forgetObject(it workItem, uid types.UID) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.items[it]
	if st == nil {
		return true
	}
	if st.ahead != nil && st.ahead.UID == uid {
		st.ahead = nil
	}
	switch st.publishedUID {
	case uid:
		st.publishedUID, st.published = "", nil
	case "":
	default:
		return false
	}
	return true
}

// objectsOf returns the objects of it: the cached ones, with the
// controller's own last write in place of a cached copy that predates it.
func (c *Controller) objectsOf(it workItem) []*storagev1.CSIStorageCapacity {
	cached, _ := c.objects.ByIndex(indexByItem, itemIndexKey(it))
	objs := make([]*storagev1.CSIStorageCapacity, 0, len(cached)+1)
	for _, obj := range cached {
		if o, ok := obj.(*storagev1.CSIStorageCapacity); ok {
			objs = append(objs, o)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.items[it]
	if st == nil || st.ahead == nil {
		return objs
	}
	a := st.ahead
	_, at := c.writes.Last(it)
	i := slices.IndexFunc(objs, func(o *storagev1.CSIStorageCapacity) bool { return o.UID == a.UID })
	switch {
	case i >= 0 && c.writes.Stale(it, objs[i].ResourceVersion):
		objs[i] = a // the cache has not seen the patch yet
	case i >= 0:
		st.ahead = nil // the cache has caught up (or moved on)
	case st.created && c.clock.Since(at) < createdTTL:
		objs = append(objs, a) // the cache has not seen the create yet
	default:
		st.ahead = nil // patched, then deleted; or created long ago and never seen
	}
	return objs
}

// sync makes the objects of it what they should be: none when the class or
// the segment is gone, else exactly one, with the driver's current figures
// and the owner. It writes nothing when they already are.
func (c *Controller) sync(ctx context.Context, it workItem) error {
	logger := klog.LoggerWithValues(klog.FromContext(ctx), "storageClass", it.class, "segment", it.segment)
	ctx = klog.NewContext(ctx, logger)
	began := c.clock.Now()
	c.mu.Lock()
	c.state(it).lastSync = began
	c.mu.Unlock()

	sc, wanted := c.wanted(it)
	objs := c.objectsOf(it)
	if !wanted {
		var errs []error
		for _, o := range objs {
			errs = append(errs, c.delete(ctx, it, o, "obsolete"))
		}
		err := errors.Join(errs...)
		if err == nil {
			c.mu.Lock()
			delete(c.items, it)
			c.mu.Unlock()
			c.writes.Forget(it)
		}
		return err
	}

	want, err := c.getCapacity(ctx, sc, it.segment)
	if err != nil {
		return err
	}
	c.sortObjects(objs)
	for _, dup := range objs[min(1, len(objs)):] {
		if err := c.delete(ctx, it, dup, "duplicate"); err != nil {
			return err
		}
	}
	if len(objs) == 0 {
		err = c.create(ctx, it, want)
	} else {
		err = c.update(ctx, it, objs[0], want)
	}
	if err == nil {
		c.mu.Lock()
		c.state(it).checked = began
		c.mu.Unlock()
	}
	return err
}

// getCapacity asks the driver about sc in the segment key. The empty
// segment, and every segment of a driver without topology, is asked about
// without accessible_topology.
func (c *Controller) getCapacity(ctx context.Context, sc *storagev1.StorageClass, key string) (figures, error) {
	req := &csi.GetCapacityRequest{Parameters: sc.Parameters}
	if labels := segmentLabels(key); c.topologyCapable && len(labels) > 0 {
		req.AccessibleTopology = &csi.Topology{Segments: labels}
	}
	rsp, err := c.csi.GetCapacity(ctx, req)
	if err != nil {
		return figures{}, err
	}
	f := figures{capacity: *resource.NewQuantity(rsp.GetAvailableCapacity(), resource.BinarySI)}
	if m := rsp.GetMaximumVolumeSize(); m != nil {
		f.maxSize = resource.NewQuantity(m.GetValue(), resource.BinarySI)
	}
	return f, nil
}

// sortObjects puts the object to keep first: the one the controller's
// owner already owns, else the oldest. The rest are duplicates.
func (c *Controller) sortObjects(objs []*storagev1.CSIStorageCapacity) {
	slices.SortFunc(objs, func(a, b *storagev1.CSIStorageCapacity) int {
		if ma, mb := c.ownerMissing(a), c.ownerMissing(b); ma != mb {
			if mb {
				return -1
			}
			return 1
		}
		if d := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); d != 0 {
			return d
		}
		return cmp.Compare(a.Name, b.Name)
	})
}

// ownerMissing tells whether o lacks the controller's owner as its
// controlling owner.
func (c *Controller) ownerMissing(o *storagev1.CSIStorageCapacity) bool {
	if c.owner == nil {
		return false
	}
	return !slices.ContainsFunc(o.OwnerReferences, func(r metav1.OwnerReference) bool {
		return r.Controller != nil && *r.Controller && r.UID == c.owner.UID
	})
}

// ownerReferences are o's owner references with the controller's owner as
// the one controlling owner: another controlling reference (of an earlier
// owner, such as upstream's StatefulSet) is replaced, since there can be
// only one.
func (c *Controller) ownerReferences(o *storagev1.CSIStorageCapacity) []metav1.OwnerReference {
	refs := []metav1.OwnerReference{}
	for _, r := range o.OwnerReferences {
		if r.Controller == nil || !*r.Controller {
			refs = append(refs, r)
		}
	}
	return append(refs, *c.owner)
}

// create makes the object of it.
func (c *Controller) create(ctx context.Context, it workItem, want figures) error {
	obj := &storagev1.CSIStorageCapacity{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: GenerateName,
			Namespace:    c.cfg.Namespace,
			Labels:       map[string]string{DriverNameLabel: c.cfg.DriverName, ManagedByLabel: c.managedBy},
		},
		StorageClassName:  it.class,
		NodeTopology:      nodeTopology(it.segment),
		Capacity:          &want.capacity,
		MaximumVolumeSize: want.maxSize,
	}
	if c.owner != nil {
		obj.OwnerReferences = []metav1.OwnerReference{*c.owner}
	}
	if err := kube.StillLeading(ctx); err != nil {
		return err
	}
	c.intend(it, "", want)
	created, err := c.client.StorageV1().CSIStorageCapacities(c.cfg.Namespace).Create(ctx, obj, metav1.CreateOptions{})
	if err != nil {
		c.unintend(it)
		return fmt.Errorf("create the CSIStorageCapacity: %w", err)
	}
	klog.FromContext(ctx).V(2).Info("Created CSIStorageCapacity", "csiStorageCapacity", klog.KObj(created),
		"capacity", want.capacity.String(), "maximumVolumeSize", quantityString(want.maxSize))
	c.wrote(it, created, want, true, true)
	return nil
}

// update patches o when its figures or owner differ from what they should
// be, with a merge patch of just what differs. A new owner list is patched
// with o's resourceVersion as a precondition: it replaces the whole list,
// so it must not replace a list it has not seen.
func (c *Controller) update(ctx context.Context, it workItem, o *storagev1.CSIStorageCapacity, want figures) error {
	patch := map[string]any{}
	if !sameQuantity(o.Capacity, &want.capacity) {
		patch["capacity"] = want.capacity
	}
	if !sameQuantity(o.MaximumVolumeSize, want.maxSize) {
		patch["maximumVolumeSize"] = want.maxSize // nil removes it
	}
	if c.ownerMissing(o) {
		patch["metadata"] = map[string]any{"ownerReferences": c.ownerReferences(o), "resourceVersion": o.ResourceVersion}
	}
	if len(patch) == 0 {
		c.wrote(it, o, want, false, false)
		return nil
	}
	data, err := json.Marshal(patch)
	if err != nil {
		return fmt.Errorf("encode the patch of CSIStorageCapacity %s: %w", o.Name, err)
	}
	if err := kube.StillLeading(ctx); err != nil {
		return err
	}
	c.intend(it, o.UID, want)
	patched, err := c.client.StorageV1().CSIStorageCapacities(o.Namespace).Patch(ctx, o.Name, types.MergePatchType, data, metav1.PatchOptions{})
	if err != nil {
		c.unintend(it)
		if apierrors.IsNotFound(err) {
			c.forgetObject(it, o.UID)
		}
		return fmt.Errorf("patch CSIStorageCapacity %s: %w", o.Name, err)
	}
	klog.FromContext(ctx).V(2).Info("Updated CSIStorageCapacity", "csiStorageCapacity", klog.KObj(patched),
		"capacity", want.capacity.String(), "maximumVolumeSize", quantityString(want.maxSize),
		"oldCapacity", quantityString(o.Capacity), "oldMaximumVolumeSize", quantityString(o.MaximumVolumeSize))
	c.wrote(it, patched, want, true, false)
	return nil
}

// wrote records that o is the object of it with the figures want. After
// a write (written; created: a create), o as the write returned it is
// ahead of the cache until the cache shows it. A patch of an object whose
// create the cache has not shown yet stays that create.
func (c *Controller) wrote(it workItem, o *storagev1.CSIStorageCapacity, want figures, written, created bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.state(it)
	st.publishedUID, st.published = o.UID, &want
	if !written {
		return
	}
	if st.ahead != nil && st.ahead.UID == o.UID {
		created = created || st.created
	}
	st.ahead, st.created = o, created
	c.writes.Record(it, o.ResourceVersion, c.clock.Now())
}

// delete deletes o (only that object: a UID precondition). An object
// already gone is no error.
func (c *Controller) delete(ctx context.Context, it workItem, o *storagev1.CSIStorageCapacity, reason string) error {
	// A replica that may have lost its Lease writes nothing: the new
	// leader publishes from its own, fresher view.
	if err := kube.StillLeading(ctx); err != nil {
		return err
	}
	err := c.client.StorageV1().CSIStorageCapacities(o.Namespace).Delete(ctx, o.Name, metav1.DeleteOptions{
		Preconditions: &metav1.Preconditions{UID: &o.UID},
	})
	c.forgetObject(it, o.UID)
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return fmt.Errorf("delete %s CSIStorageCapacity %s: %w", reason, o.Name, err)
	}
	klog.FromContext(ctx).V(2).Info("Deleted CSIStorageCapacity", "csiStorageCapacity", klog.KObj(o), "reason", reason)
	return nil
}

func quantityString(q *resource.Quantity) string {
	if q == nil {
		return "<none>"
	}
	return q.String()
}
