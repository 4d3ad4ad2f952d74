package resize

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/loopvol/loopvol/internal/kube"
)

// addEventHandlers adds the controller's handlers to the claim and volume
// informers. On an error the handlers added so far are removed again.
func (c *Controller) addEventHandlers(logger klog.Logger) (*kube.Handlers, error) {
	hs := &kube.Handlers{}
	// Claims are resynced: a request raised again while an expansion ran
	// may have been judged on the state before it.
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
	if err != nil {
		hs.Remove(logger)
		return nil, err
	}
	return hs, nil
}

func claimKey(pvc *corev1.PersistentVolumeClaim) string { return pvc.Namespace + "/" + pvc.Name }

// shouldEnqueue tells whether an update of a claim may need a sync. Most
// updates do not (labels, annotations of others, kubelet's unrelated
// writes); and the controller's own status writes coming back must not
// sync the claim again at once, which would cut its backoff short.
// Queued: periodic resyncs (same resourceVersion), a changed request
// (raised, or lowered to recover from a failure), binding, a capacity that
// grew (the node finished: the pre-resize annotation may go), a changed
// resize status (the node failed or finished) and a changed resizer
// annotation.
func (c *Controller) shouldEnqueue(old, pvc *corev1.PersistentVolumeClaim) bool {
	if old.ResourceVersion == pvc.ResourceVersion {
		return true
	}
	if c.state.ownWrite(claimKey(pvc), pvc.ResourceVersion) {
		return false
	}
	oldReq, newReq := old.Spec.Resources.Requests[corev1.ResourceStorage], pvc.Spec.Resources.Requests[corev1.ResourceStorage]
	oldCap, newCap := old.Status.Capacity[corev1.ResourceStorage], pvc.Status.Capacity[corev1.ResourceStorage]
	switch {
	case oldReq.Cmp(newReq) != 0, newCap.Cmp(oldCap) > 0:
		return true
	case old.UID != pvc.UID, old.Spec.VolumeName != pvc.Spec.VolumeName, old.Status.Phase != pvc.Status.Phase:
		return true
	case old.Status.AllocatedResourceStatuses[corev1.ResourceStorage] != pvc.Status.AllocatedResourceStatuses[corev1.ResourceStorage]:
		return true
	case old.Annotations[ResizerAnnotation] != pvc.Annotations[ResizerAnnotation]:
		return true
	}
	return false
}

func (c *Controller) claimDeleted(obj any) {
	obj = kube.Tombstoned(obj)
	pvc, ok := obj.(*corev1.PersistentVolumeClaim)
	if !ok {
		return
	}
	key := claimKey(pvc)
	c.state.drop(key, string(pvc.UID))
	// Its sync finds it gone and forgets its backoff.
	c.queue.Q.Add(key)
}

// volumeAdded queues the claim of a new volume of the driver: a claim
// whose sync found its volume missing from the cache waits for it.
func (c *Controller) volumeAdded(obj any) {
	pv, ok := obj.(*corev1.PersistentVolume)
	if !ok || pv.Spec.CSI == nil || pv.Spec.CSI.Driver != c.cfg.DriverName || pv.Spec.ClaimRef == nil {
		return
	}
	c.queue.Q.Add(pv.Spec.ClaimRef.Namespace + "/" + pv.Spec.ClaimRef.Name)
}

func (c *Controller) volumeDeleted(obj any) {
	obj = kube.Tombstoned(obj)
	if pv, ok := obj.(*corev1.PersistentVolume); ok {
		c.state.dropVolume(pv.Name)
	}
}
