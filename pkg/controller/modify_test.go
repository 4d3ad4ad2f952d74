package controller

import (
	"maps"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/loopvol/loopvol/pkg/pool"
	"github.com/loopvol/loopvol/pkg/volspec/volspectest"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
)

func allocatedBytes(t *testing.T, f *fixture, volumeID string) int64 {
	t.Helper()
	id, err := pool.ParseVolumeID(volumeID)
	if err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat(f.pools[id.Pool].ImagePath(id), &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

// extraModifyMetadata are the keys the resizer's --extra-modify-metadata
// adds to the mutable parameters.
var extraModifyMetadata = map[string]string{
	"csi.storage.k8s.io/pvc/name": "data", "csi.storage.k8s.io/pvc/namespace": "db", "csi.storage.k8s.io/pv/name": "pvc-1234",
}

func withMutable(req *csi.CreateVolumeRequest, params map[string]string) *csi.CreateVolumeRequest {
	req.MutableParameters = params
	return req
}

func TestMutableParametersAreStrict(t *testing.T) {
	f := newFixture(t, map[string]string{"fast": "z1", "slow": "z1", "far": "z2"})
	c := ctx(t)
	vol, err := f.s.CreateVolume(c, createReq("pvc-strict", 16*mib))
	if err != nil {
		t.Fatal(err)
	}
	elsewhere := "far" // a pool of another zone than the volume's
	if poolOf(t, vol.Volume.VolumeId) == "far" {
		elsewhere = "fast"
	}
	tests := []struct {
		name   string
		params map[string]string
		code   codes.Code
		// message must contain each of these.
		message []string
	}{
		{name: "unknown key → INVALID_ARGUMENT naming it", params: map[string]string{"XXX_FakeKey": "v"}, code: codes.InvalidArgument, message: []string{`"XXX_FakeKey"`, "not known"}},
		{name: "key in another case → INVALID_ARGUMENT", params: map[string]string{"Preallocate": "true"}, code: codes.InvalidArgument, message: []string{`"Preallocate"`}},
		{name: "bad preallocate value → INVALID_ARGUMENT", params: map[string]string{"preallocate": "yes"}, code: codes.InvalidArgument, message: []string{`"preallocate"`, `"yes"`}},
		{name: "unknown pool → INVALID_ARGUMENT", params: map[string]string{"pool": "nvme"}, code: codes.InvalidArgument, message: []string{`no pool "nvme"`}},
		{name: "a pool of another zone → INVALID_ARGUMENT", params: map[string]string{"pool": elsewhere}, code: codes.InvalidArgument, message: []string{"moves only within its zone"}},
		{name: "another zone's pool with preallocate → INVALID_ARGUMENT, nothing changed", params: map[string]string{"pool": elsewhere, "preallocate": "false"}, code: codes.InvalidArgument, message: []string{"moves only within its zone"}},
		{name: "io limit → INVALID_ARGUMENT with the reason", params: map[string]string{"ioLimitMiBps": "100"}, code: codes.InvalidArgument, message: []string{`"ioLimitMiBps"`, "cannot enforce"}},
		{name: "a bad key among good ones changes nothing", params: map[string]string{"preallocate": "false", "zzz": "1"}, code: codes.InvalidArgument, message: []string{`"zzz"`}},
		{name: "its own pool → OK", params: map[string]string{"pool": poolOf(t, vol.Volume.VolumeId)}, code: codes.OK},
		{name: "the names --extra-modify-metadata adds → OK, nothing changed", params: extraModifyMetadata, code: codes.OK},
		{name: "nothing → OK", params: nil, code: codes.OK},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := allocatedBytes(t, f, vol.Volume.VolumeId)
			_, err := f.s.ControllerModifyVolume(c, &csi.ControllerModifyVolumeRequest{VolumeId: vol.Volume.VolumeId, MutableParameters: tc.params})
			wantCode(t, err, tc.code)
			for _, m := range tc.message {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("message %q lacks %q", err, m)
				}
			}
			if after := allocatedBytes(t, f, vol.Volume.VolumeId); after != before {
				t.Errorf("allocation changed from %d to %d", before, after)
			}
		})
	}
	t.Run("CreateVolume refuses the same bad keys and leaves no file", func(t *testing.T) {
		files := f.files(t)
		for _, params := range []map[string]string{{"XXX_FakeKey": "XXX_FakeValue"}, {"preallocate": "TRUE"}, {"ioLimitIOPS": "10"}} {
			_, err := f.s.CreateVolume(c, withMutable(createReq("pvc-bad-mutable", 16*mib), params))
			wantCode(t, err, codes.InvalidArgument)
		}
		req := withMutable(createReq("pvc-bad-mutable", 16*mib), map[string]string{"pool": "fast"})
		req.Parameters = map[string]string{"pool": "slow"}
		_, err := f.s.CreateVolume(c, req)
		wantCode(t, err, codes.InvalidArgument)
		if after := f.files(t); !slices.Equal(files, after) {
			t.Errorf("refused creates changed the pools: %v → %v", files, after)
		}
	})
	t.Run("ModifyVolume of an unknown volume → NOT_FOUND, without one → INVALID_ARGUMENT", func(t *testing.T) {
		_, err := f.s.ControllerModifyVolume(c, &csi.ControllerModifyVolumeRequest{VolumeId: "fast.0123456789abcdef0123456789abcdef", MutableParameters: map[string]string{"preallocate": "true"}})
		wantCode(t, err, codes.NotFound)
		_, err = f.s.ControllerModifyVolume(c, &csi.ControllerModifyVolumeRequest{MutableParameters: map[string]string{"preallocate": "true"}})
		wantCode(t, err, codes.InvalidArgument)
	})
}

func poolOf(t *testing.T, volumeID string) string {
	id, err := pool.ParseVolumeID(volumeID)
	if err != nil {
		t.Fatal(err)
	}
	return id.Pool
}

func TestModifyPreallocate(t *testing.T) {
	f := newFixture(t, map[string]string{"p1": "z1"})
	c := ctx(t)
	thin := map[string]string{"preallocate": "false"}
	thick := map[string]string{"preallocate": "true"}

	// CreateVolume with preallocate false makes a thin image; a retry
	// with the same parameters answers the same volume, with others
	// ALREADY_EXISTS.
	vol, err := f.s.CreateVolume(c, withMutable(createReq("pvc-thin", 64*mib), thin))
	if err != nil {
		t.Fatal(err)
	}
	id := vol.Volume.VolumeId
	if a := allocatedBytes(t, f, id); a != 0 {
		t.Fatalf("a thin volume has %d bytes allocated", a)
	}
	if _, err := f.s.CreateVolume(c, withMutable(createReq("pvc-thin", 64*mib), thin)); err != nil {
		t.Fatalf("retried CreateVolume: %v", err)
	}
	_, err = f.s.CreateVolume(c, withMutable(createReq("pvc-thin", 64*mib), thick))
	wantCode(t, err, codes.AlreadyExists)

	// Thin → thick, twice (the second is a no-op), while attached.
	f.addNode(t, "p1", "n1", 0)
	if _, err := f.s.ControllerPublishVolume(c, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "n1", VolumeCapability: volspectest.Mount("ext4", snw)}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := f.s.ControllerModifyVolume(c, &csi.ControllerModifyVolumeRequest{VolumeId: id, MutableParameters: thick}); err != nil {
			t.Fatal(err)
		}
		if a := allocatedBytes(t, f, id); a < 64*mib {
			t.Fatalf("a thickened volume has %d bytes allocated", a)
		}
	}
	// Thick → thin while attached: FAILED_PRECONDITION (retried by the
	// resizer), nothing changed; after the detach it is done.
	_, err = f.s.ControllerModifyVolume(c, &csi.ControllerModifyVolumeRequest{VolumeId: id, MutableParameters: thin})
	wantCode(t, err, codes.FailedPrecondition)
	if a := allocatedBytes(t, f, id); a < 64*mib {
		t.Fatalf("a refused thinning freed blocks: %d allocated", a)
	}
	if _, err := f.s.ControllerUnpublishVolume(c, &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: "n1"}); err != nil {
		t.Fatal(err)
	}
	// With the names --extra-modify-metadata adds: applied the same.
	withNames := maps.Clone(thin)
	maps.Copy(withNames, extraModifyMetadata)
	if _, err := f.s.ControllerModifyVolume(c, &csi.ControllerModifyVolumeRequest{VolumeId: id, MutableParameters: withNames}); err != nil {
		t.Fatal(err)
	}
	if a := allocatedBytes(t, f, id); a != 0 {
		t.Fatalf("a thinned volume has %d bytes allocated", a)
	}
	p, vid, _ := f.s.lookup(id)
	v, err := p.ReadVolume(vid)
	if err != nil {
		t.Fatal(err)
	}
	if !v.Thin || v.Modifying != nil {
		t.Fatalf("record: thin %v, modifying %v", v.Thin, v.Modifying)
	}
}

func TestModifyVolumeCapability(t *testing.T) {
	f := newFixture(t, map[string]string{"p1": "z1"})
	resp, err := f.s.ControllerGetCapabilities(ctx(t), &csi.ControllerGetCapabilitiesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(resp.Capabilities, func(c *csi.ControllerServiceCapability) bool {
		return c.GetRpc().GetType() == csi.ControllerServiceCapability_RPC_MODIFY_VOLUME
	}) {
		t.Fatal("MODIFY_VOLUME is not offered")
	}
}

// A modify that died half-way is reported by ControllerGetVolumeHealth
// until a retry finishes it; a truncated image is data loss.
func TestHealthOfModifyAndTruncation(t *testing.T) {
	f := newFixture(t, map[string]string{"p1": "z1"})
	c := ctx(t)
	vol, err := f.s.CreateVolume(c, createReq("pvc-health", 16*mib))
	if err != nil {
		t.Fatal(err)
	}
	p, id, _ := f.s.lookup(vol.Volume.VolumeId)
	v, err := p.ReadVolume(id)
	if err != nil {
		t.Fatal(err)
	}
	v.Modifying = map[string]string{"preallocate": "false"}
	if err := p.WriteVolume(v); err != nil {
		t.Fatal(err)
	}
	reasons := func() []string {
		h, err := f.s.ControllerGetVolumeHealth(c, &csi.ControllerGetVolumeHealthRequest{VolumeId: vol.Volume.VolumeId})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range h.VolumeHealth.HealthStatuses {
			out = append(out, e.Status.String()+"/"+e.Reason)
		}
		return out
	}
	if got := reasons(); !slices.Equal(got, []string{"DEGRADED/ModifyPending"}) {
		t.Fatalf("health after a half-done modify: %v", got)
	}
	if _, err := f.s.ControllerModifyVolume(c, &csi.ControllerModifyVolumeRequest{VolumeId: vol.Volume.VolumeId, MutableParameters: map[string]string{"preallocate": "false"}}); err != nil {
		t.Fatal(err)
	}
	if got := reasons(); len(got) != 0 {
		t.Fatalf("health after the retried modify: %v", got)
	}
	if err := os.Truncate(p.ImagePath(id), 4*mib); err != nil {
		t.Fatal(err)
	}
	if got := reasons(); !slices.Equal(got, []string{"DATA_LOSS/ImageTruncated"}) {
		t.Fatalf("health of a truncated image: %v", got)
	}
}
