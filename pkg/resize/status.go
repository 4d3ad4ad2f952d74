package resize

import (
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/loopvol/loopvol/internal/kube"
)

// Messages of the claim conditions the controller sets.
const (
	msgFileSystemResizePending = "The volume has grown; the node grows the file system when a pod using it (re)starts."
)

// resizeConditions are the claim condition types that belong to an
// expansion. Each step of one replaces them; any other condition is left
// alone.
var resizeConditions = []corev1.PersistentVolumeClaimConditionType{
	corev1.PersistentVolumeClaimResizing,
	corev1.PersistentVolumeClaimFileSystemResizePending,
	corev1.PersistentVolumeClaimControllerResizeError,
	corev1.PersistentVolumeClaimNodeResizeError,
}

// setConditions gives pvc the resize conditions want (status True), keeps
// the old resize conditions whose type is in keep, and drops the other
// resize conditions. Other conditions stay as they are. A condition that
// was already there with the same status keeps its transition time, so
// that a step repeated with the same outcome changes nothing.
func setConditions(pvc *corev1.PersistentVolumeClaim, now time.Time, keep []corev1.PersistentVolumeClaimConditionType, want ...corev1.PersistentVolumeClaimCondition) {
	old := pvc.Status.Conditions
	var out []corev1.PersistentVolumeClaimCondition
	for _, c := range old {
		switch {
		case !slices.Contains(resizeConditions, c.Type):
			out = append(out, c)
		case slices.ContainsFunc(want, func(w corev1.PersistentVolumeClaimCondition) bool { return w.Type == c.Type }):
			// Replaced below, in place.
			out = append(out, c)
		case slices.Contains(keep, c.Type):
			out = append(out, c)
		}
	}
	for _, w := range want {
		w.Status = corev1.ConditionTrue
		w.LastTransitionTime = metav1.NewTime(now)
		i := slices.IndexFunc(out, func(c corev1.PersistentVolumeClaimCondition) bool { return c.Type == w.Type })
		if i < 0 {
			out = append(out, w)
			continue
		}
		if out[i].Status == w.Status {
			w.LastTransitionTime = out[i].LastTransitionTime
			w.LastProbeTime = out[i].LastProbeTime
		}
		out[i] = w
	}
	pvc.Status.Conditions = out
}

// setResourceStatus sets (or, for "", removes) the claim's
// allocatedResourceStatuses for storage.
func setResourceStatus(pvc *corev1.PersistentVolumeClaim, s corev1.ClaimResourceStatus) {
	if s == "" {
		delete(pvc.Status.AllocatedResourceStatuses, corev1.ResourceStorage)
		return
	}
	if pvc.Status.AllocatedResourceStatuses == nil {
		pvc.Status.AllocatedResourceStatuses = map[corev1.ResourceName]corev1.ClaimResourceStatus{}
	}
	pvc.Status.AllocatedResourceStatuses[corev1.ResourceStorage] = s
}

func setAllocated(pvc *corev1.PersistentVolumeClaim, q resource.Quantity) {
	if pvc.Status.AllocatedResources == nil {
		pvc.Status.AllocatedResources = corev1.ResourceList{}
	}
	pvc.Status.AllocatedResources[corev1.ResourceStorage] = q
}

func setAnnotation(pvc *corev1.PersistentVolumeClaim, key string, on bool) {
	if !on {
		delete(pvc.Annotations, key)
		return
	}
	if pvc.Annotations == nil {
		pvc.Annotations = map[string]string{}
	}
	pvc.Annotations[key] = "true"
}

// claimPatch is the merge patch of the status subresource that turns old
// into new in the fields the controller writes: capacity, allocatedResources
// and allocatedResourceStatuses for storage, the conditions (the whole list:
// a merge patch cannot change one element) and the
// node-expansion-not-required annotation. It carries old's
// resourceVersion, so it fails with a conflict when old was stale rather
// than overwrite conditions someone else changed meanwhile. It is nil when
// old and new agree.
func claimPatch(old, new *corev1.PersistentVolumeClaim) []byte {
	status := map[string]any{}
	if v, changed := storageValue(old.Status.Capacity, new.Status.Capacity); changed && v != nil {
		// Capacity is never removed.
		status["capacity"] = map[string]any{string(corev1.ResourceStorage): v}
	}
	if v, changed := storageValue(old.Status.AllocatedResources, new.Status.AllocatedResources); changed {
		status["allocatedResources"] = map[string]any{string(corev1.ResourceStorage): v}
	}
	oldS, hadS := old.Status.AllocatedResourceStatuses[corev1.ResourceStorage]
	newS, hasS := new.Status.AllocatedResourceStatuses[corev1.ResourceStorage]
	if oldS != newS || hadS != hasS {
		var v any
		if hasS {
			v = newS
		}
		status["allocatedResourceStatuses"] = map[string]any{string(corev1.ResourceStorage): v}
	}
	if !equality.Semantic.DeepEqual(old.Status.Conditions, new.Status.Conditions) {
		var v any
		if len(new.Status.Conditions) > 0 {
			v = new.Status.Conditions
		}
		status["conditions"] = v
	}
	metadata := map[string]any{}
	oldA, hadA := old.Annotations[NodeExpansionNotRequiredAnnotation]
	newA, hasA := new.Annotations[NodeExpansionNotRequiredAnnotation]
	if oldA != newA || hadA != hasA {
		var v any
		if hasA {
			v = newA
		}
		metadata["annotations"] = map[string]any{NodeExpansionNotRequiredAnnotation: v}
	}
	if len(status) == 0 && len(metadata) == 0 {
		return nil
	}
	metadata["resourceVersion"] = old.ResourceVersion
	p := map[string]any{"metadata": metadata}
	if len(status) > 0 {
		p["status"] = status
	}
	return kube.MustJSON(p)
}

// storageValue compares the storage entries of two resource lists and
// returns the new one (nil when absent) and whether it differs.
func storageValue(old, new corev1.ResourceList) (any, bool) {
	o, hadO := old[corev1.ResourceStorage]
	n, hasN := new[corev1.ResourceStorage]
	if hadO == hasN && (!hasN || o.Cmp(n) == 0) {
		return nil, false
	}
	if !hasN {
		return nil, true
	}
	return n.String(), true
}

// volumePatch is the merge patch that gives pv the capacity size and, when
// preResize is set and pv has no such annotation yet, the pre-resize
// capacity annotation; nil when pv says so already. The annotation keeps
// the size from before the first of several expansions that the node has
// not caught up with.
func volumePatch(pv *corev1.PersistentVolume, size resource.Quantity, preResize *resource.Quantity) []byte {
	p := map[string]any{}
	if cur, ok := pv.Spec.Capacity[corev1.ResourceStorage]; !ok || cur.Cmp(size) != 0 {
		p["spec"] = map[string]any{"capacity": map[string]any{string(corev1.ResourceStorage): size.String()}}
	}
	if _, has := pv.Annotations[PreResizeCapacityAnnotation]; preResize != nil && !has {
		p["metadata"] = map[string]any{"annotations": map[string]any{PreResizeCapacityAnnotation: preResize.String()}}
	}
	if len(p) == 0 {
		return nil
	}
	return kube.MustJSON(p)
}

// removePreResizePatch is the merge patch that removes the pre-resize
// capacity annotation from a PersistentVolume.
func removePreResizePatch() []byte {
	return kube.MustJSON(map[string]any{"metadata": map[string]any{"annotations": map[string]any{PreResizeCapacityAnnotation: nil}}})
}
