package heartbeat

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/rest"
)

// The labels and the annotation of a heartbeat Lease. Label values are at
// most 63 characters: the driver name fits (CSI limits it to 63), a node ID
// may not, so the node ID is only in spec.holderIdentity.
const (
	// ComponentLabel marks loopvol's heartbeat Leases (value
	// ComponentHeartbeat).
	ComponentLabel     = "loopvol.csi.io/component"
	ComponentHeartbeat = "heartbeat"
	// DriverLabel is the CSI driver whose node renews the Lease.
	DriverLabel = "loopvol.csi.io/driver"
	// IncarnationAnnotation is when the node plugin that renews the Lease
	// started (RFC 3339 with nanoseconds): a new value means the node
	// plugin was restarted.
	IncarnationAnnotation = "loopvol.csi.io/incarnation"
	// FencedVolumesAnnotation is how many fenced volumes the node plugin
	// still holds (loop devices of images a fence replaced, as it counted
	// them before the renewal; a decimal): the node is clean of its
	// fences when it is 0. A plugin that does not count writes none.
	FencedVolumesAnnotation = "loopvol.csi.io/fenced-volumes"
)

// Defaults of the optional durations.
const (
	DefaultRenewInterval  = 2 * time.Second
	DefaultFencingPeriod  = 20 * time.Second
	DefaultSelfFenceAfter = 10 * time.Second
)

// Client is the part of the Kubernetes API the heartbeat uses.
// kubernetes.Interface (the clientset and its fake) implements it; so does
// NewClient's client, which links only the coordination.k8s.io/v1 types.
type Client interface {
	CoordinationV1() coordinationv1client.CoordinationV1Interface
}

type coordinationClient struct {
	c coordinationv1client.CoordinationV1Interface
}

func (k coordinationClient) CoordinationV1() coordinationv1client.CoordinationV1Interface { return k.c }

// NewClient makes a Client from rc alone: a binary that needs no other API
// group does not link the whole clientset.
func NewClient(rc *rest.Config) (Client, error) {
	c, err := coordinationv1client.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("create the Kubernetes coordination/v1 client: %w", err)
	}
	return coordinationClient{c: c}, nil
}

// Selector selects the heartbeat Leases of driver.
func Selector(driver string) labels.Selector {
	return labels.SelectorFromSet(leaseLabels(driver))
}

func leaseLabels(driver string) labels.Set {
	return labels.Set{ComponentLabel: ComponentHeartbeat, DriverLabel: driver}
}

// leaseNamePrefix starts every heartbeat Lease's name, so that they sort
// together in `kubectl get leases`.
const leaseNamePrefix = "heartbeat-"

// nameHashLen is how many hex digits of SHA-256 a hashed name keeps: 64
// bits, so that two of a cluster's node IDs share one only by a collision
// of some 1 in 10^11 even with 10 000 nodes.
const nameHashLen = 16

// LeaseName is the name of the heartbeat Lease of nodeID for driver, a
// valid object name (a DNS-1123 subdomain of at most 253 characters)
// whatever the node ID. The rule:
//
//   - the prefix is "heartbeat-" and the driver name lower-cased with every
//     character other than a-z and 0-9 replaced by '-'
//     ("heartbeat-loopvol-csi-io");
//   - a node ID that is itself a DNS-1123 subdomain (lower case, digits,
//     '-' and '.', starting and ending alphanumeric) and fits is appended
//     after a '-' as it is: "heartbeat-loopvol-csi-io-node-a";
//   - any other node ID (upper case, other characters, too long) is
//     appended in the same lower-cased form as the driver, cut so that the
//     name fits, followed by '-' and 16 hex digits of the SHA-256 of
//     driver, a NUL byte and the node ID exactly as given:
//     "heartbeat-loopvol-csi-io-node-a-5c9d…" for "Node_A". Two node IDs
//     that differ only in case or punctuation so get different names.
//
// The name is not a reversible encoding: the Lease's spec.holderIdentity
// says whose it is, and the Renewer never renews a Lease whose holder is
// another node (a node ID that happened to equal another's hashed form
// would be refused there, not share the Lease).
func LeaseName(driver, nodeID string) string {
	prefix := leaseNamePrefix + nameSafe(driver)
	if len(validation.IsDNS1123Subdomain(nodeID)) == 0 && len(prefix)+1+len(nodeID) <= validation.DNS1123SubdomainMaxLength {
		return prefix + "-" + nodeID
	}
	sum := sha256.Sum256([]byte(driver + "\x00" + nodeID))
	hash := hex.EncodeToString(sum[:])[:nameHashLen]
	readable := nameSafe(nodeID)
	if room := validation.DNS1123SubdomainMaxLength - len(prefix) - 2 - nameHashLen; len(readable) > room {
		readable = strings.TrimRight(readable[:room], "-")
	}
	if readable == "" {
		return prefix + "-" + hash
	}
	return prefix + "-" + readable + "-" + hash
}

// nameSafe lower-cases s and replaces every byte other than a-z and 0-9
// with '-', then trims '-' at both ends.
func nameSafe(s string) string {
	b := []byte(strings.ToLower(s))
	for i, c := range b {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			b[i] = '-'
		}
	}
	return strings.Trim(string(b), "-")
}

// leaseSeconds is d in whole seconds, rounded up: the Lease promises that
// its holder is not serving once it is that old, and a shorter figure
// would promise more than the holder keeps.
func leaseSeconds(d time.Duration) int32 {
	s := math.Ceil(d.Seconds())
	if s > math.MaxInt32 {
		return math.MaxInt32
	}
	return int32(s)
}

// holderOf is the Lease's spec.holderIdentity ("" if none).
func holderOf(l *coordinationv1.Lease) string {
	if l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

// incarnationOf parses the Lease's incarnation annotation (zero if it is
// missing or not a time).
func incarnationOf(l *coordinationv1.Lease) time.Time {
	t, err := time.Parse(time.RFC3339Nano, l.Annotations[IncarnationAnnotation])
	if err != nil {
		return time.Time{}
	}
	return t
}

// validateLeases checks what the Renewer and the Observer both need to
// reach a driver's Leases: a client, a namespace, a driver name.
func validateLeases(client Client, namespace, driver string) error {
	switch {
	case client == nil:
		return errors.New("no Kubernetes client")
	case len(validation.IsDNS1123Label(namespace)) > 0:
		return fmt.Errorf("the namespace %q is not a valid namespace name", namespace)
	case driver == "" || len(validation.IsValidLabelValue(driver)) > 0:
		return fmt.Errorf("the driver name %q is not a valid CSI driver name (at most 63 characters: letters, digits, '-', '.')", driver)
	}
	return nil
}

// fencedOf parses the Lease's fenced-volumes annotation (-1 if it is
// missing or not a count).
func fencedOf(l *coordinationv1.Lease) int {
	n, err := strconv.Atoi(l.Annotations[FencedVolumesAnnotation])
	if err != nil || n < 0 {
		return -1
	}
	return n
}

// periodOf is the fencing period the Lease states (zero if none).
func periodOf(l *coordinationv1.Lease) time.Duration {
	if l.Spec.LeaseDurationSeconds == nil || *l.Spec.LeaseDurationSeconds <= 0 {
		return 0
	}
	return time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
}

// renewTimeOf is the Lease's spec.renewTime (zero if none): the holder's
// clock, used only to tell one renewal from the next.
func renewTimeOf(l *coordinationv1.Lease) time.Time {
	if l.Spec.RenewTime == nil {
		return time.Time{}
	}
	return l.Spec.RenewTime.Time
}
