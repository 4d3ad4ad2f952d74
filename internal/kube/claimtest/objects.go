package claimtest

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/loopvol/loopvol/internal/kube/kubetest"
)

// The driver and namespace of the fixture's objects, and the time of the
// controllers' fake clocks.
const (
	Driver    = "loopvol.csi.io"
	Namespace = "apps"
)

var (
	// Now is the time the controller's fake clock says.
	Now = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	// Earlier is the transition time of the conditions Condition sets.
	Earlier = metav1.NewTime(Now.Add(-time.Hour))
	// TimeJSON is Now as a patch writes it.
	TimeJSON = Now.Format(time.RFC3339)
)

// Claim is claim name of Namespace, bound to volume pv-<name>, with the
// storage request and capacity given.
func Claim(name, request, capacity string, opts ...func(*corev1.PersistentVolumeClaim)) *corev1.PersistentVolumeClaim {
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: name, UID: types.UID("uid-" + name), ResourceVersion: "1"},
		Spec: corev1.PersistentVolumeClaimSpec{
			VolumeName: "pv-" + name,
			Resources:  corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(request)}},
		},
		Status: corev1.PersistentVolumeClaimStatus{
			Phase:    corev1.ClaimBound,
			Capacity: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(capacity)},
		},
	}
	for _, o := range opts {
		o(pvc)
	}
	return pvc
}

// Allocated sets the claim's allocatedResources to size and, unless s is
// "", its allocatedResourceStatuses to s.
func Allocated(size string, s corev1.ClaimResourceStatus) func(*corev1.PersistentVolumeClaim) {
	return func(pvc *corev1.PersistentVolumeClaim) {
		pvc.Status.AllocatedResources = corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)}
		if s != "" {
			pvc.Status.AllocatedResourceStatuses = map[corev1.ResourceName]corev1.ClaimResourceStatus{corev1.ResourceStorage: s}
		}
	}
}

// Condition adds the True condition typ with msg, in place since Earlier.
func Condition(typ corev1.PersistentVolumeClaimConditionType, msg string) func(*corev1.PersistentVolumeClaim) {
	return func(pvc *corev1.PersistentVolumeClaim) {
		pvc.Status.Conditions = append(pvc.Status.Conditions, corev1.PersistentVolumeClaimCondition{
			Type: typ, Status: corev1.ConditionTrue, LastTransitionTime: Earlier, Message: msg,
		})
	}
}

// Pending makes the claim unbound.
func Pending(pvc *corev1.PersistentVolumeClaim) { pvc.Status.Phase = corev1.ClaimPending }

// Volume is pv-<name>, the ReadWriteOnce ext4 volume of Driver (handle
// vol-<name>) bound to claim name, with size.
func Volume(name, size string, opts ...func(*corev1.PersistentVolume)) *corev1.PersistentVolume {
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "pv-" + name, ResourceVersion: "1"},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:    corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)},
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			ClaimRef:    &corev1.ObjectReference{Namespace: Namespace, Name: name, UID: types.UID("uid-" + name)},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: Driver, VolumeHandle: "vol-" + name, FSType: "ext4",
			}},
		},
	}
	for _, o := range opts {
		o(pv)
	}
	return pv
}

// OfDriver makes the volume driver d's.
func OfDriver(d string) func(*corev1.PersistentVolume) {
	return func(pv *corev1.PersistentVolume) { pv.Spec.CSI.Driver = d }
}

// WithAnnotation gives the volume the one annotation k=v.
func WithAnnotation(k, v string) func(*corev1.PersistentVolume) {
	return func(pv *corev1.PersistentVolume) { pv.Annotations = map[string]string{k: v} }
}

// ExpandSecret sets the volume's controllerExpandSecretRef.
func ExpandSecret(ns, name string) func(*corev1.PersistentVolume) {
	return func(pv *corev1.PersistentVolume) {
		pv.Spec.CSI.ControllerExpandSecretRef = &corev1.SecretReference{Namespace: ns, Name: name}
	}
}

// ClaimStatusPatch is the merge patch of claim name's status subresource,
// as Fixture.Actions lists it.
func ClaimStatusPatch(name, patch string) kubetest.Action {
	return kubetest.Action{Verb: "patch", Resource: "persistentvolumeclaims", Subresource: "status", Namespace: Namespace, Name: name,
		PatchType: types.MergePatchType, Patch: norm(patch)}
}

// VolumePatch is the merge patch of volume name, as Fixture.Actions lists
// it.
func VolumePatch(name, patch string) kubetest.Action {
	return kubetest.Action{Verb: "patch", Resource: "persistentvolumes", Name: name, PatchType: types.MergePatchType, Patch: norm(patch)}
}

// Get is a read of the object name of resource, as Fixture.Actions lists
// it.
func Get(resource, namespace, name string) kubetest.Action {
	return kubetest.Action{Verb: "get", Resource: resource, Namespace: namespace, Name: name}
}

func norm(patch string) string { return kubetest.Recorder{MaskResourceVersions: true}.Norm(patch) }
