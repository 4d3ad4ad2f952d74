package controller

import (
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/loopvol/loopvol/pkg/pool"
	"github.com/loopvol/loopvol/pkg/volspec"
	"github.com/loopvol/loopvol/pkg/volspec/volspectest"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
)

func zone(z string) *csi.Topology {
	return &csi.Topology{Segments: map[string]string{volspec.TopologyKey: z}}
}

func snapReq(name, source string) *csi.CreateSnapshotRequest {
	return &csi.CreateSnapshotRequest{Name: name, SourceVolumeId: source}
}

func fromSnapshot(req *csi.CreateVolumeRequest, id string) *csi.CreateVolumeRequest {
	req.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
		Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: id}}}
	return req
}

// The snapshot reports the zone of its pool, which is one of the requisite
// ones (the check csi-sanity's topology spec means to make); a restore
// asked for elsewhere is RESOURCE_EXHAUSTED, never NOT_FOUND.
func TestSnapshotTopology(t *testing.T) {
	f := newFixture(t, map[string]string{"a": "z1", "b": "z2"})
	c := ctx(t)
	vol, err := f.s.CreateVolume(c, createReq("v", 16<<20))
	if err != nil {
		t.Fatal(err)
	}
	volZone := vol.GetVolume().GetAccessibleTopology()[0]
	req := snapReq("s", vol.GetVolume().GetVolumeId())
	req.AccessibilityRequirements = &csi.TopologyRequirement{Requisite: []*csi.Topology{volZone}, Preferred: []*csi.Topology{volZone}}
	snap, err := f.s.CreateSnapshot(c, req)
	if err != nil {
		t.Fatal(err)
	}
	topo := snap.GetSnapshot().GetAccessibleTopology()
	if len(topo) != 1 || !proto.Equal(topo[0], volZone) {
		t.Fatalf("snapshot topology %v, want %v", topo, volZone)
	}
	otherZone := "z1"
	if volZone.GetSegments()[volspec.TopologyKey] == "z1" {
		otherZone = "z2"
	}
	req2 := snapReq("s2", vol.GetVolume().GetVolumeId())
	req2.AccessibilityRequirements = &csi.TopologyRequirement{Requisite: []*csi.Topology{zone(otherZone)}}
	_, err = f.s.CreateSnapshot(c, req2)
	wantCode(t, err, codes.ResourceExhausted)

	restore := fromSnapshot(createReq("r", 0), snap.GetSnapshot().GetSnapshotId())
	restore.AccessibilityRequirements = &csi.TopologyRequirement{Requisite: []*csi.Topology{zone(otherZone)}}
	_, err = f.s.CreateVolume(c, restore)
	wantCode(t, err, codes.ResourceExhausted)

	restore.AccessibilityRequirements = &csi.TopologyRequirement{Requisite: []*csi.Topology{volZone}}
	r, err := f.s.CreateVolume(c, restore)
	if err != nil {
		t.Fatal(err)
	}
	if r.GetVolume().GetCapacityBytes() != vol.GetVolume().GetCapacityBytes() ||
		r.GetVolume().GetContentSource().GetSnapshot().GetSnapshotId() != snap.GetSnapshot().GetSnapshotId() {
		t.Fatalf("restored volume %v", r.GetVolume())
	}
	_, err = f.s.CreateVolume(c, fromSnapshot(createReq("r2", 0), "a.snap-"+pool.DeriveVolumeID("a", "nope").Hash))
	wantCode(t, err, codes.NotFound)
}

func TestSnapshotLifecycle(t *testing.T) {
	f := newFixture(t, map[string]string{"a": "z1"})
	c := ctx(t)
	vol, err := f.s.CreateVolume(c, createReq("v", 16<<20))
	if err != nil {
		t.Fatal(err)
	}
	vid := vol.GetVolume().GetVolumeId()
	var ids []string
	for _, name := range []string{"s1", "s2", "s3"} {
		s, err := f.s.CreateSnapshot(c, snapReq(name, vid))
		if err != nil {
			t.Fatal(err)
		}
		if !s.GetSnapshot().GetReadyToUse() || s.GetSnapshot().GetSnapshotId() == vid {
			t.Fatalf("snapshot %v", s.GetSnapshot())
		}
		ids = append(ids, s.GetSnapshot().GetSnapshotId())
	}
	// Same name, other source: ALREADY_EXISTS.
	other, err := f.s.CreateVolume(c, createReq("other", 16<<20))
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.s.CreateSnapshot(c, snapReq("s1", other.GetVolume().GetVolumeId()))
	wantCode(t, err, codes.AlreadyExists)
	_, err = f.s.CreateSnapshot(c, snapReq("s9", "a."+pool.DeriveVolumeID("a", "nope").Hash))
	wantCode(t, err, codes.NotFound)

	// Pagination over the three.
	var seen []string
	token := ""
	for {
		resp, err := f.s.ListSnapshots(c, &csi.ListSnapshotsRequest{MaxEntries: 2, StartingToken: token})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range resp.GetEntries() {
			seen = append(seen, e.GetSnapshot().GetSnapshotId())
		}
		if token = resp.GetNextToken(); token == "" {
			break
		}
	}
	if len(seen) != 3 {
		t.Fatalf("listed %v, want the three of %v", seen, ids)
	}
	resp, err := f.s.ListSnapshots(c, &csi.ListSnapshotsRequest{SourceVolumeId: other.GetVolume().GetVolumeId()})
	if err != nil || len(resp.GetEntries()) != 0 {
		t.Fatalf("snapshots of the other volume: %v, %v", resp, err)
	}
	resp, err = f.s.ListSnapshots(c, &csi.ListSnapshotsRequest{SnapshotId: ids[1]})
	if err != nil || len(resp.GetEntries()) != 1 || resp.GetEntries()[0].GetSnapshot().GetSnapshotId() != ids[1] {
		t.Fatalf("snapshot by ID: %v, %v", resp, err)
	}
	// A volume ID is no snapshot ID.
	_, err = f.s.GetSnapshot(c, &csi.GetSnapshotRequest{SnapshotId: vid})
	wantCode(t, err, codes.NotFound)

	// The source volume goes; its snapshots stay and restore.
	if _, err := f.s.DeleteVolume(c, &csi.DeleteVolumeRequest{VolumeId: vid}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.s.GetSnapshot(c, &csi.GetSnapshotRequest{SnapshotId: ids[0]}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.s.CreateVolume(c, fromSnapshot(createReq("restored", 32<<20), ids[0])); err != nil {
		t.Fatal(err)
	}
	// Smaller than the source: OUT_OF_RANGE when the limit forbids its size.
	small := fromSnapshot(createReq("small", 0), ids[0])
	small.CapacityRange = &csi.CapacityRange{LimitBytes: 8 << 20}
	_, err = f.s.CreateVolume(c, small)
	wantCode(t, err, codes.OutOfRange)
	// Another filesystem than the source's: INVALID_ARGUMENT.
	_, err = f.s.CreateVolume(c, fromSnapshot(createReq("xfs", 400<<20, volspectest.Mount("xfs", snw)), ids[0]))
	wantCode(t, err, codes.InvalidArgument)

	for _, id := range ids {
		if _, err := f.s.DeleteSnapshot(c, &csi.DeleteSnapshotRequest{SnapshotId: id}); err != nil {
			t.Fatal(err)
		}
		if _, err := f.s.DeleteSnapshot(c, &csi.DeleteSnapshotRequest{SnapshotId: id}); err != nil {
			t.Fatalf("second delete: %v", err)
		}
	}
	_, err = f.s.GetSnapshot(c, &csi.GetSnapshotRequest{SnapshotId: ids[0]})
	wantCode(t, err, codes.NotFound)
}

func TestCloneVolume(t *testing.T) {
	f := newFixture(t, map[string]string{"a": "z1"})
	c := ctx(t)
	vol, err := f.s.CreateVolume(c, createReq("v", 16<<20))
	if err != nil {
		t.Fatal(err)
	}
	req := createReq("clone", 32<<20)
	req.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{
		Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: vol.GetVolume().GetVolumeId()}}}
	clone, err := f.s.CreateVolume(c, req)
	if err != nil {
		t.Fatal(err)
	}
	if clone.GetVolume().GetCapacityBytes() != 32<<20 || clone.GetVolume().GetContentSource().GetVolume().GetVolumeId() != vol.GetVolume().GetVolumeId() {
		t.Fatalf("clone %v", clone.GetVolume())
	}
	// The same name without the source is another volume: ALREADY_EXISTS.
	_, err = f.s.CreateVolume(c, createReq("clone", 32<<20))
	wantCode(t, err, codes.AlreadyExists)
	if again, err := f.s.CreateVolume(c, req); err != nil || again.GetVolume().GetVolumeId() != clone.GetVolume().GetVolumeId() {
		t.Fatalf("repeated clone: %v, %v", again, err)
	}
}
