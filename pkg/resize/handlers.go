package resize

import (
	corev1 "k8s.io/api/core/v1"

	"github.com/loopvol/loopvol/internal/kube"
)

// The claim and volume handlers are the claim queue's (kube.ClaimQueue);
// the controller decides which claim updates need a sync.

// claimKey is the claim's key in the queue and in the controller's own
// writes (kube.ClaimKey).
func claimKey(pvc *corev1.PersistentVolumeClaim) string { return kube.ClaimKey(pvc) }

// shouldEnqueue tells whether an update of a claim by someone else may
// need a sync. Most do not (labels, annotations of others, kubelet's
// unrelated writes). Queued: a changed request (raised, or lowered to
// recover from a failure), binding, a capacity that grew (the node
// finished: the pre-resize annotation may go), a changed resize status
// (the node failed or finished) and a changed resizer annotation.
// (Resyncs always are, and the controller's own status writes never,
// which would cut a backoff short: kube.ClaimQueue.ClaimUpdated.)
func (c *Controller) shouldEnqueue(old, pvc *corev1.PersistentVolumeClaim) bool {
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
