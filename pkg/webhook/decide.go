package webhook

import (
	"context"
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/tools/cache"
)

// parameterPool is the StorageClass parameter naming the pool.
const parameterPool = "pool"

// verdict is the answer to one review: denied when reason is set;
// warnings go back to the client either way.
type verdict struct {
	reason   string
	warnings []string
}

// decider judges objects from the caches. The stores hold StorageClasses
// (by name), PersistentVolumes (by name) and the capacity controller's
// CSIStorageCapacity objects of the driver.
type decider struct {
	driver     string
	namespace  string
	classes    cache.Store
	volumes    cache.Store
	capacities cache.Store
	csi        CapacityGetter
	csiTimeout func(context.Context) (context.Context, context.CancelFunc)
}

// class returns the StorageClass name when it is the driver's, else nil.
func (d *decider) class(name string) *storagev1.StorageClass {
	obj, ok, err := d.classes.GetByKey(name)
	if err != nil || !ok {
		return nil
	}
	sc, _ := obj.(*storagev1.StorageClass)
	if sc == nil || sc.Provisioner != d.driver {
		return nil
	}
	return sc
}

// capacitiesOf returns the CSIStorageCapacity objects of class.
func (d *decider) capacitiesOf(class string) []*storagev1.CSIStorageCapacity {
	var out []*storagev1.CSIStorageCapacity
	for _, obj := range d.capacities.List() {
		if c, ok := obj.(*storagev1.CSIStorageCapacity); ok && c.StorageClassName == class {
			out = append(out, c)
		}
	}
	return out
}

// maxSize is where sizes no volume can have begin. A CSI capacity is an
// int64 of bytes, and Quantity.Value of a larger quantity wraps (1e19 is
// 0, 9223372036854775808 is negative) where resource.ParseQuantity does
// not cap it at this very value (it does for binary suffixes: 8Ei and 16Ei
// parse as math.MaxInt64). So this value, and all beyond, are refused: no
// pool holds a file of 8Ei - 1 bytes either.
const maxSize = math.MaxInt64

// request is a claim's storage request in bytes (0: none); fits is false
// when it is maxSize or more, and then the bytes are 0.
func request(pvc *corev1.PersistentVolumeClaim) (b int64, fits bool) {
	q, ok := pvc.Spec.Resources.Requests[corev1.ResourceStorage]
	if !ok {
		return 0, true
	}
	if q.CmpInt64(maxSize) >= 0 {
		return 0, false
	}
	return q.Value(), true
}

// requestString is a claim's storage request as the client sent it.
func requestString(pvc *corev1.PersistentVolumeClaim) string {
	q := pvc.Spec.Resources.Requests[corev1.ResourceStorage]
	return q.String()
}

// beyondMaxSize says why a request of maxSize or more is refused.
var beyondMaxSize = fmt.Sprintf("a size must be less than %d bytes (8Ei - 1, the largest a CSI capacity can express)", int64(maxSize))

// size formats bytes as a Kubernetes quantity and, when that rounds, the
// exact byte count.
func size(b int64) string {
	q := resource.NewQuantity(b, resource.BinarySI).String()
	if q == fmt.Sprint(b) {
		return q
	}
	return fmt.Sprintf("%s (%d bytes)", q, b)
}

// claimCreate refuses a claim of a driver's class larger than the largest
// volume any segment of the class can hold. A claim bound to a named
// volume, of another class, without a request, or of a class with no
// capacity published yet is allowed.
func (d *decider) claimCreate(pvc *corev1.PersistentVolumeClaim) verdict {
	if pvc.Spec.VolumeName != "" || pvc.Spec.StorageClassName == nil {
		return verdict{}
	}
	className := *pvc.Spec.StorageClassName
	if d.class(className) == nil {
		return verdict{}
	}
	want, fits := request(pvc)
	if fits && want <= 0 {
		return verdict{}
	}
	largest, segments := int64(-1), 0
	for _, c := range d.capacitiesOf(className) {
		// The scheduler's rule: maximumVolumeSize when reported, else
		// the free capacity.
		q := c.MaximumVolumeSize
		if q == nil {
			q = c.Capacity
		}
		if q == nil {
			continue
		}
		segments++
		largest = max(largest, q.Value())
	}
	if !fits {
		largestSays := ""
		if segments > 0 {
			largestSays = fmt.Sprintf("; the largest pool of StorageClass %q can hold %s. Ask for at most %s", className, size(largest), size(largest))
		}
		return verdict{reason: fmt.Sprintf("asked %s bytes, more than any volume can be: PersistentVolumeClaim %s of StorageClass %q; %s%s",
			requestString(pvc), claimName(pvc), className, beyondMaxSize, largestSays)}
	}
	if segments == 0 || want <= largest {
		return verdict{}
	}
	return verdict{reason: fmt.Sprintf(
		"largest pool can hold %s; asked %s: PersistentVolumeClaim %s requests more than any pool of StorageClass %q can hold "+
			"(the largest maximumVolumeSize of its %d topology segments in the CSIStorageCapacity objects of %s). "+
			"Ask for at most %s, or add space to a pool of the class and wait for its capacity to be published",
		size(largest), size(want), claimName(pvc), className, segments, d.driver, size(largest))}
}

// claimExpand refuses growing a bound claim of the driver by more than the
// free space of every pool of its volume's zone.
func (d *decider) claimExpand(old, pvc *corev1.PersistentVolumeClaim) verdict {
	want, fits := request(pvc)
	if had, _ := request(old); fits && want <= had || pvc.Spec.VolumeName == "" {
		return verdict{}
	}
	obj, ok, err := d.volumes.GetByKey(pvc.Spec.VolumeName)
	if err != nil || !ok {
		return verdict{}
	}
	pv, _ := obj.(*corev1.PersistentVolume)
	if pv == nil || pv.Spec.CSI == nil || pv.Spec.CSI.Driver != d.driver {
		return verdict{}
	}
	q, ok := pv.Spec.Capacity[corev1.ResourceStorage]
	if !ok {
		return verdict{}
	}
	have := q.Value()
	if !fits {
		return verdict{reason: fmt.Sprintf("asks for %s bytes, more than any volume can be: PersistentVolumeClaim %s, whose volume %s holds %s; %s",
			requestString(pvc), claimName(pvc), pv.Name, size(have), beyondMaxSize)}
	}
	growth := want - have
	if growth <= 0 {
		return verdict{}
	}
	free, segments := int64(-1), []string(nil)
	for _, c := range d.capacitiesOf(pv.Spec.StorageClassName) {
		if c.Capacity == nil || !inVolumeZone(pv, c) {
			continue
		}
		segments = append(segments, segmentString(c))
		free = max(free, c.Capacity.Value())
	}
	if len(segments) == 0 || growth <= free {
		return verdict{}
	}
	sort.Strings(segments)
	return verdict{reason: fmt.Sprintf(
		"no pool of the volume's zone can hold the expansion: PersistentVolumeClaim %s asks for %s, %s more than its volume %s holds (%s), "+
			"but the pool of its zone (%s) has %s free. Ask for at most %s, or free space in that pool",
		claimName(pvc), size(want), size(growth), pv.Name, size(have), strings.Join(segments, ", "), size(free), size(have+free))}
}

// classCreate refuses a class of the driver whose pool no node serves: the
// driver reports no space in a pool of that name in any zone. While no
// node has reported (no CSIStorageCapacity of the driver yet) the class is
// allowed with a warning, so that classes can be installed before the
// nodes; so is it when the driver cannot be asked.
func (d *decider) classCreate(ctx context.Context, sc *storagev1.StorageClass) verdict {
	if sc.Provisioner != d.driver {
		return verdict{}
	}
	pool, ok := sc.Parameters[parameterPool]
	if !ok || pool == "" {
		return verdict{}
	}
	if len(d.capacities.ListKeys()) == 0 {
		return verdict{warnings: []string{fmt.Sprintf(
			"pool %q of StorageClass %s is not checked: no node has reported capacity for %s yet (no CSIStorageCapacity object in namespace %s); "+
				"make sure a node serves the pool before claims of the class are made", pool, sc.Name, d.driver, d.namespace)}}
	}
	cctx, cancel := d.csiTimeout(ctx)
	defer cancel()
	rsp, err := d.csi.GetCapacity(cctx, &csi.GetCapacityRequest{Parameters: map[string]string{parameterPool: pool}})
	if err != nil {
		return verdict{warnings: []string{fmt.Sprintf("pool %q of StorageClass %s is not checked: the driver could not be asked: %v", pool, sc.Name, err)}}
	}
	if rsp.GetAvailableCapacity() > 0 || rsp.GetMaximumVolumeSize().GetValue() > 0 {
		return verdict{}
	}
	return verdict{reason: fmt.Sprintf(
		"no node serves pool %q of StorageClass %s: %s reports 0 bytes in a pool of that name in every zone (no node has it, or every one is full). "+
			"Name a pool of the driver's configuration, or add pool %q to the nodes first", pool, sc.Name, d.driver, pool)}
}

// claimName is namespace/name of a claim (name may be empty on create with
// generateName).
func claimName(pvc *corev1.PersistentVolumeClaim) string {
	name := pvc.Name
	if name == "" {
		name = pvc.GenerateName + "*"
	}
	return pvc.Namespace + "/" + name
}

// segmentString is a CSIStorageCapacity's segment, key=value pairs sorted.
func segmentString(c *storagev1.CSIStorageCapacity) string {
	if c.NodeTopology == nil || len(c.NodeTopology.MatchLabels) == 0 {
		return "every node"
	}
	var kv []string
	for k, v := range c.NodeTopology.MatchLabels {
		kv = append(kv, k+"="+v)
	}
	sort.Strings(kv)
	return strings.Join(kv, ",")
}

// inVolumeZone tells whether the segment of c lies where the volume is: a
// node with exactly the segment's labels would satisfy the volume's
// required node affinity. A volume without one is everywhere.
func inVolumeZone(pv *corev1.PersistentVolume, c *storagev1.CSIStorageCapacity) bool {
	if pv.Spec.NodeAffinity == nil || pv.Spec.NodeAffinity.Required == nil {
		return true
	}
	var seg labels.Set
	if c.NodeTopology != nil {
		if len(c.NodeTopology.MatchExpressions) > 0 {
			return false
		}
		seg = labels.Set(c.NodeTopology.MatchLabels)
	}
	for _, term := range pv.Spec.NodeAffinity.Required.NodeSelectorTerms {
		if termMatches(term, seg) {
			return true
		}
	}
	return false
}

var operators = map[corev1.NodeSelectorOperator]selection.Operator{
	corev1.NodeSelectorOpIn:           selection.In,
	corev1.NodeSelectorOpNotIn:        selection.NotIn,
	corev1.NodeSelectorOpExists:       selection.Exists,
	corev1.NodeSelectorOpDoesNotExist: selection.DoesNotExist,
	corev1.NodeSelectorOpGt:           selection.GreaterThan,
	corev1.NodeSelectorOpLt:           selection.LessThan,
}

// termMatches applies a node selector term's label expressions to set; a
// term with field expressions (node names) or no expressions matches
// nothing, as in the scheduler.
func termMatches(term corev1.NodeSelectorTerm, set labels.Set) bool {
	if len(term.MatchExpressions) == 0 || len(term.MatchFields) > 0 {
		return false
	}
	for _, e := range term.MatchExpressions {
		op, ok := operators[e.Operator]
		if !ok {
			return false
		}
		r, err := labels.NewRequirement(e.Key, op, e.Values)
		if err != nil || !r.Matches(set) {
			return false
		}
	}
	return true
}
