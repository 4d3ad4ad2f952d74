package controller

import (
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/loopvol/loopvol/pkg/pool"
	"github.com/loopvol/loopvol/pkg/volspec/volspectest"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
)

func groupReq(name string, ids ...string) *csi.CreateVolumeGroupSnapshotRequest {
	return &csi.CreateVolumeGroupSnapshotRequest{Name: name, SourceVolumeIds: ids}
}

func withGroupParameters(req *csi.CreateVolumeGroupSnapshotRequest, params map[string]string) *csi.CreateVolumeGroupSnapshotRequest {
	req.Parameters = params
	return req
}

// volumes creates n volumes in the fixture's pool poolName.
func (f *fixture) volumes(t *testing.T, poolName, prefix string, n int) []string {
	t.Helper()
	var ids []string
	for i := range n {
		req := createReq(prefix+string(rune('a'+i)), 4*mib, volspectest.Block(snw))
		req.Parameters = map[string]string{"pool": poolName}
		resp, err := f.s.CreateVolume(ctx(t), req)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, resp.Volume.VolumeId)
	}
	return ids
}

func TestGroupSnapshotLifecycle(t *testing.T) {
	f := newFixture(t, map[string]string{"p1": "z1", "p2": "z1"})
	c := ctx(t)
	vols := f.volumes(t, "p1", "pvc-", 3)
	before := f.files(t)

	resp, err := f.s.CreateVolumeGroupSnapshot(c, groupReq("group-1", vols...))
	if err != nil {
		t.Fatal(err)
	}
	g := resp.GroupSnapshot
	if !g.ReadyToUse || len(g.Snapshots) != 3 || g.CreationTime == nil {
		t.Fatalf("group snapshot %v", g)
	}
	var members []string
	for i, s := range g.Snapshots {
		if s.GroupSnapshotId != g.GroupSnapshotId || s.SourceVolumeId != vols[i] || !s.ReadyToUse {
			t.Errorf("member %d: %v", i, s)
		}
		members = append(members, s.SnapshotId)
	}

	t.Run("retry → the same group", func(t *testing.T) {
		req := groupReq("group-1", vols[2], vols[0], vols[1])
		// As the upstream e2e suite's classes send it: taken, ignored.
		req.Parameters = map[string]string{"deletionPolicy": "Delete"}
		again, err := f.s.CreateVolumeGroupSnapshot(c, req)
		if err != nil {
			t.Fatal(err)
		}
		if again.GroupSnapshot.GroupSnapshotId != g.GroupSnapshotId || !again.GroupSnapshot.CreationTime.AsTime().Equal(g.CreationTime.AsTime()) {
			t.Errorf("retry answered %v, first %v", again.GroupSnapshot, g)
		}
	})
	t.Run("bad requests", func(t *testing.T) {
		other := f.volumes(t, "p2", "pvc-other-", 1)
		for _, tc := range []struct {
			name string
			req  *csi.CreateVolumeGroupSnapshotRequest
			code codes.Code
		}{
			{name: "same name, other volumes → ALREADY_EXISTS", req: groupReq("group-1", vols[0]), code: codes.AlreadyExists},
			{name: "no name → INVALID_ARGUMENT", req: groupReq("", vols...), code: codes.InvalidArgument},
			{name: "no volumes → INVALID_ARGUMENT", req: groupReq("group-2"), code: codes.InvalidArgument},
			{name: "a volume twice → INVALID_ARGUMENT", req: groupReq("group-2", vols[0], vols[0]), code: codes.InvalidArgument},
			{name: "unknown volume → NOT_FOUND", req: groupReq("group-2", vols[0], "p1.0123456789abcdef0123456789abcdef"), code: codes.NotFound},
			{name: "volumes of two pools → FAILED_PRECONDITION", req: groupReq("group-2", vols[0], other[0]), code: codes.FailedPrecondition},
			{name: "unknown parameter → INVALID_ARGUMENT", req: withGroupParameters(groupReq("group-2", vols...), map[string]string{"deletionPolicy": "Delete", "consistency": "app"}), code: codes.InvalidArgument},
		} {
			t.Run(tc.name, func(t *testing.T) {
				_, err := f.s.CreateVolumeGroupSnapshot(c, tc.req)
				wantCode(t, err, tc.code)
			})
		}
	})
	t.Run("members are snapshots, deleted only with their group", func(t *testing.T) {
		got, err := f.s.GetSnapshot(c, &csi.GetSnapshotRequest{SnapshotId: members[1]})
		if err != nil || got.Snapshot.GroupSnapshotId != g.GroupSnapshotId {
			t.Fatalf("GetSnapshot of a member: %v, %v", got, err)
		}
		list, err := f.s.ListSnapshots(c, &csi.ListSnapshotsRequest{SourceVolumeId: vols[0]})
		if err != nil || len(list.Entries) != 1 || list.Entries[0].Snapshot.SnapshotId != members[0] {
			t.Fatalf("ListSnapshots by a member's source: %v, %v", list, err)
		}
		_, err = f.s.DeleteSnapshot(c, &csi.DeleteSnapshotRequest{SnapshotId: members[0]})
		wantCode(t, err, codes.InvalidArgument)
		restored, err := f.s.CreateVolume(c, fromSnapshot(createReq("pvc-restored", 4*mib, volspectest.Block(snw)), members[2]))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.s.DeleteVolume(c, &csi.DeleteVolumeRequest{VolumeId: restored.Volume.VolumeId}); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("GetVolumeGroupSnapshot", func(t *testing.T) {
		got, err := f.s.GetVolumeGroupSnapshot(c, &csi.GetVolumeGroupSnapshotRequest{GroupSnapshotId: g.GroupSnapshotId, SnapshotIds: members})
		if err != nil || got.GroupSnapshot.GroupSnapshotId != g.GroupSnapshotId || len(got.GroupSnapshot.Snapshots) != 3 {
			t.Fatalf("GetVolumeGroupSnapshot: %v, %v", got, err)
		}
		_, err = f.s.GetVolumeGroupSnapshot(c, &csi.GetVolumeGroupSnapshotRequest{GroupSnapshotId: g.GroupSnapshotId, SnapshotIds: members[:2]})
		wantCode(t, err, codes.InvalidArgument)
		_, err = f.s.GetVolumeGroupSnapshot(c, &csi.GetVolumeGroupSnapshotRequest{GroupSnapshotId: "p1.group-0123456789abcdef0123456789abcdef"})
		wantCode(t, err, codes.NotFound)
		_, err = f.s.GetVolumeGroupSnapshot(c, &csi.GetVolumeGroupSnapshotRequest{GroupSnapshotId: members[0]})
		wantCode(t, err, codes.NotFound)
		_, err = f.s.GetVolumeGroupSnapshot(c, &csi.GetVolumeGroupSnapshotRequest{})
		wantCode(t, err, codes.InvalidArgument)
	})
	t.Run("delete", func(t *testing.T) {
		_, err := f.s.DeleteVolumeGroupSnapshot(c, &csi.DeleteVolumeGroupSnapshotRequest{GroupSnapshotId: g.GroupSnapshotId, SnapshotIds: members[1:]})
		wantCode(t, err, codes.InvalidArgument)
		for range 2 { // the second finds nothing: success
			if _, err := f.s.DeleteVolumeGroupSnapshot(c, &csi.DeleteVolumeGroupSnapshotRequest{GroupSnapshotId: g.GroupSnapshotId, SnapshotIds: members}); err != nil {
				t.Fatal(err)
			}
		}
		if after := f.files(t); !slices.Equal(f.without(before, "p2"), f.without(after, "p2")) {
			t.Errorf("files after the delete: %v, before the group: %v", after, before)
		}
		_, err = f.s.DeleteVolumeGroupSnapshot(c, &csi.DeleteVolumeGroupSnapshotRequest{})
		wantCode(t, err, codes.InvalidArgument)
		if _, err := f.s.DeleteVolumeGroupSnapshot(c, &csi.DeleteVolumeGroupSnapshotRequest{GroupSnapshotId: "not-a-group"}); err != nil {
			t.Fatalf("delete of an ID we never made: %v", err)
		}
	})
}

// without drops the files of one pool.
func (f *fixture) without(files []string, poolName string) []string {
	var out []string
	for _, file := range files {
		if !strings.HasPrefix(file, filepath.Join(f.root, poolName)+"/") {
			out = append(out, file)
		}
	}
	return out
}

// A failure half-way leaves nothing: no record, no member.
func TestGroupSnapshotFailureLeavesNothing(t *testing.T) {
	f := newFixture(t, map[string]string{"p1": "z1"})
	c := ctx(t)
	vols := f.volumes(t, "p1", "pvc-", 3)
	before := f.files(t)
	f.s.beforeClone = func() error { return errors.New("injected failure") }
	_, err := f.s.CreateVolumeGroupSnapshot(c, groupReq("group-fail", vols...))
	wantCode(t, err, codes.Internal)
	if after := f.files(t); !slices.Equal(before, after) {
		t.Errorf("a failed group snapshot left %v (before: %v)", after, before)
	}
}

// What a crash leaves (a record saying not ready, some members made at
// another instant) is made again by the retry, and removed by Sweep when
// nobody retries.
func TestGroupSnapshotCrash(t *testing.T) {
	f := newFixture(t, map[string]string{"p1": "z1"})
	c := ctx(t)
	p := f.pools["p1"]
	vols := f.volumes(t, "p1", "pvc-", 2)
	before := f.files(t)
	halfMade := func(name string) (pool.GroupID, pool.SnapshotID) {
		gid := pool.DeriveGroupID("p1", name)
		unlock, err := p.LockGroup(gid)
		if err != nil {
			t.Fatal(err)
		}
		defer unlock()
		g := &pool.Group{ID: gid.String(), Name: name, SourceVolumeIDs: vols}
		var first pool.SnapshotID
		for i, v := range vols {
			sid := pool.DeriveSnapshotID("p1", pool.MemberName(name, v))
			g.SnapshotIDs = append(g.SnapshotIDs, sid.String())
			if i == 0 {
				first = sid
			}
		}
		if err := p.WriteGroup(g); err != nil {
			t.Fatal(err)
		}
		// The first member was made, the second not.
		vid, _ := pool.ParseVolumeID(vols[0])
		v, err := p.ReadVolume(vid)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.CreateGroupMember(t.Context(), gid, pool.MemberName(name, vols[0]), v, nil); err != nil {
			t.Fatal(err)
		}
		return gid, first
	}

	_, first := halfMade("group-retried")
	inode := func() uint64 {
		var st unix.Stat_t
		if err := unix.Stat(p.SnapshotImagePath(first), &st); err != nil {
			t.Fatal(err)
		}
		return st.Ino
	}
	old := inode()
	resp, err := f.s.CreateVolumeGroupSnapshot(c, groupReq("group-retried", vols...))
	if err != nil {
		t.Fatal(err)
	}
	if !resp.GroupSnapshot.ReadyToUse || len(resp.GroupSnapshot.Snapshots) != 2 {
		t.Fatalf("retried group: %v", resp.GroupSnapshot)
	}
	if inode() == old {
		t.Error("the member the crashed call made was kept; it must be made again, at one instant with the others")
	}
	if _, err := f.s.DeleteVolumeGroupSnapshot(c, &csi.DeleteVolumeGroupSnapshotRequest{GroupSnapshotId: resp.GroupSnapshot.GroupSnapshotId}); err != nil {
		t.Fatal(err)
	}

	gid, _ := halfMade("group-abandoned")
	r, err := p.Sweep(time.Now().Add(time.Hour), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(r.UnfinishedGroups, gid) {
		t.Errorf("Sweep removed groups %v, want %v", r.UnfinishedGroups, gid)
	}
	if after := f.files(t); !slices.Equal(before, after) {
		t.Errorf("after the retry, the delete and the sweep: %v (before: %v)", after, before)
	}
}

func TestGroupControllerCapabilities(t *testing.T) {
	f := newFixture(t, map[string]string{"p1": "z1"})
	resp, err := f.s.GroupControllerGetCapabilities(ctx(t), &csi.GroupControllerGetCapabilitiesRequest{})
	if err != nil || len(resp.Capabilities) != 1 ||
		resp.Capabilities[0].GetRpc().GetType() != csi.GroupControllerServiceCapability_RPC_CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT {
		t.Fatalf("capabilities %v, %v", resp, err)
	}
	id := NewIdentity("loopvol.csi.io", "test", true, nil)
	caps, err := id.GetPluginCapabilities(ctx(t), &csi.GetPluginCapabilitiesRequest{})
	if err != nil || !slices.ContainsFunc(caps.Capabilities, func(c *csi.PluginCapability) bool {
		return c.GetService().GetType() == csi.PluginCapability_Service_GROUP_CONTROLLER_SERVICE
	}) {
		t.Fatalf("plugin capabilities %v, %v: want GROUP_CONTROLLER_SERVICE", caps, err)
	}
}
