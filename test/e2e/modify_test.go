package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

// methodModify is the CSI method of the modify controller's calls.
const methodModify = "/csi.v1.Controller/ControllerModifyVolume"

// TestModify: the resizer's VolumeAttributesClass modify controller
// against the real API server and the real driver, under a user holding
// only rbac-resizer.yaml. A thin volume's claim switched to a thick class →
// the image fully allocated (st_blocks), the claim's current class and the
// volume's class follow; back to thin while the volume is attached → the
// driver's FAILED_PRECONDITION, still InProgress with ModifyVolumeError;
// detached → retried and thin again (blocks freed); a class the admission
// policy allows but the driver refuses (a pool it does not have) →
// Infeasible with the driver's INVALID_ARGUMENT message and an Event,
// called once; back to thick → recovered; a class that does not exist →
// Pending, and applied as soon as it is created; last a class naming the
// zone's other pool → the volume moved there (tiering), its ID kept.
func TestModify(t *testing.T) {
	// A second pool in the rig driver's zone, for the move.
	fastPool := filepath.Join(t.TempDir(), "fast")
	if err := os.MkdirAll(fastPool, 0o750); err != nil {
		t.Fatal(err)
	}
	r := newRig(t, "--pool=e2e-fast="+fastPool)
	// --retry-interval-start=200ms: the FAILED_PRECONDITION retry (final:
	// at least 32 intervals) comes 6.4 s later, not 32 s. An infeasible
	// class waits --retry-interval-max (5m): longer than the test, so it is
	// tried exactly once. --extra-modify-metadata: every
	// ControllerModifyVolume carries the claim's and the volume's names
	// too, which the driver takes and ignores.
	s := r.startSidecar("resizer", r.restrictedKubeconfig("loopvol-modifier-"+r.id, metav1.NamespaceDefault, "rbac-resizer.yaml"),
		"--controllers=resizer", "--retry-interval-start=200ms", "--extra-modify-metadata")
	thinVAC := r.createClass("thin", map[string]string{"preallocate": "false"})
	thickVAC := r.createClass("thick", map[string]string{"preallocate": "true"})
	// A valid pool name, so loopvol-volumeattributesclass-parameters lets
	// it in (it refuses unknown keys at the API already), but not a pool of
	// this driver: its ControllerModifyVolume answers INVALID_ARGUMENT.
	badVAC := r.createClass("bad", map[string]string{"pool": "e2e-elsewhere"})

	v := r.createThinVolume("md", thinVAC)
	claimName := r.createBoundClaim(v)
	// As the provisioner and kube-controller-manager leave a claim made
	// with a class: spec and status name it.
	if _, err := r.client.CoreV1().PersistentVolumeClaims(metav1.NamespaceDefault).Patch(r.ctx, claimName, types.MergePatchType,
		fmt.Appendf(nil, `{"spec":{"volumeAttributesClassName":%q}}`, thinVAC), metav1.PatchOptions{}); err != nil {
		t.Fatalf("give the claim class %s: %v", thinVAC, err)
	}
	r.patchClaimStatus(claimName, fmt.Sprintf(`{"status":{"currentVolumeAttributesClassName":%q}}`, thinVAC))
	if got := r.allocatedBytes(v); got >= volumeSize/2 {
		t.Fatalf("the thin volume's image has %d bytes allocated, want far less than %d", got, volumeSize)
	}

	// Attached to node-a, as a Pod using it would have it: thickening
	// works while attached.
	r.publish(v)
	r.setClaimClass(claimName, thickVAC)
	r.waitClaim("modified to thick", claimName, v, modifiedTo(thickVAC))
	if got := r.allocatedBytes(v); got < volumeSize {
		t.Errorf("after the thick class the image has %d bytes allocated, want at least %d", got, volumeSize)
	}
	r.waitEvents(claimName, "VolumeModify", "VolumeModifySuccessful")

	// Thinning needs the volume detached: FAILED_PRECONDITION, retried.
	r.setClaimClass(claimName, thinVAC)
	r.waitClaim("thinning refused while attached", claimName, v, func(pvc *corev1.PersistentVolumeClaim, pv *corev1.PersistentVolume) string {
		return all(
			modifyStatusIs(pvc, thinVAC, corev1.PersistentVolumeClaimModifyVolumeInProgress),
			currentClassIs(pvc, pv, thickVAC),
			modifyErrorIs(pvc, "FailedPrecondition", "attached"),
		)
	})
	r.unpublish(v)
	r.waitClaim("thinned once detached", claimName, v, modifiedTo(thinVAC))
	if got := r.allocatedBytes(v); got >= volumeSize/2 {
		t.Errorf("after the thin class the image has %d bytes allocated, want far less than %d", got, volumeSize)
	}

	// A class the driver refuses: Infeasible, the driver's message.
	r.setClaimClass(claimName, badVAC)
	var errMsg string
	r.waitClaim("infeasible", claimName, v, func(pvc *corev1.PersistentVolumeClaim, pv *corev1.PersistentVolume) string {
		errMsg = conditionMessage(pvc, corev1.PersistentVolumeClaimVolumeModifyVolumeError)
		return all(
			modifyStatusIs(pvc, badVAC, corev1.PersistentVolumeClaimModifyVolumeInfeasible),
			currentClassIs(pvc, pv, thinVAC),
			modifyErrorIs(pvc, "InvalidArgument", `no pool "e2e-elsewhere"`),
		)
	})
	t.Logf("ModifyVolumeError: %s", errMsg)
	r.waitEvents(claimName, "VolumeModifyFailed")
	if got := r.allocatedBytes(v); got >= volumeSize/2 {
		t.Errorf("the refused class changed the image: %d bytes allocated", got)
	}

	// Back to a class the driver takes: recovered at once, no slow retry.
	r.setClaimClass(claimName, thickVAC)
	r.waitClaim("recovered: thick again", claimName, v, modifiedTo(thickVAC))
	if got := r.allocatedBytes(v); got < volumeSize {
		t.Errorf("after recovering to thick the image has %d bytes allocated, want at least %d", got, volumeSize)
	}

	// A class that does not exist yet: Pending, applied once it exists.
	laterVAC := "e2e-" + r.id + "-later"
	r.setClaimClass(claimName, laterVAC)
	r.waitClaim("pending", claimName, v, func(pvc *corev1.PersistentVolumeClaim, pv *corev1.PersistentVolume) string {
		return all(
			modifyStatusIs(pvc, laterVAC, corev1.PersistentVolumeClaimModifyVolumePending),
			currentClassIs(pvc, pv, thickVAC),
		)
	})
	r.createClass("later", map[string]string{"preallocate": "false"})
	r.waitClaim("the pending class applied once created", claimName, v, modifiedTo(laterVAC))

	// Tiering: a class naming the other pool of the zone moves the
	// (detached) volume there; its ID, and so its PersistentVolume, stay.
	fastVAC := r.createClass("fast", map[string]string{"pool": "e2e-fast", "preallocate": "false"})
	r.setClaimClass(claimName, fastVAC)
	r.waitClaim("moved to the fast pool", claimName, v, modifiedTo(fastVAC))
	_, hash, _ := strings.Cut(v.handle, ".")
	if _, err := os.Stat(filepath.Join(fastPool, "volumes", hash+".img")); err != nil {
		t.Errorf("the image is not in the fast pool after the move: %v", err)
	}
	if _, err := os.Stat(filepath.Join(r.pool, "volumes", hash+".img")); !os.IsNotExist(err) {
		t.Errorf("the image is still in the home pool after the move (%v)", err)
	}
	got, err := r.ctrl.ControllerGetVolume(r.ctx, &csi.ControllerGetVolumeRequest{VolumeId: v.handle})
	if err != nil || got.GetVolume().GetCapacityBytes() != volumeSize {
		t.Errorf("ControllerGetVolume of the moved volume by its ID: %v, %v", got, err)
	}

	m := r.scrape(s.metrics)
	expectCount(t, "modifications applied", m.value("loopvol_resizer_modifies_total", nil), 5)
	expectCount(t, "INVALID_ARGUMENT modify errors", m.value("loopvol_resizer_modify_errors_total", map[string]string{"grpc_status_code": "InvalidArgument"}), 1)
	expectCount(t, "ControllerModifyVolume INVALID_ARGUMENT calls of the sidecar (no retry within --retry-interval-max)", m.sidecarCalls(methodModify, "InvalidArgument"), 1)
	expectCount(t, "ControllerModifyVolume OK calls of the sidecar", m.sidecarCalls(methodModify, "OK"), 5)
	if n := m.sidecarCalls(methodModify, "FailedPrecondition"); n < 1 {
		t.Errorf("ControllerModifyVolume FAILED_PRECONDITION calls: %g, want at least 1", n)
	}
}

// createClass makes the VolumeAttributesClass e2e-<id>-<suffix> of the
// driver and returns its name.
func (r *rig) createClass(suffix string, params map[string]string) string {
	r.t.Helper()
	name := "e2e-" + r.id + "-" + suffix
	_, err := r.client.StorageV1().VolumeAttributesClasses().Create(r.ctx, &storagev1.VolumeAttributesClass{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: r.labels()},
		DriverName: driverName,
		Parameters: params,
	}, metav1.CreateOptions{})
	if err != nil {
		r.t.Fatalf("create VolumeAttributesClass %s: %v", name, err)
	}
	r.t.Cleanup(func() {
		ignoreNotFound(r.t, r.client.StorageV1().VolumeAttributesClasses().Delete(context.WithoutCancel(r.ctx), name, metav1.DeleteOptions{}))
	})
	return name
}

// createThinVolume makes a thin volume on the driver (CreateVolume with
// mutable parameter preallocate "false", as the provisioner passes a
// claim's class) and its PersistentVolume naming vac.
func (r *rig) createThinVolume(prefix, vac string) volume {
	r.t.Helper()
	name := r.id + "-" + prefix
	rsp, err := r.ctrl.CreateVolume(r.ctx, &csi.CreateVolumeRequest{
		Name:               name,
		CapacityRange:      &csi.CapacityRange{RequiredBytes: volumeSize},
		VolumeCapabilities: []*csi.VolumeCapability{mountCapability()},
		Parameters:         map[string]string{"pool": "e2e"}, // the rig's first pool, not the other one of the zone
		MutableParameters:  map[string]string{"preallocate": "false"},
	})
	if err != nil {
		r.t.Fatalf("CreateVolume %s: %v", name, err)
	}
	v := volume{handle: rsp.GetVolume().GetVolumeId(), pv: "e2e-" + name}
	_, err = r.client.CoreV1().PersistentVolumes().Create(r.ctx, &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: v.pv, Labels: r.labels()},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: *resource.NewQuantity(volumeSize, resource.BinarySI)},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			VolumeMode:                    ptr.To(corev1.PersistentVolumeFilesystem),
			VolumeAttributesClassName:     ptr.To(vac),
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: driverName, VolumeHandle: v.handle, FSType: "ext4",
			}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		r.t.Fatalf("create PersistentVolume %s: %v", v.pv, err)
	}
	return v
}

// setClaimClass sets a claim's spec.volumeAttributesClassName, as a user
// would.
func (r *rig) setClaimClass(name, vac string) {
	r.t.Helper()
	patch := fmt.Appendf(nil, `{"spec":{"volumeAttributesClassName":%q}}`, vac)
	if _, err := r.client.CoreV1().PersistentVolumeClaims(metav1.NamespaceDefault).Patch(r.ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		r.t.Fatalf("set the VolumeAttributesClass of claim %s to %s: %v", name, vac, err)
	}
}

// publish and unpublish attach v to node-a and detach it, over the
// driver's socket, as the attacher would for a Pod.
func (r *rig) publish(v volume) {
	r.t.Helper()
	_, err := r.ctrl.ControllerPublishVolume(r.ctx, &csi.ControllerPublishVolumeRequest{VolumeId: v.handle, NodeId: nodeA, VolumeCapability: mountCapability()})
	if err != nil {
		r.t.Fatalf("ControllerPublishVolume %s: %v", v.handle, err)
	}
	r.t.Cleanup(func() {
		_, _ = r.ctrl.ControllerUnpublishVolume(context.WithoutCancel(r.ctx), &csi.ControllerUnpublishVolumeRequest{VolumeId: v.handle, NodeId: nodeA})
	})
}

func (r *rig) unpublish(v volume) {
	r.t.Helper()
	if _, err := r.ctrl.ControllerUnpublishVolume(r.ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: v.handle, NodeId: nodeA}); err != nil {
		r.t.Fatalf("ControllerUnpublishVolume %s: %v", v.handle, err)
	}
}

// allocatedBytes is what v's image file has allocated on the pool's
// filesystem (st_blocks × 512).
func (r *rig) allocatedBytes(v volume) int64 {
	r.t.Helper()
	_, hash, _ := strings.Cut(v.handle, ".")
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(r.pool, "volumes", hash+".img"), &st); err != nil {
		r.t.Fatalf("image of %s: %v", v.handle, err)
	}
	return st.Blocks * 512
}

// The checks of waitClaim for the modify controller.

// modifiedTo: the claim and its volume have class vac, and the claim no
// modification status and no modify conditions.
func modifiedTo(vac string) func(*corev1.PersistentVolumeClaim, *corev1.PersistentVolume) string {
	return func(pvc *corev1.PersistentVolumeClaim, pv *corev1.PersistentVolume) string {
		return all(
			currentClassIs(pvc, pv, vac),
			check(pvc.Status.ModifyVolumeStatus == nil, "modifyVolumeStatus %+v, want none", pvc.Status.ModifyVolumeStatus),
			check(conditionMessage(pvc, corev1.PersistentVolumeClaimVolumeModifyingVolume) == "" &&
				conditionMessage(pvc, corev1.PersistentVolumeClaimVolumeModifyVolumeError) == "", "modify conditions %+v, want none", pvc.Status.Conditions),
		)
	}
}

func currentClassIs(pvc *corev1.PersistentVolumeClaim, pv *corev1.PersistentVolume, vac string) string {
	return all(
		check(ptr.Deref(pvc.Status.CurrentVolumeAttributesClassName, "") == vac, "currentVolumeAttributesClassName %q, want %q", ptr.Deref(pvc.Status.CurrentVolumeAttributesClassName, ""), vac),
		check(ptr.Deref(pv.Spec.VolumeAttributesClassName, "") == vac, "PV volumeAttributesClassName %q, want %q", ptr.Deref(pv.Spec.VolumeAttributesClassName, ""), vac),
	)
}

func modifyStatusIs(pvc *corev1.PersistentVolumeClaim, target string, want corev1.PersistentVolumeClaimModifyVolumeStatus) string {
	s := pvc.Status.ModifyVolumeStatus
	return check(s != nil && s.TargetVolumeAttributesClassName == target && s.Status == want, "modifyVolumeStatus %+v, want %s to %s", s, want, target)
}

// modifyErrorIs: the ModifyVolumeError condition has reason (the gRPC
// code) and a message containing msg.
func modifyErrorIs(pvc *corev1.PersistentVolumeClaim, reason, msg string) string {
	for _, c := range pvc.Status.Conditions {
		if c.Type == corev1.PersistentVolumeClaimVolumeModifyVolumeError && c.Status == corev1.ConditionTrue {
			return check(c.Reason == reason && strings.Contains(c.Message, msg), "ModifyVolumeError %s: %q, want %s with %q", c.Reason, c.Message, reason, msg)
		}
	}
	return fmt.Sprintf("no ModifyVolumeError condition, want %s with %q", reason, msg)
}
