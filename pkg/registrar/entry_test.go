package registrar

import (
	"math"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/google/go-cmp/cmp"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

func TestDesiredEntry(t *testing.T) {
	tests := []struct {
		name        string
		info        *csi.NodeGetInfoResponse
		want        storagev1.CSINodeDriver
		wantWarning bool
		wantErr     bool
	}{
		{
			name: "limit and two topology keys → sorted keys and count",
			info: nodeInfo("id", 7, map[string]string{"b.io/z": "1", "a.io/r": "2"}),
			want: storagev1.CSINodeDriver{Name: driver, NodeID: "id", TopologyKeys: []string{"a.io/r", "b.io/z"},
				Allocatable: &storagev1.VolumeNodeResources{Count: ptr.To[int32](7)}},
		},
		{
			name: "no limit and no topology → no allocatable, empty key list",
			info: &csi.NodeGetInfoResponse{NodeId: "id"},
			want: storagev1.CSINodeDriver{Name: driver, NodeID: "id", TopologyKeys: []string{}},
		},
		{
			name: "a limit beyond int32 is cut to the largest count",
			info: nodeInfo("id", math.MaxInt32+5, nil),
			want: storagev1.CSINodeDriver{Name: driver, NodeID: "id", TopologyKeys: []string{},
				Allocatable: &storagev1.VolumeNodeResources{Count: ptr.To[int32](math.MaxInt32)}},
		},
		{
			name:        "a negative limit is ignored with a warning, as kubelet does",
			info:        nodeInfo("id", -1, nil),
			want:        storagev1.CSINodeDriver{Name: driver, NodeID: "id", TopologyKeys: []string{}},
			wantWarning: true,
		},
		{name: "no node ID → error", info: nodeInfo("", 3, nil), wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, warning, err := desiredEntry(driver, tc.info)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %t", err, tc.wantErr)
			}
			if (warning != "") != tc.wantWarning {
				t.Errorf("warning = %q, want one: %t", warning, tc.wantWarning)
			}
			if diff := cmp.Diff(tc.want, got); !tc.wantErr && diff != "" {
				t.Errorf("entry (-want +got):\n%s", diff)
			}
		})
	}
}

func TestSameEntry(t *testing.T) {
	base := storagev1.CSINodeDriver{Name: driver, NodeID: "id", TopologyKeys: []string{"a", "b"}}
	tests := []struct {
		name string
		edit func(*storagev1.CSINodeDriver)
		same bool
	}{
		{name: "identical", edit: func(*storagev1.CSINodeDriver) {}, same: true},
		{name: "keys in another order", edit: func(e *storagev1.CSINodeDriver) { e.TopologyKeys = []string{"b", "a"} }, same: true},
		{name: "allocatable without count is no limit", edit: func(e *storagev1.CSINodeDriver) { e.Allocatable = &storagev1.VolumeNodeResources{} }, same: true},
		{name: "other node ID", edit: func(e *storagev1.CSINodeDriver) { e.NodeID = "x" }},
		{name: "a key less", edit: func(e *storagev1.CSINodeDriver) { e.TopologyKeys = []string{"a"} }},
		{name: "a count", edit: func(e *storagev1.CSINodeDriver) {
			e.Allocatable = &storagev1.VolumeNodeResources{Count: ptr.To[int32](1)}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := *base.DeepCopy()
			tc.edit(&e)
			if got := sameEntry(base, e); got != tc.same {
				t.Errorf("sameEntry = %t, want %t", got, tc.same)
			}
		})
	}
}

func TestEntryPatch(t *testing.T) {
	want := storagev1.CSINodeDriver{Name: driver, NodeID: "id", TopologyKeys: []string{"k"},
		Allocatable: &storagev1.VolumeNodeResources{Count: ptr.To[int32](3)}}
	other := storagev1.CSINodeDriver{Name: "other.csi.io", NodeID: "o", TopologyKeys: []string{"o"}}
	csiNode := func(drivers ...storagev1.CSINodeDriver) *storagev1.CSINode {
		return &storagev1.CSINode{ObjectMeta: metav1.ObjectMeta{Name: testNode, ResourceVersion: "42"},
			Spec: storagev1.CSINodeSpec{Drivers: drivers}}
	}
	newCount := *want.DeepCopy()
	newCount.Allocatable.Count = ptr.To[int32](1)
	noCount := *want.DeepCopy()
	noCount.Allocatable = nil
	moved := *want.DeepCopy()
	moved.NodeID = "old-id"
	const entry = `{"name":"loopvol.csi.io","nodeID":"id","topologyKeys":["k"],"allocatable":{"count":3}}`
	tests := []struct {
		name        string
		node        *storagev1.CSINode
		want        string
		wantRemoval bool
	}{
		{name: "up to date → no patch", node: csiNode(other, want), want: ""},
		{
			name: "another count → only allocatable set, after a name test at the index",
			node: csiNode(other, newCount),
			want: `[{"op":"test","path":"/spec/drivers/1/name","value":"loopvol.csi.io"},{"op":"add","path":"/spec/drivers/1/allocatable","value":{"count":3}}]`,
		},
		{
			name: "a count where there is none → allocatable set",
			node: csiNode(noCount, other),
			want: `[{"op":"test","path":"/spec/drivers/0/name","value":"loopvol.csi.io"},{"op":"add","path":"/spec/drivers/0/allocatable","value":{"count":3}}]`,
		},
		{
			name:        "another node ID → the entry removed, to be added anew (the API allows no other way)",
			node:        csiNode(other, moved),
			want:        `[{"op":"test","path":"/spec/drivers/1/name","value":"loopvol.csi.io"},{"op":"remove","path":"/spec/drivers/1"}]`,
			wantRemoval: true,
		},
		{
			name: "no entry → appended after a resourceVersion test",
			node: csiNode(other),
			want: `[{"op":"test","path":"/metadata/resourceVersion","value":"42"},{"op":"add","path":"/spec/drivers/-","value":` + entry + `}]`,
		},
		{
			name: "empty list → the list set after a resourceVersion test",
			node: csiNode(),
			want: `[{"op":"test","path":"/metadata/resourceVersion","value":"42"},{"op":"add","path":"/spec/drivers","value":[` + entry + `]}]`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, removal := entryPatch(tc.node, want)
			if string(got) != tc.want || removal != tc.wantRemoval {
				t.Errorf("patch (removal %t)\n got %s\nwant %s (removal %t)", removal, got, tc.want, tc.wantRemoval)
			}
		})
	}
	// No limit wanted, one there: allocatable removed.
	got, _ := entryPatch(csiNode(want), noCount)
	if w := `[{"op":"test","path":"/spec/drivers/0/name","value":"loopvol.csi.io"},{"op":"remove","path":"/spec/drivers/0/allocatable"}]`; string(got) != w {
		t.Errorf("removing the count:\n got %s\nwant %s", got, w)
	}
}
