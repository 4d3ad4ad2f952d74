package attach

import (
	"context"
	"slices"

	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/klog/v2"
)

// syncPV removes the finalizer from a PersistentVolume that is being deleted
// once no VolumeAttachment refers to it. A PersistentVolume that is not
// being deleted keeps it: a volume may be attached again until then.
func (c *Controller) syncPV(ctx context.Context, name string) error {
	pv, err := c.pvLister.Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if pv.DeletionTimestamp == nil || !slices.Contains(pv.Finalizers, c.finalizer) {
		return nil
	}
	logger := klog.LoggerWithValues(klog.FromContext(ctx), "persistentVolume", klog.KObj(pv))
	ctx = klog.NewContext(ctx, logger)
	objs, err := c.vaIndexer.ByIndex(indexByPV, name)
	if err != nil {
		return err
	}
	for _, obj := range objs {
		if va, ok := obj.(*storagev1.VolumeAttachment); ok {
			// Its deletion queues the PersistentVolume again.
			logger.V(4).Info("PersistentVolume keeps its finalizer: a VolumeAttachment refers to it", "volumeAttachment", klog.KObj(va))
			return nil
		}
	}
	if err := c.removePVFinalizer(ctx, pv); err != nil {
		return err
	}
	logger.V(2).Info("Removed finalizer from PersistentVolume")
	return nil
}
