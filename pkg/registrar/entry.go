package registrar

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"

	"github.com/container-storage-interface/spec/lib/go/csi"
	storagev1 "k8s.io/api/storage/v1"

	"github.com/loopvol/loopvol/internal/kube"
)

// errEmptyNodeID is NodeGetInfo without a node ID, which kubelet refuses
// too: nothing could attach to the node.
var errEmptyNodeID = errors.New("NodeGetInfo returned an empty node ID")

// desiredEntry is the CSINode entry kubelet's node info manager writes for
// driver after NodeGetInfo answered info: the node ID, the topology keys
// sorted, and allocatable.count from max_volumes_per_node when it is
// positive (unset for 0, "no limit"). It also returns a warning to log
// when the limit is negative, which kubelet ignores the same way.
func desiredEntry(driver string, info *csi.NodeGetInfoResponse) (entry storagev1.CSINodeDriver, warning string, err error) {
	if info.GetNodeId() == "" {
		return storagev1.CSINodeDriver{}, "", errEmptyNodeID
	}
	e := storagev1.CSINodeDriver{
		Name:   driver,
		NodeID: info.GetNodeId(),
		// Never nil: kubelet writes an empty list, not null.
		TopologyKeys: append([]string{}, slices.Sorted(maps.Keys(info.GetAccessibleTopology().GetSegments()))...),
	}
	switch n := info.GetMaxVolumesPerNode(); {
	case n > 0:
		c := int32(min(n, math.MaxInt32))
		e.Allocatable = &storagev1.VolumeNodeResources{Count: &c}
	case n < 0:
		warning = fmt.Sprintf("NodeGetInfo returned max_volumes_per_node %d; allocatable.count is left unset", n)
	}
	return e, warning, nil
}

// sameEntry reports whether a and b say the same, the way kubelet compares
// them: topology keys as a set, a missing count like no allocatable.
func sameEntry(a, b storagev1.CSINodeDriver) bool {
	ka, kb := slices.Clone(a.TopologyKeys), slices.Clone(b.TopologyKeys)
	slices.Sort(ka)
	slices.Sort(kb)
	return a.Name == b.Name && a.NodeID == b.NodeID &&
		slices.Equal(slices.Compact(ka), slices.Compact(kb)) &&
		equalCount(count(a), count(b))
}

func count(e storagev1.CSINodeDriver) *int32 {
	if e.Allocatable == nil {
		return nil
	}
	return e.Allocatable.Count
}

func equalCount(a, b *int32) bool {
	return (a == nil && b == nil) || (a != nil && b != nil && *a == *b)
}

// findEntry returns the index of driver's entry in node, or -1.
func findEntry(node *storagev1.CSINode, driver string) int {
	return slices.IndexFunc(node.Spec.Drivers, func(d storagev1.CSINodeDriver) bool { return d.Name == driver })
}

// entryPatch is the next JSON patch that brings node's entry of want's
// driver to want, or nil when node has it already. Other drivers' entries
// are never part of a patch, and every patch tests what it relies on, so a
// stale copy of node makes it fail instead of writing over someone else's
// change:
//   - a missing entry is appended after a test of node's resourceVersion,
//     so it is never added twice, and an empty list is only set while it
//     is still empty;
//   - an entry whose count differs gets only its allocatable changed, after
//     a test that its index still holds the driver;
//   - an entry whose node ID or topology keys differ is removed (after the
//     same test): the API server refuses any other change of an entry than
//     its allocatable, so the entry is removed and then, by the next patch,
//     added again. Kubelet has the same order: it deregisters the driver
//     before it registers it anew. The next patch is for the node the
//     removal returned.
func entryPatch(node *storagev1.CSINode, want storagev1.CSINodeDriver) (patch []byte, removal bool) {
	i := findEntry(node, want.Name)
	if i < 0 {
		ops := []kube.JSONPatchOp{{Op: "test", Path: "/metadata/resourceVersion", Value: kube.MustJSON(node.ResourceVersion)}}
		if len(node.Spec.Drivers) == 0 {
			// The list may be null, which "add .../-" cannot append to.
			ops = append(ops, kube.JSONPatchOp{Op: "add", Path: "/spec/drivers", Value: kube.MustJSON([]storagev1.CSINodeDriver{want})})
		} else {
			ops = append(ops, kube.JSONPatchOp{Op: "add", Path: "/spec/drivers/-", Value: kube.MustJSON(want)})
		}
		return kube.MustJSON(ops), false
	}
	have := node.Spec.Drivers[i]
	if sameEntry(have, want) {
		return nil, false
	}
	path := fmt.Sprintf("/spec/drivers/%d", i)
	test := kube.JSONPatchOp{Op: "test", Path: path + "/name", Value: kube.MustJSON(want.Name)}
	withCount := have.DeepCopy()
	withCount.Allocatable = want.Allocatable
	if !sameEntry(*withCount, want) {
		return kube.MustJSON([]kube.JSONPatchOp{test, {Op: "remove", Path: path}}), true
	}
	if count(want) == nil {
		return kube.MustJSON([]kube.JSONPatchOp{test, {Op: "remove", Path: path + "/allocatable"}}), false
	}
	// "add" sets a member whether or not it exists.
	return kube.MustJSON([]kube.JSONPatchOp{test, {Op: "add", Path: path + "/allocatable", Value: kube.MustJSON(want.Allocatable)}}), false
}

// describeEntry is an entry for a log line.
func describeEntry(e *storagev1.CSINodeDriver) string {
	if e == nil {
		return "<none>"
	}
	b, err := json.Marshal(e)
	if err != nil {
		return fmt.Sprintf("%+v", *e)
	}
	return string(b)
}
