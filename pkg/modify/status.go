package modify

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/loopvol/loopvol/internal/kube"
	"github.com/loopvol/loopvol/pkg/csiclient"
)

// The steps of a modification, as changes of a claim, with upstream's
// status values, condition types and messages. Each is applied to a copy;
// patchClaim writes what changed.

// markModifyPending records that the claim waits for its class to exist.
// The conditions stay as they are. Unlike upstream, the target is the
// class waited for (upstream leaves the previous target, or none), so the
// status says what it waits for.
func markModifyPending(pvc *corev1.PersistentVolumeClaim, target string) {
	pvc.Status.ModifyVolumeStatus = &corev1.ModifyVolumeStatus{
		TargetVolumeAttributesClassName: target,
		Status:                          corev1.PersistentVolumeClaimModifyVolumePending,
	}
}

// markModifyStatus records a modification to target as outcome
// (InProgress or Infeasible) with the ModifyingVolume condition, and, when
// cause is set, the ModifyVolumeError condition with the driver's code and
// message. Other conditions stay.
func markModifyStatus(pvc *corev1.PersistentVolumeClaim, outcome corev1.PersistentVolumeClaimModifyVolumeStatus, target string, cause error, now time.Time) {
	pvc.Status.ModifyVolumeStatus = &corev1.ModifyVolumeStatus{TargetVolumeAttributesClassName: target, Status: outcome}
	modifying := corev1.PersistentVolumeClaimCondition{
		Type:    corev1.PersistentVolumeClaimVolumeModifyingVolume,
		Status:  corev1.ConditionTrue,
		Message: fmt.Sprintf("Modifying volume to %q is in progress.", target),
	}
	conds := []corev1.PersistentVolumeClaimCondition{modifying}
	if cause != nil {
		if csiclient.IsFinal(cause) {
			conds[0].Message = fmt.Sprintf("Modifying volume to %q failed. Waiting for retry.", target)
		} else {
			conds[0].Message = fmt.Sprintf("Modifying volume to %q is still in progress.", target)
		}
		code, msg := driverStatus(cause)
		conds = append(conds, corev1.PersistentVolumeClaimCondition{
			Type:    corev1.PersistentVolumeClaimVolumeModifyVolumeError,
			Status:  corev1.ConditionTrue,
			Reason:  code,
			Message: msg,
		})
	}
	mergeConditions(pvc, now, conds...)
}

// markModifyCompleted records that the claim has class target: the current
// class, no modification status, no modify conditions.
func markModifyCompleted(pvc *corev1.PersistentVolumeClaim, target string) {
	pvc.Status.ModifyVolumeStatus = nil
	pvc.Status.CurrentVolumeAttributesClassName = ptr.To(target)
	pvc.Status.Conditions = slices.DeleteFunc(slices.Clone(pvc.Status.Conditions), func(c corev1.PersistentVolumeClaimCondition) bool {
		return c.Type == corev1.PersistentVolumeClaimVolumeModifyingVolume || c.Type == corev1.PersistentVolumeClaimVolumeModifyVolumeError
	})
}

// markModifyRolledBack drops the ModifyingVolume condition of a
// modification the user took back.
func markModifyRolledBack(pvc *corev1.PersistentVolumeClaim) {
	pvc.Status.Conditions = slices.DeleteFunc(slices.Clone(pvc.Status.Conditions), func(c corev1.PersistentVolumeClaimCondition) bool {
		return c.Type == corev1.PersistentVolumeClaimVolumeModifyingVolume
	})
}

// mergeConditions replaces the claim's conditions of the types of want by
// want, each probed now; a condition whose status and reason are unchanged
// keeps its transition time. Other conditions stay, in their order.
func mergeConditions(pvc *corev1.PersistentVolumeClaim, now time.Time, want ...corev1.PersistentVolumeClaimCondition) {
	probe := metav1.NewTime(now)
	out := slices.Clone(pvc.Status.Conditions)
	for _, w := range want {
		w.LastProbeTime, w.LastTransitionTime = probe, probe
		i := slices.IndexFunc(out, func(c corev1.PersistentVolumeClaimCondition) bool { return c.Type == w.Type })
		if i < 0 {
			out = append(out, w)
			continue
		}
		if out[i].Status == w.Status && out[i].Reason == w.Reason {
			w.LastTransitionTime = out[i].LastTransitionTime
		}
		out[i] = w
	}
	pvc.Status.Conditions = out
}

// driverStatus is the gRPC code name and the driver's own message of err
// (the innermost status, without the wrapping of the call site), as
// upstream puts them into the ModifyVolumeError condition.
func driverStatus(err error) (string, string) {
	var gs interface{ GRPCStatus() *status.Status }
	if errors.As(err, &gs) {
		st := gs.GRPCStatus()
		return st.Code().String(), st.Message()
	}
	st, _ := status.FromError(err)
	return st.Code().String(), st.Message()
}

// claimPatch is the merge patch of the status subresource that turns
// old into new in the fields the modify controller writes:
// modifyVolumeStatus, currentVolumeAttributesClassName and the conditions
// (the whole list). It carries old's resourceVersion; nil when nothing
// changed.
func claimPatch(old, new *corev1.PersistentVolumeClaim) []byte {
	status := map[string]any{}
	if !equality.Semantic.DeepEqual(old.Status.ModifyVolumeStatus, new.Status.ModifyVolumeStatus) {
		var v any
		if s := new.Status.ModifyVolumeStatus; s != nil {
			v = map[string]any{"targetVolumeAttributesClassName": s.TargetVolumeAttributesClassName, "status": s.Status}
		}
		status["modifyVolumeStatus"] = v
	}
	if !equality.Semantic.DeepEqual(old.Status.CurrentVolumeAttributesClassName, new.Status.CurrentVolumeAttributesClassName) {
		var v any
		if n := new.Status.CurrentVolumeAttributesClassName; n != nil {
			v = *n
		}
		status["currentVolumeAttributesClassName"] = v
	}
	if !equality.Semantic.DeepEqual(old.Status.Conditions, new.Status.Conditions) {
		var v any
		if len(new.Status.Conditions) > 0 {
			v = new.Status.Conditions
		}
		status["conditions"] = v
	}
	if len(status) == 0 {
		return nil
	}
	return kube.MustJSON(map[string]any{"metadata": map[string]any{"resourceVersion": old.ResourceVersion}, "status": status})
}

// volumeClassPatch is the merge patch that gives pv the
// VolumeAttributesClass name; nil when it has it.
func volumeClassPatch(pv *corev1.PersistentVolume, name string) []byte {
	if ptr.Deref(pv.Spec.VolumeAttributesClassName, "") == name {
		return nil
	}
	return kube.MustJSON(map[string]any{"spec": map[string]any{"volumeAttributesClassName": name}})
}

// patchClaim writes a change of pvc's modification status
// (kube.ClaimQueue.PatchClaimStatus with claimPatch).
func (c *Controller) patchClaim(ctx context.Context, pvc *corev1.PersistentVolumeClaim, onLive bool, change func(*corev1.PersistentVolumeClaim)) (*corev1.PersistentVolumeClaim, error) {
	return c.claims.PatchClaimStatus(ctx, pvc, onLive, change, claimPatch)
}
