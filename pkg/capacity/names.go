package capacity

import (
	"fmt"
	"hash/fnv"

	"github.com/loopvol/loopvol/internal/kube"
)

// Labels of every CSIStorageCapacity object the controller manages, with
// the upstream external-provisioner's names and values: a cluster can switch
// between the two and each adopts the other's objects.
const (
	// DriverNameLabel holds the CSI driver's name.
	DriverNameLabel = "csi.storage.k8s.io/drivername"
	// ManagedByLabel holds ManagedByID: which instance manages the object.
	ManagedByLabel = "csi.storage.k8s.io/managed-by"
	// ManagedByCentral is ManagedByLabel's value for the one central
	// controller of a driver (upstream's value).
	ManagedByCentral = "external-provisioner"
)

// GenerateName is the prefix of the names of the objects the controller
// creates (upstream's).
const GenerateName = "csisc-"

// QueueName is the name of the work queue in the workqueue metrics, the
// upstream name.
const QueueName = "csistoragecapacity"

// maxLabelValue is the longest label value Kubernetes accepts.
const maxLabelValue = 63

// ManagedByID is the value of ManagedByLabel: ManagedByCentral for the
// central controller (node ""), and for the controller of one node with
// --node-deployment "external-provisioner-<node>", shortened the way the
// upstream external-provisioner shortens it when longer than a label value
// may be. Objects of each node are then told apart from those of the others
// and of the central controller.
func ManagedByID(node string) string {
	if node == "" {
		return ManagedByCentral
	}
	return shortenedName(ManagedByCentral, node, maxLabelValue)
}

// shortenedName joins base and suffix with a '-'. When that is longer than
// limit, the base is cut and an 8-digit FNV-1a hash keeps the result unique:
// "<cut base>-<hash of base>-<suffix>" while the suffix leaves room for at
// least one character of the base, else "<base cut to limit-9>-<hash of the
// joined name>", cut to limit. This is the upstream external-provisioner's
// rule (its getNameWithMaxLength), so both compute the same label value for
// the same node.
func shortenedName(base, suffix string, limit int) string {
	joined := base + "-" + suffix
	if base == "" {
		joined = suffix
	}
	if len(joined) <= limit {
		return joined
	}
	keep := limit - len(suffix) - len("-01234567-")
	if keep > 0 {
		return base[:keep] + "-" + fnv32a(base) + "-" + suffix
	}
	out := fnv32a(joined)
	if cut := base[:min(len(base), max(0, limit-9))]; cut != "" {
		out = cut + "-" + out
	}
	return out[:min(limit, len(out))]
}

// fnv32a is the FNV-1a hash of s as 8 hex digits.
func fnv32a(s string) string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(s))
	return fmt.Sprintf("%08x", h.Sum32())
}

// LeaseName is the leader-election Lease of the central capacity
// controllers of driver: "loopvol-capacity-leader-<sanitized driver>".
// Upstream the capacity controller runs inside external-provisioner under
// the provisioner's Lease (named after the sanitized driver); that Lease is
// taken by the upstream csi-provisioner that keeps provisioning next to this
// sidecar, so the capacity controller needs one of its own.
func LeaseName(driver string) string {
	return "loopvol-capacity-leader-" + kube.SanitizeDriverName(driver)
}
