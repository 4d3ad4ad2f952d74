package resize

import (
	"github.com/loopvol/loopvol/internal/kube"
)

// Names shared with Kubernetes and the upstream external-resizer. They are
// the contract a cluster depends on when it switches between the two.
const (
	// ResizerAnnotation on a PersistentVolumeClaim names the resizer that
	// should expand it; kube-controller-manager's expand controller sets it
	// (to the CSI driver's name for CSI volumes). A change of it queues the
	// claim again, as upstream does, so a claim handed to this driver late
	// (CSI migration) is picked up at once.
	ResizerAnnotation = "volume.kubernetes.io/storage-resizer"
	// PreResizeCapacityAnnotation on a PersistentVolume records the claim's
	// capacity before a controller expansion that still needs the node to
	// grow the filesystem. kube-controller-manager's PV controller reports
	// it as the capacity of a claim bound to the volume later, while the
	// filesystem is still the old size. It is written with the new PV
	// capacity (feature gate AnnotateFsResize) and removed once the claim's
	// capacity has caught up with the volume's.
	PreResizeCapacityAnnotation = "volume.alpha.kubernetes.io/pre-resize-capacity"
	// NodeExpansionNotRequiredAnnotation on a PersistentVolumeClaim says
	// that the last expansion was finished by the controller and the node
	// has nothing to do.
	NodeExpansionNotRequiredAnnotation = "volume.kubernetes.io/node-expansion-not-required"
)

// Reasons of the Events recorded on PersistentVolumeClaims, upstream's.
const (
	ReasonResizing                 = "Resizing"
	ReasonResizeFailed             = "VolumeResizeFailed"
	ReasonFileSystemResizeRequired = "FileSystemResizeRequired"
	ReasonResizeSuccessful         = "VolumeResizeSuccessful"
)

// QueueName is the name of the controller's work queue in the workqueue
// metrics: "<driver name>-pvc", as the upstream external-resizer names it.
func QueueName(driver string) string { return driver + "-pvc" }

// LeaseName is the leader-election Lease of the resizers of driver,
// "external-resizer-<sanitized driver name>", the upstream
// external-resizer's: only one of ours or theirs acts at a time.
func LeaseName(driver string) string {
	return "external-resizer-" + kube.SanitizeDriverName(driver)
}

// EventComponent is the source component of the Events the controller
// records when Config.Recorder is nil, the upstream external-resizer's.
func EventComponent(driver string) string { return "external-resizer " + driver }
