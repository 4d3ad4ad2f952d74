package kube

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"
)

func fullPV() *corev1.PersistentVolume {
	mode := corev1.PersistentVolumeFilesystem
	return &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{
			Name: "pv", UID: "uid", ResourceVersion: "7", Finalizers: []string{"f"},
			Labels:          map[string]string{"l": "v"},
			Annotations:     map[string]string{"a": "v", lastAppliedAnnotation: "{...}"},
			ManagedFields:   []metav1.ManagedFieldsEntry{{Manager: "kubectl"}},
			OwnerReferences: []metav1.OwnerReference{{Name: "o"}},
		},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			VolumeMode:                    &mode,
			MountOptions:                  []string{"noatime"},
			StorageClassName:              "loopvol",
			ClaimRef:                      &corev1.ObjectReference{Namespace: "ns", Name: "claim"},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
			NodeAffinity:                  &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{}},
			PersistentVolumeSource:        corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: "d", VolumeHandle: "h"}},
			VolumeAttributesClassName:     ptr.To("fast"),
		},
		Status: corev1.PersistentVolumeStatus{Phase: corev1.VolumeBound, Message: "m"},
	}
}

// TestStripPV: each consumer's fields survive the cache transform, and what
// no consumer reads goes (always: managedFields, kubectl's copy, labels,
// owners, the reclaim policy, the status message).
func TestStripPV(t *testing.T) {
	full := fullPV()
	base := func() *corev1.PersistentVolume {
		return &corev1.PersistentVolume{
			ObjectMeta: metav1.ObjectMeta{Name: "pv", UID: "uid", ResourceVersion: "7", Finalizers: []string{"f"}},
			Spec:       corev1.PersistentVolumeSpec{PersistentVolumeSource: full.Spec.PersistentVolumeSource},
		}
	}
	attach := base()
	attach.Spec.AccessModes, attach.Spec.VolumeMode, attach.Spec.MountOptions = full.Spec.AccessModes, full.Spec.VolumeMode, full.Spec.MountOptions
	capacity := base()
	capacity.Spec.Capacity, capacity.Spec.StorageClassName, capacity.Spec.NodeAffinity = full.Spec.Capacity, full.Spec.StorageClassName, full.Spec.NodeAffinity
	both := base()
	both.Spec.AccessModes, both.Spec.VolumeMode, both.Spec.MountOptions = full.Spec.AccessModes, full.Spec.VolumeMode, full.Spec.MountOptions
	both.Spec.Capacity, both.Spec.StorageClassName, both.Spec.NodeAffinity = full.Spec.Capacity, full.Spec.StorageClassName, full.Spec.NodeAffinity
	resize := base()
	resize.Annotations = map[string]string{"a": "v"}
	resize.Spec = both.Spec
	resize.Spec.ClaimRef = full.Spec.ClaimRef
	resize.Spec.VolumeAttributesClassName = full.Spec.VolumeAttributesClassName
	resize.Status.Phase = corev1.VolumeBound

	for _, tc := range []struct {
		name   string
		fields PVFields
		want   *corev1.PersistentVolume
	}{
		{name: "attach", fields: PVAttach, want: attach},
		{name: "capacity", fields: PVCapacity, want: capacity},
		{name: "attach and capacity: the union", fields: PVAttach | PVCapacity, want: both},
		{name: "resize", fields: PVResize, want: resize},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := StripPV(fullPV(), tc.fields)
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("cached PV (-want +got):\n%s", d)
			}
		})
	}
}

// TestInformersShared: every consumer of a resource gets the same informer,
// the PV cache keeps the union of what was asked for, and asking for more
// after Start is a wiring bug that panics rather than serve objects that
// lack the fields.
func TestInformersShared(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	client := fake.NewClientset(fullPV())
	f := NewInformers(client, 0)
	if f.VolumeAttachments() != f.VolumeAttachments() || f.CSINodes() != f.CSINodes() {
		t.Error("two informers over one resource")
	}
	a, c := f.PersistentVolumes(PVAttach), f.PersistentVolumes(PVCapacity)
	if a != c {
		t.Error("two PersistentVolume informers")
	}
	if f.CSIStorageCapacities("ns", labels.Everything()) == f.CSIStorageCapacities("other", labels.Everything()) {
		t.Error("the CSIStorageCapacity informers of two namespaces are one")
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	f.Start(ctx)
	if !f.WaitForCacheSync(ctx) {
		t.Fatal("caches never synced")
	}
	obj, ok, err := a.GetIndexer().GetByKey("pv")
	if err != nil || !ok {
		t.Fatalf("PV not cached: %v", err)
	}
	pv := obj.(*corev1.PersistentVolume)
	if pv.Spec.MountOptions == nil || pv.Spec.NodeAffinity == nil || pv.Spec.ClaimRef != nil || pv.ManagedFields != nil {
		t.Errorf("cached PV spec = %+v, want the attach and capacity fields only", pv.Spec)
	}
	f.PersistentVolumes(PVAttach) // asked for before: fine
	defer func() {
		if recover() == nil {
			t.Error("asking for the resize fields after Start did not panic")
		}
	}()
	f.PersistentVolumes(PVResize)
}
