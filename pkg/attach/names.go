package attach

import "strings"

// NodeIDAnnotation on a VolumeAttachment records the CSI node ID the volume
// was published to. The controller writes it before ControllerPublishVolume
// and falls back to it when the node's CSINode no longer names the driver,
// so a volume can be detached from a node that is gone. Same name as the
// upstream external-attacher.
const NodeIDAnnotation = "csi.alpha.kubernetes.io/node-id"

// SanitizeDriverName turns a CSI driver name into a name part Kubernetes
// accepts, the way the upstream external-attacher does: every character
// outside [a-zA-Z0-9-] becomes '-', and an 'X' is appended when the result
// ends in '-'. "loopvol.csi.io" becomes "loopvol-csi-io".
func SanitizeDriverName(driver string) string {
	b := []byte(driver)
	for i, ch := range b {
		ok := ch >= 'a' && ch <= 'z' || ch >= 'A' && ch <= 'Z' || ch >= '0' && ch <= '9' || ch == '-'
		if !ok {
			b[i] = '-'
		}
	}
	s := string(b)
	if s == "" || strings.HasSuffix(s, "-") {
		s += "X"
	}
	return s
}

// FinalizerName is the finalizer the controller keeps on the
// VolumeAttachments and PersistentVolumes of driver while a volume may be
// attached: "external-attacher/<sanitized driver>", exactly as the upstream
// external-attacher names it, so either can take over from the other.
func FinalizerName(driver string) string {
	return "external-attacher/" + SanitizeDriverName(driver)
}

// LeaseName is the name of the leader-election Lease of the attachers of
// driver, the upstream external-attacher's name: only one of ours or
// theirs acts at a time.
func LeaseName(driver string) string {
	return "external-attacher-leader-" + SanitizeDriverName(driver)
}
