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

// entryPatch is the JSON patch that makes want the entry of its driver in
// node, or nil when node has it already. Other drivers' entries are never
// part of the patch:
//   - an entry of the driver at index i is replaced after a test that index
//     i still holds that driver, so a list reordered meanwhile fails the
//     patch instead of overwriting another driver's entry;
//   - a missing entry is appended after a test of node's resourceVersion,
//     so the entry is never added twice, and an empty list is only
//     replaced while it is still empty.
func entryPatch(node *storagev1.CSINode, want storagev1.CSINodeDriver) []byte {
	i := findEntry(node, want.Name)
	if i >= 0 {
		if sameEntry(node.Spec.Drivers[i], want) {
			return nil
		}
		path := fmt.Sprintf("/spec/drivers/%d", i)
		return kube.MustJSON([]kube.JSONPatchOp{
			{Op: "test", Path: path + "/name", Value: kube.MustJSON(want.Name)},
			{Op: "replace", Path: path, Value: kube.MustJSON(want)},
		})
	}
	ops := []kube.JSONPatchOp{{Op: "test", Path: "/metadata/resourceVersion", Value: kube.MustJSON(node.ResourceVersion)}}
	if len(node.Spec.Drivers) == 0 {
		// The list may be null, which "add .../-" cannot append to.
		ops = append(ops, kube.JSONPatchOp{Op: "add", Path: "/spec/drivers", Value: kube.MustJSON([]storagev1.CSINodeDriver{want})})
	} else {
		ops = append(ops, kube.JSONPatchOp{Op: "add", Path: "/spec/drivers/-", Value: kube.MustJSON(want)})
	}
	return kube.MustJSON(ops)
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
