package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
)

// The resizer's contract with Kubernetes and the upstream external-resizer,
// spelled out here rather than imported from pkg/resize.
const (
	preResizeAnnotation = "volume.alpha.kubernetes.io/pre-resize-capacity"
	methodExpand        = "/csi.v1.Controller/ControllerExpandVolume"
	mi                  = int64(1) << 20
)

// TestResize: a bound claim of the driver, its request raised → the
// driver's image grows, the PersistentVolume and the claim report the new
// size and hand the claim to the node (loopvol needs node expansion);
// kubelet's part played by the test; a request beyond what the driver can
// make → ControllerResizeError with the driver's OUT_OF_RANGE message and
// ControllerResizeInfeasible; the request lowered again → expanded to the
// lowered size, error gone. Then a resizer that died mid-expansion is
// replaced: the new one finishes the expansion in flight before the newer
// request. The sidecar runs with only rbac-resizer.yaml's rules.
func TestResize(t *testing.T) {
	r := newRig(t)
	// A final error waits 32 × --retry-interval-start before its retry
	// (at most --retry-interval-max, 5m): with 10s, far longer than the
	// test, so exactly one call fails OUT_OF_RANGE unless something queues
	// the claim again behind the backoff.
	s := r.startSidecar("resizer", r.restrictedKubeconfig("loopvol-resizer-"+r.id, metav1.NamespaceDefault, "rbac-resizer.yaml"),
		"--controllers=resizer", "--retry-interval-start=10s")
	v := r.createVolumes("rs", 1)[0]
	claimName := r.createBoundClaim(v)

	// Raise 16 → 32 MiB.
	r.setClaimRequest(claimName, "32Mi")
	r.waitClaim("expanded to 32Mi, handed to the node", claimName, v, func(pvc *corev1.PersistentVolumeClaim, pv *corev1.PersistentVolume) string {
		return all(
			quantityIs("PV capacity", pv.Spec.Capacity, "32Mi"),
			quantityIs("allocatedResources", pvc.Status.AllocatedResources, "32Mi"),
			quantityIs("claim capacity (until the node grows the filesystem)", pvc.Status.Capacity, "16Mi"),
			resizeStatusIs(pvc, corev1.PersistentVolumeClaimNodeResizePending),
			conditionsAre(pvc, corev1.PersistentVolumeClaimFileSystemResizePending),
			annotationIs(pv, preResizeAnnotation, "16Mi"),
		)
	})
	r.checkVolumeSize(v, 32*mi)

	// Kubelet's part: the filesystem has grown. The resizer drops the
	// pre-resize annotation.
	r.nodeExpanded(claimName, "32Mi")
	r.waitClaim("pre-resize annotation removed after the node caught up", claimName, v, func(pvc *corev1.PersistentVolumeClaim, pv *corev1.PersistentVolume) string {
		return annotationIs(pv, preResizeAnnotation, "")
	})

	// Far beyond the pool (2 PiB): the driver answers OUT_OF_RANGE.
	r.setClaimRequest(claimName, "2Pi")
	var errMsg string
	r.waitClaim("ControllerResizeError, infeasible", claimName, v, func(pvc *corev1.PersistentVolumeClaim, pv *corev1.PersistentVolume) string {
		errMsg = conditionMessage(pvc, corev1.PersistentVolumeClaimControllerResizeError)
		return all(
			resizeStatusIs(pvc, corev1.PersistentVolumeClaimControllerResizeInfeasible),
			quantityIs("allocatedResources", pvc.Status.AllocatedResources, "2Pi"),
			quantityIs("PV capacity", pv.Spec.Capacity, "32Mi"),
			check(strings.Contains(errMsg, "code = OutOfRange") && strings.Contains(errMsg, "larger than the largest volume"),
				"ControllerResizeError message %q lacks the driver's OUT_OF_RANGE answer", errMsg),
		)
	})
	t.Logf("ControllerResizeError: %s", errMsg)
	r.checkVolumeSize(v, 32*mi)

	// Lowered again, still above the capacity: recovered at 64 MiB.
	r.setClaimRequest(claimName, "64Mi")
	r.waitClaim("recovered: expanded to the lowered 64Mi, error gone", claimName, v, func(pvc *corev1.PersistentVolumeClaim, pv *corev1.PersistentVolume) string {
		return all(
			quantityIs("PV capacity", pv.Spec.Capacity, "64Mi"),
			quantityIs("allocatedResources", pvc.Status.AllocatedResources, "64Mi"),
			resizeStatusIs(pvc, corev1.PersistentVolumeClaimNodeResizePending),
			conditionsAre(pvc, corev1.PersistentVolumeClaimFileSystemResizePending),
		)
	})
	r.checkVolumeSize(v, 64*mi)
	r.waitEvents(claimName, "Resizing", "FileSystemResizeRequired", "VolumeResizeFailed")

	m := r.scrape(s.metrics)
	expectCount(t, "resizer expansions", m.value("loopvol_resizer_resizes_total", nil), 2)
	expectCount(t, "resizer OUT_OF_RANGE errors", m.value("loopvol_resizer_resize_errors_total", map[string]string{"grpc_status_code": "OutOfRange"}), 1)
	expectCount(t, "ControllerExpandVolume OK calls of the sidecar", m.sidecarCalls(methodExpand, "OK"), 2)
	expectCount(t, "ControllerExpandVolume OUT_OF_RANGE calls of the sidecar (no retry behind the backoff)", m.sidecarCalls(methodExpand, "OutOfRange"), 1)
	expectCount(t, "ControllerExpandVolume calls the driver answered", r.scrape(r.driverMetrics).driverCalls(methodExpand, ""), 3)

	// A resizer dies while expanding to 80 MiB; the user raises the request
	// to 96 MiB meanwhile. Its successor finishes the 80 MiB first (the
	// driver may still have been at it), and the 96 MiB after the node.
	r.nodeExpanded(claimName, "64Mi")
	if err := s.Stop(); err != nil {
		t.Fatalf("stop the resizer: %v", err)
	}
	r.setClaimRequest(claimName, "96Mi")
	r.patchClaimStatus(claimName, `{"status":{"allocatedResources":{"storage":"80Mi"},"allocatedResourceStatuses":{"storage":"ControllerResizeInProgress"},`+
		`"conditions":[{"type":"Resizing","status":"True","lastTransitionTime":"2026-01-01T00:00:00Z"}]}}`)
	r.startSidecar("resizer-2", r.restrictedKubeconfig("loopvol-resizer2-"+r.id, metav1.NamespaceDefault, "rbac-resizer.yaml"), "--controllers=resizer")
	r.waitClaim("the expansion in flight finished at 80Mi", claimName, v, func(pvc *corev1.PersistentVolumeClaim, pv *corev1.PersistentVolume) string {
		return all(
			quantityIs("PV capacity", pv.Spec.Capacity, "80Mi"),
			resizeStatusIs(pvc, corev1.PersistentVolumeClaimNodeResizePending),
		)
	})
	r.checkVolumeSize(v, 80*mi)
	r.nodeExpanded(claimName, "80Mi")
	r.waitClaim("then the newer request, 96Mi", claimName, v, func(pvc *corev1.PersistentVolumeClaim, pv *corev1.PersistentVolume) string {
		return all(
			quantityIs("PV capacity", pv.Spec.Capacity, "96Mi"),
			quantityIs("allocatedResources", pvc.Status.AllocatedResources, "96Mi"),
			resizeStatusIs(pvc, corev1.PersistentVolumeClaimNodeResizePending),
		)
	})
	r.checkVolumeSize(v, 96*mi)
}

// createBoundClaim makes a StorageClass that allows expansion (kube-apiserver
// refuses a larger request otherwise) and a claim of it in "default" bound
// to v's PersistentVolume, both sides of the binding written as
// kube-controller-manager's PV controller would: claimRef on the volume,
// phase Bound and capacity in the claim's status. It returns the claim's
// name.
func (r *rig) createBoundClaim(v volume) string {
	r.t.Helper()
	name := "e2e-" + r.id + "-" + strings.TrimPrefix(v.pv, "e2e-"+r.id+"-")
	sc, err := r.client.StorageV1().StorageClasses().Create(r.ctx, &storagev1.StorageClass{
		ObjectMeta:           metav1.ObjectMeta{Name: name, Labels: r.labels()},
		Provisioner:          driverName,
		AllowVolumeExpansion: ptr.To(true),
	}, metav1.CreateOptions{})
	if err != nil {
		r.t.Fatalf("create StorageClass: %v", err)
	}
	r.t.Cleanup(func() {
		ignoreNotFound(r.t, r.client.StorageV1().StorageClasses().Delete(context.WithoutCancel(r.ctx), sc.Name, metav1.DeleteOptions{}))
	})
	claims := r.client.CoreV1().PersistentVolumeClaims(metav1.NamespaceDefault)
	pvc, err := claims.Create(r.ctx, &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: r.labels()},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: ptr.To(sc.Name),
			VolumeName:       v.pv,
			VolumeMode:       ptr.To(corev1.PersistentVolumeFilesystem),
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{
				corev1.ResourceStorage: *resource.NewQuantity(volumeSize, resource.BinarySI),
			}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		r.t.Fatalf("create PersistentVolumeClaim: %v", err)
	}
	r.t.Cleanup(func() {
		ctx := context.WithoutCancel(r.ctx)
		_, err := claims.Patch(ctx, name, types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
		ignoreNotFound(r.t, err)
		ignoreNotFound(r.t, claims.Delete(ctx, name, metav1.DeleteOptions{}))
	})
	ref := fmt.Sprintf(`{"spec":{"storageClassName":%q,"claimRef":{"kind":"PersistentVolumeClaim","apiVersion":"v1","namespace":%q,"name":%q,"uid":%q}}}`,
		sc.Name, metav1.NamespaceDefault, name, pvc.UID)
	if _, err := r.client.CoreV1().PersistentVolumes().Patch(r.ctx, v.pv, types.MergePatchType, []byte(ref), metav1.PatchOptions{}); err != nil {
		r.t.Fatalf("bind PersistentVolume %s: %v", v.pv, err)
	}
	if _, err := r.client.CoreV1().PersistentVolumes().Patch(r.ctx, v.pv, types.MergePatchType, []byte(`{"status":{"phase":"Bound"}}`), metav1.PatchOptions{}, "status"); err != nil {
		r.t.Fatalf("mark PersistentVolume %s bound: %v", v.pv, err)
	}
	r.patchClaimStatus(name, fmt.Sprintf(`{"status":{"phase":"Bound","accessModes":["ReadWriteOnce"],"capacity":{"storage":%q}}}`,
		resource.NewQuantity(volumeSize, resource.BinarySI).String()))
	return name
}

// setClaimRequest sets a claim's storage request, as a user would. The
// API server's admission reads StorageClasses from a cache that may not
// know a new one yet: a refusal for that reason is retried.
func (r *rig) setClaimRequest(name, size string) {
	r.t.Helper()
	patch := []byte(fmt.Sprintf(`{"spec":{"resources":{"requests":{"storage":%q}}}}`, size))
	var last error
	err := wait.PollUntilContextTimeout(r.ctx, 200*time.Millisecond, shortWait, true, func(ctx context.Context) (bool, error) {
		_, last = r.client.CoreV1().PersistentVolumeClaims(metav1.NamespaceDefault).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
		return last == nil || !apierrors.IsForbidden(last), nil
	})
	if err != nil || last != nil {
		r.t.Fatalf("set the request of PersistentVolumeClaim %s to %s: %v (%v)", name, size, last, err)
	}
}

// patchClaimStatus writes a merge patch to a claim's status.
func (r *rig) patchClaimStatus(name, patch string) {
	r.t.Helper()
	if _, err := r.client.CoreV1().PersistentVolumeClaims(metav1.NamespaceDefault).Patch(r.ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}, "status"); err != nil {
		r.t.Fatalf("patch the status of PersistentVolumeClaim %s with %s: %v", name, patch, err)
	}
}

// nodeExpanded plays kubelet after it grew the filesystem to size: the
// claim's capacity is the new size, its resize status and conditions are
// gone (allocatedResources stays).
func (r *rig) nodeExpanded(name, size string) {
	r.t.Helper()
	r.patchClaimStatus(name, fmt.Sprintf(`{"status":{"capacity":{"storage":%q},"allocatedResourceStatuses":null,"conditions":null}}`, size))
}

// waitClaim waits until check finds nothing wrong with the claim and v's
// PersistentVolume ("" means all is well).
func (r *rig) waitClaim(what, name string, v volume, check func(*corev1.PersistentVolumeClaim, *corev1.PersistentVolume) string) {
	r.t.Helper()
	problem := "not read yet"
	var pvc *corev1.PersistentVolumeClaim
	err := wait.PollUntilContextTimeout(r.ctx, 200*time.Millisecond, shortWait, true, func(ctx context.Context) (bool, error) {
		var err error
		pvc, err = r.client.CoreV1().PersistentVolumeClaims(metav1.NamespaceDefault).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			problem = err.Error()
			return false, nil
		}
		pv, err := r.client.CoreV1().PersistentVolumes().Get(ctx, v.pv, metav1.GetOptions{})
		if err != nil {
			problem = err.Error()
			return false, nil
		}
		problem = check(pvc, pv)
		return problem == "", nil
	})
	if err != nil {
		r.t.Fatalf("%s: not after %s: %s\nclaim status: %+v", what, shortWait, problem, pvc.Status)
	}
}

// checkVolumeSize checks the driver's side: the image file's size on disk
// and the capacity ControllerGetVolume and ListVolumes report.
func (r *rig) checkVolumeSize(v volume, want int64) {
	r.t.Helper()
	_, hash, _ := strings.Cut(v.handle, ".")
	fi, err := os.Stat(filepath.Join(r.pool, "volumes", hash+".img"))
	if err != nil {
		r.t.Fatalf("image of %s: %v", v.handle, err)
	}
	if fi.Size() != want {
		r.t.Errorf("image of %s is %d bytes, want %d", v.handle, fi.Size(), want)
	}
	ctx, cancel := context.WithTimeout(r.ctx, 30*time.Second)
	defer cancel()
	got, err := r.ctrl.ControllerGetVolume(ctx, &csi.ControllerGetVolumeRequest{VolumeId: v.handle})
	if err != nil {
		r.t.Fatalf("ControllerGetVolume %s: %v", v.handle, err)
	}
	if c := got.GetVolume().GetCapacityBytes(); c != want {
		r.t.Errorf("ControllerGetVolume says %s is %d bytes, want %d", v.handle, c, want)
	}
	list, err := r.ctrl.ListVolumes(ctx, &csi.ListVolumesRequest{})
	if err != nil {
		r.t.Fatalf("ListVolumes: %v", err)
	}
	i := slices.IndexFunc(list.GetEntries(), func(e *csi.ListVolumesResponse_Entry) bool { return e.GetVolume().GetVolumeId() == v.handle })
	if i < 0 {
		r.t.Fatalf("ListVolumes does not list %s", v.handle)
	}
	if c := list.GetEntries()[i].GetVolume().GetCapacityBytes(); c != want {
		r.t.Errorf("ListVolumes says %s is %d bytes, want %d", v.handle, c, want)
	}
}

// waitEvents waits until the claim has Events with every one of reasons.
func (r *rig) waitEvents(name string, reasons ...string) {
	r.t.Helper()
	var seen []string
	err := wait.PollUntilContextTimeout(r.ctx, 200*time.Millisecond, shortWait, true, func(ctx context.Context) (bool, error) {
		list, err := r.client.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
		if err != nil {
			return false, nil
		}
		seen = seen[:0]
		for _, e := range list.Items {
			seen = append(seen, e.Reason)
		}
		for _, want := range reasons {
			if !slices.Contains(seen, want) {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		r.t.Errorf("Events of claim %s: reasons %v, want all of %v", name, seen, reasons)
	}
}

// The checks of waitClaim: each returns "" when it holds, else what is
// wrong.

func all(problems ...string) string {
	var out []string
	for _, p := range problems {
		if p != "" {
			out = append(out, p)
		}
	}
	return strings.Join(out, "; ")
}

func check(ok bool, format string, args ...any) string {
	if ok {
		return ""
	}
	return fmt.Sprintf(format, args...)
}

func quantityIs(what string, l corev1.ResourceList, want string) string {
	got, ok := l[corev1.ResourceStorage]
	return check(ok && got.Cmp(resource.MustParse(want)) == 0, "%s is %s, want %s", what, got.String(), want)
}

func resizeStatusIs(pvc *corev1.PersistentVolumeClaim, want corev1.ClaimResourceStatus) string {
	got := pvc.Status.AllocatedResourceStatuses[corev1.ResourceStorage]
	return check(got == want, "resize status %q, want %q", got, want)
}

// conditionsAre checks the claim's True resize-related conditions.
func conditionsAre(pvc *corev1.PersistentVolumeClaim, want ...corev1.PersistentVolumeClaimConditionType) string {
	var got []corev1.PersistentVolumeClaimConditionType
	for _, c := range pvc.Status.Conditions {
		if c.Status == corev1.ConditionTrue {
			got = append(got, c.Type)
		}
	}
	return check(slices.Equal(got, want), "conditions %v, want %v", got, want)
}

func conditionMessage(pvc *corev1.PersistentVolumeClaim, typ corev1.PersistentVolumeClaimConditionType) string {
	for _, c := range pvc.Status.Conditions {
		if c.Type == typ && c.Status == corev1.ConditionTrue {
			return c.Message
		}
	}
	return ""
}

func annotationIs(pv *corev1.PersistentVolume, key, want string) string {
	got, ok := pv.Annotations[key]
	if want == "" {
		return check(!ok, "annotation %s=%q, want none", key, got)
	}
	return check(got == want, "annotation %s=%q, want %q", key, got, want)
}
