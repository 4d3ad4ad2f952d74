package controller

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/loopvol/loopvol/pkg/pool"
	"github.com/loopvol/loopvol/pkg/volspec"
	"github.com/loopvol/loopvol/pkg/volspec/volspectest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2/ktesting"
)

// fixture is a controller over real pool directories in a temp dir (no root
// needed: pools are plain files until a node attaches them).
type fixture struct {
	s     *Server
	pools map[string]*pool.Pool
	root  string
}

func newFixture(t testing.TB, zones map[string]string) *fixture {
	t.Helper()
	f := &fixture{pools: map[string]*pool.Pool{}, root: t.TempDir()}
	var list []*pool.Pool
	for name, zone := range zones {
		p, err := pool.Open(pool.Options{Name: name, Zone: zone, Path: filepath.Join(f.root, name)})
		if err != nil {
			t.Fatal(err)
		}
		f.pools[name] = p
		list = append(list, p)
	}
	s, err := New(Config{Pools: list})
	if err != nil {
		t.Fatal(err)
	}
	f.s = s
	return f
}

func (f *fixture) addNode(t testing.TB, poolName, node string, max int64) {
	t.Helper()
	if err := f.pools[poolName].WriteNode(pool.NodeRecord{ID: node, Zone: f.pools[poolName].Zone, MaxVolumes: max}); err != nil {
		t.Fatal(err)
	}
}

const (
	snw  = csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER
	mnro = csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY
	mnmw = csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER
)

func createReq(name string, size int64, caps ...*csi.VolumeCapability) *csi.CreateVolumeRequest {
	if len(caps) == 0 {
		caps = []*csi.VolumeCapability{volspectest.Mount("ext4", snw)}
	}
	return &csi.CreateVolumeRequest{Name: name, CapacityRange: &csi.CapacityRange{RequiredBytes: size}, VolumeCapabilities: caps}
}

func wantCode(t *testing.T, err error, code codes.Code) {
	t.Helper()
	if status.Code(err) != code {
		t.Fatalf("got %v (%v), want %v", status.Code(err), err, code)
	}
}

func ctx(t testing.TB) context.Context {
	_, c := ktesting.NewTestContext(t)
	return c
}

// poolFiles lists every file under the fixture root, to show that bad input
// changed nothing.
func (f *fixture) files(t *testing.T) []string {
	t.Helper()
	var out []string
	filepath.Walk(f.root, func(p string, info os.FileInfo, err error) error {
		if err == nil && !info.IsDir() {
			out = append(out, p)
		}
		return nil
	})
	return out
}

func TestCreateVolume(t *testing.T) {
	tests := []struct {
		name     string
		req      *csi.CreateVolumeRequest
		code     codes.Code
		wantSize int64
	}{
		{name: "default size when no range", req: &csi.CreateVolumeRequest{Name: "v", VolumeCapabilities: []*csi.VolumeCapability{volspectest.Mount("", snw)}}, wantSize: DefaultVolumeSize},
		{name: "rounded up to a MiB", req: createReq("v", 20*mib+1), wantSize: 21 * mib},
		{name: "raised to the ext4 minimum", req: createReq("v", 1), wantSize: 16 * mib},
		{name: "raised to the xfs minimum", req: createReq("v", mib, volspectest.Mount("xfs", snw)), wantSize: 300 * mib},
		{name: "block volumes may be small", req: createReq("v", 1, volspectest.Block(snw)), wantSize: mib},
		{name: "limit below xfs minimum", req: &csi.CreateVolumeRequest{Name: "v", CapacityRange: &csi.CapacityRange{LimitBytes: 100 * mib}, VolumeCapabilities: []*csi.VolumeCapability{volspectest.Mount("xfs", snw)}}, code: codes.OutOfRange},
		{name: "huge size", req: createReq("v", 1<<62), code: codes.OutOfRange},
		{name: "larger than the pool filesystem", req: createReq("v", 1<<49), code: codes.OutOfRange},
		{name: "negative size", req: createReq("v", -1), code: codes.InvalidArgument},
		{name: "required above limit", req: &csi.CreateVolumeRequest{Name: "v", CapacityRange: &csi.CapacityRange{RequiredBytes: 2 * gib, LimitBytes: gib}, VolumeCapabilities: []*csi.VolumeCapability{volspectest.Mount("", snw)}}, code: codes.InvalidArgument},
		{name: "no name", req: createReq("", gib), code: codes.InvalidArgument},
		{name: "10000-byte name", req: createReq(strings.Repeat("n", 10000), gib), code: codes.InvalidArgument},
		{name: "NUL in name", req: createReq("a\x00b", gib), code: codes.InvalidArgument},
		{name: "name with dots and slashes is only hashed", req: createReq("../../etc/passwd", 16*mib), wantSize: 16 * mib},
		{name: "no capabilities", req: &csi.CreateVolumeRequest{Name: "v"}, code: codes.InvalidArgument},
		{name: "unknown access mode", req: createReq("v", gib, volspectest.Mount("", csi.VolumeCapability_AccessMode_Mode(99))), code: codes.InvalidArgument},
		{name: "UNKNOWN access mode", req: createReq("v", gib, volspectest.Mount("", csi.VolumeCapability_AccessMode_UNKNOWN)), code: codes.InvalidArgument},
		{name: "no access type", req: createReq("v", gib, &csi.VolumeCapability{AccessMode: &csi.VolumeCapability_AccessMode{Mode: snw}}), code: codes.InvalidArgument},
		{name: "unsupported filesystem", req: createReq("v", gib, volspectest.Mount("btrfs", snw)), code: codes.InvalidArgument},
		{name: "multi-node writable mount", req: createReq("v", gib, volspectest.Mount("ext4", mnmw)), code: codes.InvalidArgument},
		{name: "multi-node writable block", req: createReq("v", gib, volspectest.Block(mnmw)), wantSize: gib},
		{name: "block and mount mixed", req: createReq("v", gib, volspectest.Block(snw), volspectest.Mount("", snw)), code: codes.InvalidArgument},
		{name: "unknown parameter", req: func() *csi.CreateVolumeRequest {
			r := createReq("v", gib)
			r.Parameters = map[string]string{"poool": "a"}
			return r
		}(), code: codes.InvalidArgument},
		{name: "unknown pool", req: func() *csi.CreateVolumeRequest {
			r := createReq("v", gib)
			r.Parameters = map[string]string{"pool": "nope"}
			return r
		}(), code: codes.InvalidArgument},
		{name: "content source", req: func() *csi.CreateVolumeRequest {
			r := createReq("v", gib)
			r.VolumeContentSource = &csi.VolumeContentSource{}
			return r
		}(), code: codes.InvalidArgument},
		{name: "requisite topology nobody serves", req: func() *csi.CreateVolumeRequest {
			r := createReq("v", gib)
			r.AccessibilityRequirements = &csi.TopologyRequirement{Requisite: []*csi.Topology{{Segments: map[string]string{volspec.TopologyKey: "mars"}}}}
			return r
		}(), code: codes.ResourceExhausted},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, map[string]string{"a": "z1"})
			resp, err := f.s.CreateVolume(ctx(t), tc.req)
			wantCode(t, err, tc.code)
			if tc.code != codes.OK {
				if files := f.files(t); len(files) != 1 { // only the pool marker
					t.Fatalf("bad request left files: %v", files)
				}
				return
			}
			if got := resp.GetVolume().GetCapacityBytes(); got != tc.wantSize {
				t.Fatalf("size = %d, want %d", got, tc.wantSize)
			}
			if topo := resp.GetVolume().GetAccessibleTopology(); len(topo) != 1 || topo[0].Segments[volspec.TopologyKey] != "z1" {
				t.Fatalf("topology = %v", topo)
			}
		})
	}
}

func TestCreateVolumeIsIdempotent(t *testing.T) {
	f := newFixture(t, map[string]string{"a": "z1"})
	first, err := f.s.CreateVolume(ctx(t), createReq("pvc-1", 32*mib))
	if err != nil {
		t.Fatal(err)
	}
	again, err := f.s.CreateVolume(ctx(t), createReq("pvc-1", 32*mib))
	if err != nil {
		t.Fatal(err)
	}
	if first.Volume.VolumeId != again.Volume.VolumeId || again.Volume.CapacityBytes != 32*mib {
		t.Fatalf("retry gave %v, first %v", again.Volume, first.Volume)
	}
	_, err = f.s.CreateVolume(ctx(t), createReq("pvc-1", 64*mib))
	wantCode(t, err, codes.AlreadyExists)
	_, err = f.s.CreateVolume(ctx(t), createReq("pvc-1", 32*mib, volspectest.Block(snw)))
	wantCode(t, err, codes.AlreadyExists)
}

func TestCreateVolumeTopology(t *testing.T) {
	f := newFixture(t, map[string]string{"a": "z1", "b": "z2", "c": "z3"})
	req := createReq("pvc-topo", 16*mib)
	req.AccessibilityRequirements = &csi.TopologyRequirement{
		Requisite: []*csi.Topology{{Segments: map[string]string{volspec.TopologyKey: "z2"}}, {Segments: map[string]string{volspec.TopologyKey: "z3"}}},
		Preferred: []*csi.Topology{{Segments: map[string]string{volspec.TopologyKey: "z3"}}},
	}
	resp, err := f.s.CreateVolume(ctx(t), req)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(resp.Volume.VolumeId, "c.") {
		t.Fatalf("volume %s not in the preferred pool c", resp.Volume.VolumeId)
	}
	req = createReq("pvc-param", 16*mib)
	req.Parameters = map[string]string{"pool": "b", "csi.storage.k8s.io/pv/name": "pv-1"}
	resp, err = f.s.CreateVolume(ctx(t), req)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(resp.Volume.VolumeId, "b.") || resp.Volume.VolumeContext[ContextPool] != "b" {
		t.Fatalf("volume %v not in the pool the parameter names", resp.Volume)
	}
}

func TestPublishFencing(t *testing.T) {
	f := newFixture(t, map[string]string{"a": "z1"})
	f.addNode(t, "a", "node-a", 2)
	f.addNode(t, "a", "node-b", 2)
	c := ctx(t)
	vol, err := f.s.CreateVolume(c, createReq("pvc-1", 16*mib))
	if err != nil {
		t.Fatal(err)
	}
	id := vol.Volume.VolumeId
	pub := func(node string, ro bool, cap *csi.VolumeCapability) error {
		_, err := f.s.ControllerPublishVolume(c, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: node, Readonly: ro, VolumeCapability: cap})
		return err
	}
	steps := []struct {
		name string
		call func() error
		code codes.Code
	}{
		{name: "publish to node A", call: func() error { return pub("node-a", false, volspectest.Mount("ext4", snw)) }},
		{name: "publish to node A again", call: func() error { return pub("node-a", false, volspectest.Mount("ext4", snw)) }},
		{name: "read-only re-publish is incompatible", call: func() error { return pub("node-a", true, volspectest.Mount("ext4", snw)) }, code: codes.AlreadyExists},
		{name: "single-node volume to node B", call: func() error { return pub("node-b", false, volspectest.Mount("ext4", snw)) }, code: codes.FailedPrecondition},
		{name: "unknown node", call: func() error { return pub("node-x", false, volspectest.Mount("ext4", snw)) }, code: codes.NotFound},
		{name: "node ID with a slash", call: func() error { return pub("../node-a", false, volspectest.Mount("ext4", snw)) }, code: codes.NotFound},
		{name: "as block", call: func() error { return pub("node-a", false, volspectest.Block(snw)) }, code: codes.InvalidArgument},
		{name: "widen to multi-node at publish", call: func() error { return pub("node-b", true, volspectest.Mount("ext4", mnro)) }, code: codes.InvalidArgument},
		{name: "delete while attached", call: func() error {
			_, err := f.s.DeleteVolume(c, &csi.DeleteVolumeRequest{VolumeId: id})
			return err
		}, code: codes.FailedPrecondition},
		{name: "unpublish from A", call: func() error {
			_, err := f.s.ControllerUnpublishVolume(c, &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: "node-a"})
			return err
		}},
		{name: "now node B", call: func() error { return pub("node-b", false, volspectest.Mount("ext4", snw)) }},
		{name: "unpublish from all", call: func() error {
			_, err := f.s.ControllerUnpublishVolume(c, &csi.ControllerUnpublishVolumeRequest{VolumeId: id})
			return err
		}},
		{name: "unpublish unknown volume", call: func() error {
			_, err := f.s.ControllerUnpublishVolume(c, &csi.ControllerUnpublishVolumeRequest{VolumeId: "a.0123456789abcdef0123456789abcdef", NodeId: "node-a"})
			return err
		}},
		{name: "delete", call: func() error {
			_, err := f.s.DeleteVolume(c, &csi.DeleteVolumeRequest{VolumeId: id})
			return err
		}},
		{name: "publish deleted volume", call: func() error { return pub("node-a", false, volspectest.Mount("ext4", snw)) }, code: codes.NotFound},
	}
	for _, st := range steps {
		if err := st.call(); status.Code(err) != st.code {
			t.Fatalf("%s: got %v (%v), want %v", st.name, status.Code(err), err, st.code)
		}
	}
}

func TestPublishNodeLimitAndSharing(t *testing.T) {
	f := newFixture(t, map[string]string{"a": "z1"})
	f.addNode(t, "a", "node-a", 2)
	f.addNode(t, "a", "node-b", 0)
	c := ctx(t)
	var ids []string
	for _, name := range []string{"v1", "v2", "v3"} {
		v, err := f.s.CreateVolume(c, createReq(name, 16*mib))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, v.Volume.VolumeId)
	}
	for i, id := range ids {
		_, err := f.s.ControllerPublishVolume(c, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "node-a", VolumeCapability: volspectest.Mount("", snw)})
		if i < 2 {
			wantCode(t, err, codes.OK)
		} else {
			wantCode(t, err, codes.ResourceExhausted)
		}
	}
	// Read-only sharing of a multi-reader volume; a writer is refused.
	ro, err := f.s.CreateVolume(c, createReq("shared", 16*mib, volspectest.Mount("", mnro)))
	if err != nil {
		t.Fatal(err)
	}
	for _, node := range []string{"node-b", "node-a"} {
		_, err := f.s.ControllerPublishVolume(c, &csi.ControllerPublishVolumeRequest{VolumeId: ro.Volume.VolumeId, NodeId: node, Readonly: true, VolumeCapability: volspectest.Mount("", mnro)})
		if node == "node-a" {
			wantCode(t, err, codes.ResourceExhausted) // node-a is full
		} else {
			wantCode(t, err, codes.OK)
		}
	}
	f.addNode(t, "a", "node-c", 0)
	_, err = f.s.ControllerPublishVolume(c, &csi.ControllerPublishVolumeRequest{VolumeId: ro.Volume.VolumeId, NodeId: "node-c", Readonly: false, VolumeCapability: volspectest.Mount("", mnro)})
	wantCode(t, err, codes.FailedPrecondition)
	// Multi-writer block volumes go to many nodes.
	blk, err := f.s.CreateVolume(c, createReq("blk", mib, volspectest.Block(mnmw)))
	if err != nil {
		t.Fatal(err)
	}
	for _, node := range []string{"node-b", "node-c"} {
		_, err := f.s.ControllerPublishVolume(c, &csi.ControllerPublishVolumeRequest{VolumeId: blk.Volume.VolumeId, NodeId: node, VolumeCapability: volspectest.Block(mnmw)})
		wantCode(t, err, codes.OK)
	}
	got, err := f.s.ControllerGetVolume(c, &csi.ControllerGetVolumeRequest{VolumeId: blk.Volume.VolumeId})
	if err != nil || len(got.Status.PublishedNodeIds) != 2 {
		t.Fatalf("ControllerGetVolume = %v, %v", got, err)
	}
}

func TestBadVolumeIDs(t *testing.T) {
	f := newFixture(t, map[string]string{"a": "z1"})
	f.addNode(t, "a", "node-a", 0)
	c := ctx(t)
	for _, id := range []string{"..", "a/../../etc", "a.\x00", strings.Repeat("x", 10000), "a." + strings.Repeat("0", 31) + "/", "b.0123456789abcdef0123456789abcdef"} {
		t.Run(strings.ToValidUTF8(id[:min(len(id), 20)], "?"), func(t *testing.T) {
			_, err := f.s.ControllerPublishVolume(c, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "node-a", VolumeCapability: volspectest.Mount("", snw)})
			wantCode(t, err, codes.NotFound)
			_, err = f.s.ValidateVolumeCapabilities(c, &csi.ValidateVolumeCapabilitiesRequest{VolumeId: id, VolumeCapabilities: []*csi.VolumeCapability{volspectest.Mount("", snw)}})
			wantCode(t, err, codes.NotFound)
			_, err = f.s.ControllerExpandVolume(c, &csi.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: &csi.CapacityRange{RequiredBytes: gib}})
			wantCode(t, err, codes.NotFound)
			_, err = f.s.ControllerGetVolume(c, &csi.ControllerGetVolumeRequest{VolumeId: id})
			wantCode(t, err, codes.NotFound)
			_, err = f.s.DeleteVolume(c, &csi.DeleteVolumeRequest{VolumeId: id})
			wantCode(t, err, codes.OK)
			if files := f.files(t); len(files) != 2 { // marker and node record
				t.Fatalf("files changed: %v", files)
			}
		})
	}
}

func TestListVolumesPaginates(t *testing.T) {
	f := newFixture(t, map[string]string{"a": "z1", "b": "z1"})
	f.addNode(t, "a", "n1", 0)
	c := ctx(t)
	want := map[string]bool{}
	for i := range 5 {
		r := createReq("v"+string(rune('0'+i)), 16*mib)
		r.Parameters = map[string]string{"pool": []string{"a", "b"}[i%2]}
		v, err := f.s.CreateVolume(c, r)
		if err != nil {
			t.Fatal(err)
		}
		want[v.Volume.VolumeId] = true
	}
	seen := map[string]bool{}
	token := ""
	for pages := 0; ; pages++ {
		resp, err := f.s.ListVolumes(c, &csi.ListVolumesRequest{MaxEntries: 2, StartingToken: token})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range resp.Entries {
			if seen[e.Volume.VolumeId] {
				t.Fatalf("volume %s listed twice", e.Volume.VolumeId)
			}
			seen[e.Volume.VolumeId] = true
		}
		if token = resp.NextToken; token == "" {
			break
		}
		if pages > 5 {
			t.Fatal("pagination does not end")
		}
	}
	if len(seen) != len(want) {
		t.Fatalf("listed %d volumes, want %d", len(seen), len(want))
	}
	_, err := f.s.ListVolumes(c, &csi.ListVolumesRequest{StartingToken: "garbage"})
	wantCode(t, err, codes.Aborted)
}

func TestCapacityAndExpand(t *testing.T) {
	f := newFixture(t, map[string]string{"a": "z1", "b": "z2"})
	c := ctx(t)
	all, err := f.s.GetCapacity(c, &csi.GetCapacityRequest{})
	if err != nil {
		t.Fatal(err)
	}
	one, err := f.s.GetCapacity(c, &csi.GetCapacityRequest{AccessibleTopology: &csi.Topology{Segments: map[string]string{volspec.TopologyKey: "z2"}}})
	if err != nil {
		t.Fatal(err)
	}
	// Both pools share one filesystem here, so each sees the same space,
	// give or take what other writers on it (a build beside the tests) did
	// between the two calls: all is twice one within that.
	const moved = 256 << 20
	if one.AvailableCapacity <= 0 || abs(all.AvailableCapacity-2*one.AvailableCapacity) > 2*moved || one.MaximumVolumeSize.GetValue() != one.AvailableCapacity {
		t.Fatalf("capacity all=%v zone=%v", all, one)
	}
	none, _ := f.s.GetCapacity(c, &csi.GetCapacityRequest{Parameters: map[string]string{"pool": "zz"}})
	if none.AvailableCapacity != 0 {
		t.Fatalf("unknown pool capacity %d", none.AvailableCapacity)
	}
	_, err = f.s.GetCapacity(c, &csi.GetCapacityRequest{Parameters: map[string]string{"bogus": "1"}})
	wantCode(t, err, codes.InvalidArgument)

	v, err := f.s.CreateVolume(c, createReq("grow", 16*mib))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := f.s.ControllerExpandVolume(c, &csi.ControllerExpandVolumeRequest{VolumeId: v.Volume.VolumeId, CapacityRange: &csi.CapacityRange{RequiredBytes: 40 * mib}})
	if err != nil || resp.CapacityBytes != 40*mib || !resp.NodeExpansionRequired {
		t.Fatalf("expand = %v, %v", resp, err)
	}
	_, err = f.s.ControllerExpandVolume(c, &csi.ControllerExpandVolumeRequest{VolumeId: v.Volume.VolumeId, CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 62}})
	wantCode(t, err, codes.OutOfRange)
	_, err = f.s.ControllerExpandVolume(c, &csi.ControllerExpandVolumeRequest{VolumeId: v.Volume.VolumeId})
	wantCode(t, err, codes.InvalidArgument)
}

func TestCrashLeftovers(t *testing.T) {
	f := newFixture(t, map[string]string{"a": "z1"})
	c := ctx(t)
	p := f.pools["a"]
	v, err := f.s.CreateVolume(c, createReq("broken", 16*mib))
	if err != nil {
		t.Fatal(err)
	}
	id, _ := pool.ParseVolumeID(v.Volume.VolumeId)
	// Missing image: the volume is reported as lost, not a crash.
	os.Remove(p.ImagePath(id))
	h, err := f.s.ControllerGetVolumeHealth(c, &csi.ControllerGetVolumeHealthRequest{VolumeId: id.String()})
	if err != nil || len(h.VolumeHealth.HealthStatuses) != 1 || h.VolumeHealth.HealthStatuses[0].Status != csi.VolumeHealthErrorType_DATA_LOSS {
		t.Fatalf("health with missing image = %v, %v", h, err)
	}
	// Half-written record.
	rec := filepath.Join(p.Path, "volumes", id.Hash+".json")
	os.WriteFile(rec, []byte(`{"id": "a.`), 0o600)
	h, err = f.s.ControllerGetVolumeHealth(c, &csi.ControllerGetVolumeHealthRequest{VolumeId: id.String()})
	if err != nil || h.VolumeHealth.HealthStatuses[0].Status != csi.VolumeHealthErrorType_INACCESSIBLE {
		t.Fatalf("health with corrupt record = %v, %v", h, err)
	}
	list, err := f.s.ListVolumes(c, &csi.ListVolumesRequest{})
	if err != nil || len(list.Entries) != 1 {
		t.Fatalf("ListVolumes with a corrupt record = %v, %v", list, err)
	}
	_, err = f.s.CreateVolume(c, createReq("broken", 16*mib))
	wantCode(t, err, codes.Internal)
	if _, err := f.s.DeleteVolume(c, &csi.DeleteVolumeRequest{VolumeId: id.String()}); err != nil {
		t.Fatal(err)
	}
	// A create that died between image and record is finished by its retry.
	half := pool.DeriveVolumeID("a", "half")
	os.WriteFile(p.ImagePath(half), []byte("junk"), 0o600)
	v2, err := f.s.CreateVolume(c, createReq("half", 16*mib))
	if err != nil || v2.Volume.VolumeId != half.String() || v2.Volume.CapacityBytes != 16*mib {
		t.Fatalf("retried create = %v, %v", v2, err)
	}
}

func TestBusyVolumeIsAborted(t *testing.T) {
	f := newFixture(t, map[string]string{"a": "z1"})
	c := ctx(t)
	v, err := f.s.CreateVolume(c, createReq("busy", 16*mib))
	if err != nil {
		t.Fatal(err)
	}
	id, _ := pool.ParseVolumeID(v.Volume.VolumeId)
	unlock, err := f.pools["a"].Lock(id)
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	_, err = f.s.DeleteVolume(c, &csi.DeleteVolumeRequest{VolumeId: id.String()})
	wantCode(t, err, codes.Aborted)
}

// FuzzCreateVolume feeds arbitrary names, sizes and parameters: the server
// must answer with a status (never panic) and create files only for a volume
// it reports as created. The seeds run with the normal tests.
func FuzzCreateVolume(f *testing.F) {
	f.Add("pvc-1", int64(16<<20), int64(0), "a", int32(1), false)
	f.Add("../x", int64(-1), int64(5), "../", int32(99), true)
	f.Add("\x00", int64(1<<62), int64(1), "b", int32(5), false)
	f.Add(strings.Repeat("z", 300), int64(0), int64(0), "", int32(0), true)
	f.Fuzz(func(t *testing.T, name string, required, limit int64, poolParam string, mode int32, block bool) {
		fx := newFixture(t, map[string]string{"a": "z1"})
		c := &csi.VolumeCapability{AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_Mode(mode)}}
		if block {
			c.AccessType = &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}
		} else {
			c.AccessType = &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}}
		}
		req := &csi.CreateVolumeRequest{Name: name, CapacityRange: &csi.CapacityRange{RequiredBytes: required, LimitBytes: min(limit, 1<<40)}, VolumeCapabilities: []*csi.VolumeCapability{c}}
		if required > 1<<30 { // keep real allocations small
			req.CapacityRange.RequiredBytes = 1 << 62
		}
		if poolParam != "" {
			req.Parameters = map[string]string{"pool": poolParam}
		}
		resp, err := fx.s.CreateVolume(context.Background(), req)
		if _, ok := status.FromError(err); !ok {
			t.Fatalf("non-status error %v", err)
		}
		files := fx.files(t)
		if err != nil && len(files) != 1 {
			t.Fatalf("failed create left %v", files)
		}
		if err == nil {
			for _, file := range files {
				if !strings.HasPrefix(file, fx.root+"/a/") {
					t.Fatalf("file %s outside the pool", file)
				}
			}
			if resp.Volume.CapacityBytes < required {
				t.Fatalf("created %d bytes for required %d", resp.Volume.CapacityBytes, required)
			}
		}
	})
}

func abs(n int64) int64 {
	if n < 0 {
		return -n
	}
	return n
}
