package capacity

import (
	"maps"
	"slices"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// A topology segment is a set of topology labels (key → value), the
// accessible topology a GetCapacity asks about and the matchLabels of an
// object's nodeTopology. The empty segment (no labels) is that of a driver
// without topology: its objects carry an empty nodeTopology, which matches
// every node.
//
// A segment is identified by its key, its labels sorted by name as
// "k1=v1,k2=v2". Neither '=' nor ',' can occur in a label name or value,
// so the key is unambiguous and parses back into the labels.

// segmentKey is the key of the segment of labels.
func segmentKey(labels map[string]string) string {
	var b strings.Builder
	for i, k := range slices.Sorted(maps.Keys(labels)) {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(labels[k])
	}
	return b.String()
}

// segmentLabels parses a segment key back into its labels.
func segmentLabels(key string) map[string]string {
	labels := map[string]string{}
	if key == "" {
		return labels
	}
	for pair := range strings.SplitSeq(key, ",") {
		k, v, _ := strings.Cut(pair, "=")
		labels[k] = v
	}
	return labels
}

// invalidSegmentPrefix starts the segment key of an object whose
// nodeTopology is no segment (none at all, or match expressions). No segment
// key starts with it (a label name cannot start with '!'), so such an
// object is never wanted and is deleted.
const invalidSegmentPrefix = "!"

// objectSegmentKey is the key of the segment an object's nodeTopology
// selects, or an invalid key of its own for a selector that is no segment.
func objectSegmentKey(sel *metav1.LabelSelector, uid types.UID) string {
	if sel == nil || len(sel.MatchExpressions) > 0 {
		return invalidSegmentPrefix + string(uid)
	}
	return segmentKey(sel.MatchLabels)
}

// nodeTopology is the nodeTopology of the objects of the segment key.
func nodeTopology(key string) *metav1.LabelSelector {
	labels := segmentLabels(key)
	if len(labels) == 0 {
		// Upstream's empty segment is an empty selector (all nodes).
		return &metav1.LabelSelector{}
	}
	return &metav1.LabelSelector{MatchLabels: labels}
}

// affinityMatches tells whether a PersistentVolume with node affinity aff
// may live in the segment with labels: whether some node with those
// labels could satisfy one of its required terms. Expressions on keys
// outside the segment, field selectors and numeric comparisons cannot be
// judged from a segment and count as satisfied: the cost of a wrong yes is
// one extra GetCapacity, that of a wrong no a stale object. A volume without
// required node affinity may be anywhere.
func affinityMatches(aff *corev1.VolumeNodeAffinity, labels map[string]string) bool {
	if aff == nil || aff.Required == nil || len(aff.Required.NodeSelectorTerms) == 0 {
		return true
	}
	for _, term := range aff.Required.NodeSelectorTerms {
		if termMatches(term, labels) {
			return true
		}
	}
	return false
}

func termMatches(term corev1.NodeSelectorTerm, labels map[string]string) bool {
	for _, e := range term.MatchExpressions {
		v, has := labels[e.Key]
		if !has {
			continue
		}
		switch e.Operator {
		case corev1.NodeSelectorOpIn:
			if !slices.Contains(e.Values, v) {
				return false
			}
		case corev1.NodeSelectorOpNotIn:
			if slices.Contains(e.Values, v) {
				return false
			}
		case corev1.NodeSelectorOpDoesNotExist:
			return false
		}
	}
	return true
}

// topology is the set of segments the controller publishes for: the
// segments of the nodes where the driver runs (central), or one fixed
// segment (--node-deployment). Each node contributes at most one segment;
// a segment lives while at least one node contributes it.
type topology struct {
	mu     sync.Mutex
	byNode map[string]string // node name → the key of its segment
	nodes  map[string]int    // segment key → how many nodes have it
}

func newTopology() *topology {
	return &topology{byNode: map[string]string{}, nodes: map[string]int{}}
}

// fixedTopology is a topology of the one segment key.
func fixedTopology(key string) *topology {
	t := newTopology()
	t.nodes[key] = 1
	return t
}

// setNode records the segment of node (has false: the node contributes
// none) and returns the segment that appeared and the one that vanished
// with the change, if any ("" and false when none).
func (t *topology) setNode(node, key string, has bool) (added string, addedOK bool, removed string, removedOK bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	old, hadOld := t.byNode[node]
	if hadOld == has && old == key {
		return "", false, "", false
	}
	if hadOld {
		delete(t.byNode, node)
		if t.nodes[old]--; t.nodes[old] <= 0 {
			delete(t.nodes, old)
			removed, removedOK = old, true
		}
	}
	if has {
		t.byNode[node] = key
		if t.nodes[key]++; t.nodes[key] == 1 {
			added, addedOK = key, true
		}
	}
	return added, addedOK, removed, removedOK
}

// has tells whether the segment key exists.
func (t *topology) has(key string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.nodes[key] > 0
}

// keys returns the keys of every segment, sorted.
func (t *topology) keys() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Sorted(maps.Keys(t.nodes))
}

// nodeNames returns the nodes that contribute a segment.
func (t *topology) nodeNames() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Collect(maps.Keys(t.byNode))
}
