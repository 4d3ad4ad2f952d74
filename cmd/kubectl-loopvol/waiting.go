package main

import (
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
)

// spaceWords mark a provisioning or scheduling failure for lack of space:
// the gRPC code of the driver's refusal (pkg/controller choosePool: "no
// pool has N bytes available", "no pool can take N bytes"), the pool's own
// error, and the scheduler's message when no CSIStorageCapacity is big
// enough.
var spaceWords = []string{
	"resourceexhausted", "not enough space", "insufficient capacity",
	"no pool has", "no pool can take", "did not have enough free storage",
}

// How the Waiting: lines that doctor's claims check sorts begin.
const (
	waitingForSpace = "for space: "
	waitingForAPod  = "for a Pod to use it: "
)

// aboutSpace says whether an Event message says there is no room.
func aboutSpace(msg string) bool {
	m := strings.ToLower(msg)
	for _, w := range spaceWords {
		if strings.Contains(m, w) {
			return true
		}
	}
	return false
}

// waitingFor says what the claim waits for, "" when nothing does. The
// first thing on the way that is not done is named: provisioning (with why
// it failed), binding, attaching, staging, mounting.
func waitingFor(o *pathObjects, now time.Time) string {
	if o.pvc != nil && o.pvc.Status.Phase == corev1.ClaimPending && o.pv == nil {
		return waitingForVolume(o, now)
	}
	if o.pv == nil {
		return ""
	}
	for _, p := range o.pods {
		if p.Spec.NodeName == "" || p.Status.Phase != corev1.PodPending {
			continue
		}
		node := p.Spec.NodeName
		va := attachmentTo(o.vas, node)
		switch {
		case va == nil:
			return fmt.Sprintf("for a VolumeAttachment of %s to %s (kube-controller-manager's attach-detach controller makes it for Pod %s)", o.pv.Name, node, p.Name)
		case !va.Status.Attached && va.Status.AttachError != nil:
			return fmt.Sprintf("for attach to %s, which failed: %s", node, va.Status.AttachError.Message)
		case !va.Status.Attached:
			if ev := lastEvent(o.events, "Pod", p.Name, "FailedAttachVolume"); ev != nil {
				return fmt.Sprintf("for attach to %s: %s (FailedAttachVolume, %s ago)", node, ev.Message, age(now.Sub(eventTime(ev))))
			}
			return fmt.Sprintf("for the attacher to attach %s to %s (VolumeAttachment %s)", o.pv.Name, node, va.Name)
		}
		if ev := lastEvent(o.events, "Pod", p.Name, "FailedMount"); ev != nil {
			return fmt.Sprintf("for mount on %s: %s (FailedMount, %s ago)", node, ev.Message, age(now.Sub(eventTime(ev))))
		}
		if o.node != nil && o.node.status != nil && !stagedOn(o.node, o.pv) {
			return fmt.Sprintf("for kubelet on %s to stage the volume (attached; Pod %s is %s)", node, p.Name, podRef(p).Reason)
		}
	}
	return ""
}

// waitingForVolume is why a Pending claim has no volume yet.
func waitingForVolume(o *pathObjects, now time.Time) string {
	pvc := o.pvc
	if pvc.Spec.StorageClassName != nil && *pvc.Spec.StorageClassName != "" && o.class == nil {
		return fmt.Sprintf("for StorageClass %s, which does not exist", *pvc.Spec.StorageClassName)
	}
	failed := lastEvent(o.events, "PersistentVolumeClaim", pvc.Name, "ProvisioningFailed")
	if failed != nil && aboutSpace(failed.Message) {
		desc, code := providerMessage(failed.Message)
		return fmt.Sprintf(waitingForSpace+"%s (ProvisioningFailed%s, %s ago)", desc, code, age(now.Sub(eventTime(failed))))
	}
	for _, p := range o.pods {
		if ev := lastEvent(o.events, "Pod", p.Name, "FailedScheduling"); ev != nil && aboutSpace(ev.Message) {
			return fmt.Sprintf(waitingForSpace+"no node has the storage Pod %s asks for (FailedScheduling: %s)", p.Name, ev.Message)
		}
	}
	wffc := o.class != nil && o.class.VolumeBindingMode != nil && *o.class.VolumeBindingMode == storagev1.VolumeBindingWaitForFirstConsumer
	switch {
	case wffc && len(o.pods) == 0:
		return fmt.Sprintf(waitingForAPod+"class %s binds WaitForFirstConsumer, and no Pod uses the claim", o.class.Name)
	case wffc && pvc.Annotations["volume.kubernetes.io/selected-node"] == "":
		if ev := lastEvent(o.events, "Pod", o.pods[0].Name, "FailedScheduling"); ev != nil {
			return fmt.Sprintf("for the scheduler to place Pod %s: %s", o.pods[0].Name, ev.Message)
		}
		return fmt.Sprintf("for the scheduler to place Pod %s (class %s binds WaitForFirstConsumer)", o.pods[0].Name, o.class.Name)
	case failed != nil:
		desc, code := providerMessage(failed.Message)
		return fmt.Sprintf("for provisioning, which failed: %s (ProvisioningFailed%s, %s ago)", desc, code, age(now.Sub(eventTime(failed))))
	}
	return "for the provisioner to create the volume (csi-provisioner in the controller Pod)"
}

// providerMessage is the driver's part of a provisioning Event, the
// description of the gRPC status without the provisioner's preamble, and
// ", <code>" to put after the Event's reason ("" when there is none).
func providerMessage(msg string) (string, string) {
	i := strings.LastIndex(msg, "desc = ")
	if i < 0 {
		return msg, ""
	}
	code := ""
	if j := strings.LastIndex(msg[:i], "code = "); j >= 0 {
		code = ", " + strings.TrimSpace(msg[j+len("code = "):i])
	}
	return msg[i+len("desc = "):], code
}

// lastEvent is the newest Event of a reason about an object, nil if none.
func lastEvent(events []corev1.Event, kind, name, reason string) *corev1.Event {
	for i := len(events) - 1; i >= 0; i-- {
		ev := &events[i]
		if ev.InvolvedObject.Kind == kind && ev.InvolvedObject.Name == name && ev.Reason == reason {
			return ev
		}
	}
	return nil
}

// attachmentTo is the VolumeAttachment to node, nil if there is none.
func attachmentTo(vas []*storagev1.VolumeAttachment, node string) *storagev1.VolumeAttachment {
	for _, va := range vas {
		if va.Spec.NodeName == node {
			return va
		}
	}
	return nil
}

// stagedOn says whether the node plugin has the PV's volume staged.
func stagedOn(n *nodeView, pv *corev1.PersistentVolume) bool {
	for _, v := range n.status.Volumes {
		if pv.Spec.CSI != nil && v.VolumeID == pv.Spec.CSI.VolumeHandle && !v.Staged.IsZero() {
			return true
		}
	}
	return false
}
