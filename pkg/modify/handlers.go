package modify

import (
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/loopvol/loopvol/internal/kube"
)

// The claim and volume handlers are the claim queue's (kube.ClaimQueue);
// the controller adds its class handler and decides which claim updates
// need a sync.

// addClassHandler adds the class informer's handler. A class made after
// the claims that name it lets their Pending modification go ahead now.
// (Upstream waits for the claims' resync.) Classes are immutable, so
// updates bring nothing.
func (c *Controller) addClassHandler(hs *kube.Handlers) error {
	return hs.Add(c.vacInformer, cache.ResourceEventHandlerFuncs{AddFunc: c.classAdded}, 0)
}

// shouldEnqueue tells whether an update of a claim by someone else (a
// user, or another resizer before a switch-over) may need a modify sync: a
// changed class in the spec, a changed current class or modification
// status, or a changed binding. The resize controller's writes (sizes,
// resize conditions) do not queue it. (Resyncs always do, and this
// controller's own writes never: kube.ClaimQueue.ClaimUpdated.)
func (c *Controller) shouldEnqueue(old, pvc *corev1.PersistentVolumeClaim) bool {
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

// classAdded queues every claim that asks for the new class and does not
// have it yet (a class of another driver too: the claim then learns that it
// cannot have it). Classes are made rarely; a scan of the cached claims is
// cheaper than an index kept up to date on every claim event.
func (c *Controller) classAdded(obj any) {
	vac, ok := obj.(*storagev1.VolumeAttributesClass)
	if !ok {
		return
	}
	claims, err := c.claims.PVCs.List(labels.Everything())
	if err != nil {
		return
	}
	for _, pvc := range claims {
		if ptr.Deref(pvc.Spec.VolumeAttributesClassName, "") == vac.Name && ptr.Deref(pvc.Status.CurrentVolumeAttributesClassName, "") != vac.Name {
			c.claims.Queue.Q.Add(kube.ClaimKey(pvc))
		}
	}
}
