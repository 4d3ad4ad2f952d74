package kube

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
)

// lastAppliedAnnotation is kubectl's copy of an applied object, often the
// largest part of a hand-made object.
const lastAppliedAnnotation = "kubectl.kubernetes.io/last-applied-configuration"

// StripForCache drops from a cached object what no controller reads:
// managedFields and kubectl's last-applied copy. Objects that are not API
// objects (tombstones) pass unchanged.
func StripForCache(obj any) (any, error) {
	a, err := meta.Accessor(obj)
	if err != nil {
		return obj, nil
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

// StripPV keeps of a PersistentVolume only fields (and its name, UID,
// resourceVersion, finalizers and deletion state), then applies
// StripForCache.
func StripPV(obj any, fields PVFields) (any, error) {
	pv, ok := obj.(*corev1.PersistentVolume)
	if !ok {
		return StripForCache(obj)
	}
	spec := corev1.PersistentVolumeSpec{PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: pv.Spec.CSI}}
	if fields&(PVAttach|PVResize) != 0 {
		spec.AccessModes = pv.Spec.AccessModes
		spec.VolumeMode = pv.Spec.VolumeMode
	}
	if fields&(PVAttach|PVResize) != 0 {
		spec.MountOptions = pv.Spec.MountOptions
	}
	if fields&(PVCapacity|PVResize) != 0 {
		spec.Capacity = pv.Spec.Capacity
		spec.StorageClassName = pv.Spec.StorageClassName
	}
	if fields&(PVCapacity|PVResize) != 0 {
		spec.NodeAffinity = pv.Spec.NodeAffinity
	}
	var status corev1.PersistentVolumeStatus
	if fields&PVResize != 0 {
		spec.ClaimRef = pv.Spec.ClaimRef
		spec.VolumeAttributesClassName = pv.Spec.VolumeAttributesClassName
		status.Phase = pv.Status.Phase
	} else {
		pv.Annotations = nil
	}
	pv.Labels, pv.OwnerReferences = nil, nil
	pv.Spec, pv.Status = spec, status
	return StripForCache(pv)
}

// stripNode keeps of a Node only its metadata: the sidecar reads its name,
// UID and labels.
func stripNode(obj any) (any, error) {
	if n, ok := obj.(*corev1.Node); ok {
		n.Annotations = nil
		n.Spec = corev1.NodeSpec{}
		n.Status = corev1.NodeStatus{}
	}
	return StripForCache(obj)
}

// stripUnscheduledPod keeps of a Pod its metadata (no annotations), its
// volumes, tolerations and node name, and its PodScheduled condition.
func stripUnscheduledPod(obj any) (any, error) {
	if p, ok := obj.(*corev1.Pod); ok {
		p.Annotations = nil
		p.Spec = corev1.PodSpec{Volumes: p.Spec.Volumes, Tolerations: p.Spec.Tolerations, NodeName: p.Spec.NodeName}
		var conds []corev1.PodCondition
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled {
				conds = append(conds, c)
			}
		}
		p.Status = corev1.PodStatus{Phase: p.Status.Phase, Conditions: conds}
	}
	return StripForCache(obj)
}
