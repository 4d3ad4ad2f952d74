package resize

import (
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/loopvol/loopvol/internal/kube"
)

// addEventHandlers adds the modify controller's handlers to the claim,
// volume and class informers. On an error the handlers added so far are
// removed again.
func (c *ModifyController) addEventHandlers(logger klog.Logger) (*kube.Handlers, error) {
	hs := &kube.Handlers{}
	// Claims are resynced, as upstream's: a class changed again while a
	// modification ran may have been judged on the state before it.
	err := hs.Add(c.pvcInformer, cache.ResourceEventHandlerFuncs{
		AddFunc:    c.claimAdded,
		UpdateFunc: c.claimUpdated,
		DeleteFunc: c.claimDeleted,
	}, c.cfg.Resync)
	if err == nil {
		err = hs.Add(c.pvInformer, cache.ResourceEventHandlerFuncs{
			AddFunc:    c.volumeAdded,
			DeleteFunc: c.volumeDeleted,
		}, 0)
	}
	if err == nil {
		// A class made after the claims that name it: their Pending
		// modification can go ahead now. (Upstream waits for the claims'
		// resync.) Classes are immutable, so updates bring nothing.
		err = hs.Add(c.vacInformer, cache.ResourceEventHandlerFuncs{AddFunc: c.classAdded}, 0)
	}
	if err != nil {
		hs.Remove(logger)
		return nil, err
	}
	return hs, nil
}

// shouldEnqueue tells whether an update of a claim may need a modify sync:
// a resync, a changed class in the spec, a changed current class or
// modification status that is not the controller's own write (a user, or
// another resizer before a switch-over), or a changed binding. The resize
// controller's writes (sizes, resize conditions) do not queue it, nor do
// this controller's own writes, which would cut a backoff short.
func (c *ModifyController) shouldEnqueue(old, pvc *corev1.PersistentVolumeClaim) bool {
	if old.ResourceVersion == pvc.ResourceVersion {
		return true
	}
	if c.state.ownWrite(claimKey(pvc), pvc.ResourceVersion) {
		return false
	}
	switch {
	case ptr.Deref(old.Spec.VolumeAttributesClassName, "") != ptr.Deref(pvc.Spec.VolumeAttributesClassName, ""):
		return true
	case ptr.Deref(old.Status.CurrentVolumeAttributesClassName, "") != ptr.Deref(pvc.Status.CurrentVolumeAttributesClassName, ""):
		return true
	case !equality.Semantic.DeepEqual(old.Status.ModifyVolumeStatus, pvc.Status.ModifyVolumeStatus):
		return true
	case old.UID != pvc.UID, old.Spec.VolumeName != pvc.Spec.VolumeName, old.Status.Phase != pvc.Status.Phase:
		return true
	}
	return false
}

func (c *ModifyController) claimDeleted(obj any) {
	pvc, ok := kube.Tombstoned(obj).(*corev1.PersistentVolumeClaim)
	if !ok {
		return
	}
	key := claimKey(pvc)
	c.state.drop(key, string(pvc.UID))
	c.mods.drop(key)
	// Its sync finds it gone and forgets its backoff.
	c.queue.Q.Add(key)
}

// volumeAdded queues the claim of a new volume of the driver: a claim
// whose sync found its volume missing from the cache waits for it.
func (c *ModifyController) volumeAdded(obj any) {
	pv, ok := obj.(*corev1.PersistentVolume)
	if !ok || pv.Spec.CSI == nil || pv.Spec.CSI.Driver != c.cfg.DriverName || pv.Spec.ClaimRef == nil {
		return
	}
	c.queue.Q.Add(pv.Spec.ClaimRef.Namespace + "/" + pv.Spec.ClaimRef.Name)
}

func (c *ModifyController) volumeDeleted(obj any) {
	if pv, ok := kube.Tombstoned(obj).(*corev1.PersistentVolume); ok {
		c.state.dropVolume(pv.Name)
	}
}

// classAdded queues every claim that asks for the new class and does not
// have it yet (a class of another driver too: the claim then learns that it
// cannot have it). Classes are made rarely; a scan of the cached claims is
// cheaper than an index kept up to date on every claim event.
func (c *ModifyController) classAdded(obj any) {
	vac, ok := obj.(*storagev1.VolumeAttributesClass)
	if !ok {
		return
	}
	claims, err := c.pvcLister.List(labels.Everything())
	if err != nil {
		return
	}
	for _, pvc := range claims {
		if ptr.Deref(pvc.Spec.VolumeAttributesClassName, "") == vac.Name && ptr.Deref(pvc.Status.CurrentVolumeAttributesClassName, "") != vac.Name {
			c.queue.Q.Add(claimKey(pvc))
		}
	}
}
