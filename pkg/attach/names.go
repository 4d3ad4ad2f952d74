package attach

import "github.com/loopvol/loopvol/internal/kube"

// NodeIDAnnotation on a VolumeAttachment records the CSI node ID the volume
// was published to. The controller writes it before ControllerPublishVolume
// and falls back to it when the node's CSINode no longer names the driver,
// so a volume can be detached from a node that is gone. Same name as the
// upstream external-attacher.
const NodeIDAnnotation = "csi.alpha.kubernetes.io/node-id"

// FinalizerName is the finalizer the controller keeps on the
// VolumeAttachments and PersistentVolumes of driver while a volume may be
// attached: "external-attacher/<sanitized driver>", exactly as the upstream
// external-attacher names it, so either can take over from the other.
func FinalizerName(driver string) string {
	return "external-attacher/" + kube.SanitizeDriverName(driver)
}

// LeaseName is the name of the leader-election Lease of the attachers of
// driver, the upstream external-attacher's name: only one of ours or
// theirs acts at a time.
func LeaseName(driver string) string {
	return "external-attacher-leader-" + kube.SanitizeDriverName(driver)
}
