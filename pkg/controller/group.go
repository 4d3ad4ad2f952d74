package controller

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/loopvol/loopvol/pkg/pool"
	"github.com/loopvol/loopvol/pkg/volspec"
	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/klog/v2"
)

// Group snapshots (the CSI GroupController service): the snapshots of
// several volumes taken at one instant, for applications whose data spans
// volumes (a database and its log). Each member is an ordinary snapshot
// (restorable, listed, described by GetSnapshot) whose record names the
// group; the group's own record lists them. The members are write-order
// consistent: every member volume mounted on this node is frozen first,
// then all are cloned, then all are thawed (freeze.go); members mounted
// elsewhere are crash-consistent, taken with the volume locks of all
// members held, so no CSI call changes any member meanwhile.
//
// The members must live in one pool: the group's record and its members
// sit beside the volumes, and a group across pools could not be made or
// removed as one. A group spanning pools is FAILED_PRECONDITION, the
// spec's "cannot snapshot multiple volumes together".

// GroupControllerGetCapabilities lists what the GroupController service does.
func (s *Server) GroupControllerGetCapabilities(context.Context, *csi.GroupControllerGetCapabilitiesRequest) (*csi.GroupControllerGetCapabilitiesResponse, error) {
	return &csi.GroupControllerGetCapabilitiesResponse{Capabilities: []*csi.GroupControllerServiceCapability{{
		Type: &csi.GroupControllerServiceCapability_Rpc{Rpc: &csi.GroupControllerServiceCapability_RPC{
			Type: csi.GroupControllerServiceCapability_RPC_CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT,
		}},
	}}}, nil
}

// CreateVolumeGroupSnapshot snapshots several volumes together.
func (s *Server) CreateVolumeGroupSnapshot(ctx context.Context, req *csi.CreateVolumeGroupSnapshotRequest) (*csi.CreateVolumeGroupSnapshotResponse, error) {
	return answer(s.createGroup(ctx, req))
}

// DeleteVolumeGroupSnapshot removes a group snapshot and its members.
func (s *Server) DeleteVolumeGroupSnapshot(ctx context.Context, req *csi.DeleteVolumeGroupSnapshotRequest) (*csi.DeleteVolumeGroupSnapshotResponse, error) {
	return answer(s.deleteGroup(ctx, req))
}

// GetVolumeGroupSnapshot describes a group snapshot.
func (s *Server) GetVolumeGroupSnapshot(ctx context.Context, req *csi.GetVolumeGroupSnapshotRequest) (*csi.GetVolumeGroupSnapshotResponse, error) {
	return answer(s.getGroup(ctx, req))
}

// member is one volume of a group being made, locked.
type member struct {
	id  pool.VolumeID
	sid pool.SnapshotID
	v   *pool.Volume
}

// createGroup: validate; find the one pool of all sources; lock the name
// (in process, then the group's lock in every pool, as for snapshots); an
// existing whole group of that name answers the same (the same sources) or
// ALREADY_EXISTS; a half-made one is removed and made again, since its
// members were not taken at one instant. Then lock the members' snapshots
// and volumes (in ID order), write the group's record saying not ready,
// freeze, clone every member, thaw, and write the record ready. A failure
// removes what was made; a crash leaves a record that says not ready, which
// the retry or Sweep removes.
//
// Its parameters are a StorageClass's (validateParameters), and also
// "deletionPolicy" (withoutGroupClassFields).
func (s *Server) createGroup(ctx context.Context, req *csi.CreateVolumeGroupSnapshotRequest) (*csi.CreateVolumeGroupSnapshotResponse, error) {
	logger := klog.FromContext(ctx)
	name := req.GetName()
	if err := validateName(name); err != nil {
		return nil, err
	}
	if len(req.GetSourceVolumeIds()) == 0 {
		return nil, invalid("source_volume_ids are required")
	}
	if len(req.GetSourceVolumeIds()) > maxGroupMembers {
		return nil, invalid("%d source_volume_ids; a group snapshot has at most %d", len(req.GetSourceVolumeIds()), maxGroupMembers)
	}
	if err := validateParameters(withoutGroupClassFields(req.GetParameters())); err != nil {
		return nil, err
	}
	var p *pool.Pool
	members := make([]member, 0, len(req.GetSourceVolumeIds()))
	for i, vid := range req.GetSourceVolumeIds() {
		if vid == "" {
			return nil, invalid("source_volume_ids[%d] is empty", i)
		}
		home, id, err := s.lookup(vid)
		if err != nil {
			return nil, err
		}
		q := home.Resident(id, s.peer) // the pool it lives in, where its snapshot is taken
		if slices.ContainsFunc(members, func(m member) bool { return m.id == id }) {
			return nil, invalid("source_volume_ids name volume %s twice", vid)
		}
		if p != nil && q != p {
			return nil, volspec.Errorf(volspec.ErrPrecondition, "the volumes of a group snapshot must be in one pool: %s is in pool %s, %s in pool %s",
				members[0].id, p.Name, id, q.Name)
		}
		p = q
		members = append(members, member{id: id, sid: pool.DeriveSnapshotID(q.Name, pool.MemberName(name, id.String()))})
	}
	gid := pool.DeriveGroupID(p.Name, name)

	unlock, ok := s.groupNames.tryLock(name)
	if !ok {
		return nil, volspec.Errorf(volspec.ErrBusy, "a CreateVolumeGroupSnapshot for %q is in progress", name)
	}
	defer unlock()
	names, err := s.lockGroupName(name)
	if err != nil {
		return nil, err
	}
	defer names.unlock()
	q, g, err := s.findGroupByName(name)
	if err != nil {
		return nil, err
	}
	if g != nil && g.ReadyToUse {
		if q != p || !sameSet(g.SourceVolumeIDs, req.GetSourceVolumeIds()) {
			return nil, volspec.Errorf(volspec.ErrExists, "group snapshot %q exists as %s, of volumes %s", name, g.ID, strings.Join(g.SourceVolumeIDs, ", "))
		}
		return s.groupAnswer(q, g)
	}
	// What follows makes or removes the name's files in p (and q).
	if err := names.refused[p.Name]; err != nil {
		return nil, volspec.Errorf(volspec.ErrNoSpace, "the volumes of group snapshot %q live in pool %s, which cannot take it now: %v", name, p.Name, err)
	}
	if g != nil && names.refused[q.Name] != nil {
		return nil, volspec.Errorf(volspec.ErrNoSpace, "group snapshot %q was half-made in pool %s, which cannot remove it now: %v", name, q.Name, names.refused[q.Name])
	}
	if g != nil {
		// Half-made by a call that died: its members were not taken at
		// one instant. Remove it, members and all, and make it again.
		if err := s.removeGroup(q, g); err != nil {
			return nil, err
		}
		logger.V(2).Info("Removed a half-made group snapshot to make it again", "groupSnapshotID", g.ID)
	}

	// Lock order (rpc.go): the group, its members' snapshots, their volumes.
	order := slices.Clone(members)
	slices.SortFunc(order, func(a, b member) int { return strings.Compare(a.id.Hash, b.id.Hash) })
	for _, m := range order {
		u, err := p.LockSnapshot(m.sid)
		if err != nil {
			return nil, err
		}
		defer u()
	}
	for i := range order {
		home := s.pools[order[i].id.Pool]
		u, err := home.Lock(order[i].id)
		if err != nil {
			return nil, err
		}
		defer u()
		var q *pool.Pool
		if q, order[i].v, err = s.settle(home, order[i].id); err != nil {
			return nil, err
		}
		if q != p {
			return nil, volspec.Errorf(volspec.ErrBusy, "volume %s moved to pool %s while the group snapshot was being prepared; retry", order[i].id, q.Name)
		}
	}
	g = &pool.Group{ID: gid.String(), Name: name, SourceVolumeIDs: slices.Clone(req.GetSourceVolumeIds()),
		Created: time.Now().UTC().Truncate(time.Second)}
	for _, m := range members {
		g.SnapshotIDs = append(g.SnapshotIDs, m.sid.String())
	}
	if err := p.WriteGroup(g); err != nil {
		return nil, err
	}
	if err := s.cloneMembers(ctx, p, gid, name, order); err != nil {
		// No member is left behind: the spec asks that a failed create
		// leaks nothing, since the CO has no group ID to delete.
		if rmErr := p.DeleteGroup(g); rmErr != nil {
			logger.Error(rmErr, "Could not remove a group snapshot that failed; Sweep removes it later", "groupSnapshotID", g.ID)
		}
		return nil, err
	}
	// The group's time is its members' instant.
	if snap, err := p.ReadSnapshot(members[0].sid); err == nil {
		g.Created = snap.Created
	}
	g.ReadyToUse = true
	if err := p.WriteGroup(g); err != nil {
		return nil, err
	}
	logger.V(2).Info("Created group snapshot", "groupSnapshotID", g.ID, "members", len(members))
	return s.groupAnswer(p, g)
}

// maxGroupMembers bounds a group: every member is frozen at once and holds
// two locks for the call.
const maxGroupMembers = 64

// cloneMembers freezes every member mounted here, clones each and thaws
// them all, on every path.
func (s *Server) cloneMembers(ctx context.Context, p *pool.Pool, gid pool.GroupID, name string, order []member) error {
	var thaws []thawFunc
	defer func() {
		for i := len(thaws) - 1; i >= 0; i-- {
			thaws[i]()
		}
	}()
	for _, m := range order {
		thaw, err := s.freezer.freeze(ctx, p.ImagePath(m.id))
		if err != nil {
			return err
		}
		thaws = append(thaws, thaw)
	}
	if s.beforeClone != nil {
		if err := s.beforeClone(); err != nil {
			return err
		}
	}
	for _, m := range order {
		if _, err := p.CreateGroupMember(ctx, gid, pool.MemberName(name, m.id.String()), m.v, nil); err != nil {
			return err
		}
	}
	return nil
}

// lockGroupName takes the group lock of name in every pool, without
// waiting, as lockSnapshotName does.
func (s *Server) lockGroupName(name string) (*nameLocks, error) {
	return s.lockInEveryPool(func(p *pool.Pool) (pool.Unlock, error) { return p.LockGroup(pool.DeriveGroupID(p.Name, name)) })
}

// findGroupByName looks for the group snapshot called name in every pool.
func (s *Server) findGroupByName(name string) (*pool.Pool, *pool.Group, error) {
	return findInEveryPool(s, func(p *pool.Pool) (*pool.Group, error) { return p.ReadGroup(pool.DeriveGroupID(p.Name, name)) })
}

// removeGroup deletes g and its members under the members' snapshot
// locks; the caller holds the group's lock. A member being restored from
// (its lock held) makes it ABORTED.
func (s *Server) removeGroup(p *pool.Pool, g *pool.Group) error {
	for _, sid := range g.SnapshotIDs {
		id, err := pool.ParseSnapshotID(sid)
		if err != nil {
			return err
		}
		u, err := p.LockSnapshot(id)
		if err != nil {
			return err
		}
		defer u()
	}
	return p.DeleteGroup(g)
}

// groupAnswer describes a group snapshot from its members' records.
func (s *Server) groupAnswer(p *pool.Pool, g *pool.Group) (*csi.CreateVolumeGroupSnapshotResponse, error) {
	vgs, err := s.csiGroup(p, g)
	if err != nil {
		return nil, err
	}
	return &csi.CreateVolumeGroupSnapshotResponse{GroupSnapshot: vgs}, nil
}

func (s *Server) csiGroup(p *pool.Pool, g *pool.Group) (*csi.VolumeGroupSnapshot, error) {
	vgs := &csi.VolumeGroupSnapshot{GroupSnapshotId: g.ID, CreationTime: timestamppb.New(g.Created), ReadyToUse: g.ReadyToUse}
	for _, sid := range g.SnapshotIDs {
		id, err := pool.ParseSnapshotID(sid)
		if err != nil {
			return nil, err
		}
		snap, err := p.ReadSnapshot(id)
		if errors.Is(err, pool.ErrNotFound) && !g.ReadyToUse {
			continue // not made yet
		}
		if err != nil {
			return nil, volspec.Errorf(volspec.ErrPrecondition, "group snapshot %s: member %s: %w", g.ID, sid, err)
		}
		vgs.ReadyToUse = vgs.ReadyToUse && snap.ReadyToUse
		vgs.Snapshots = append(vgs.Snapshots, csiSnapshot(p, snap))
	}
	return vgs, nil
}

// lookupGroup parses a group snapshot ID and finds its pool; anything
// unknown is NOT_FOUND.
func (s *Server) lookupGroup(groupID string) (*pool.Pool, pool.GroupID, error) {
	id, err := pool.ParseGroupID(groupID)
	if err != nil {
		return nil, id, volspec.Errorf(volspec.ErrNotFound, "group snapshot %q does not exist: %w", groupID, err)
	}
	p, ok := s.pools[id.Pool]
	if !ok {
		return nil, id, volspec.Errorf(volspec.ErrNotFound, "group snapshot %q does not exist: no pool %q", groupID, id.Pool)
	}
	return p, id, nil
}

// checkMembers compares the snapshot_ids a caller sent with the group's
// (as sets; none sent is no check): a mismatch is INVALID_ARGUMENT, as the
// spec asks.
func checkMembers(g *pool.Group, ids []string) error {
	if len(ids) == 0 || sameSet(g.SnapshotIDs, ids) {
		return nil
	}
	return invalid("snapshot_ids %v do not match the members of group snapshot %s: %v", ids, g.ID, g.SnapshotIDs)
}

// sameSet says whether a and b hold the same IDs; neither repeats one.
func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// deleteGroup removes a group snapshot and its members. An unknown group is
// deleted already: success. A member being restored from (its lock held)
// makes the call ABORTED; the CO retries.
func (s *Server) deleteGroup(ctx context.Context, req *csi.DeleteVolumeGroupSnapshotRequest) (*csi.DeleteVolumeGroupSnapshotResponse, error) {
	if req.GetGroupSnapshotId() == "" {
		return nil, invalid("group_snapshot_id is required")
	}
	p, id, err := s.lookupGroup(req.GetGroupSnapshotId())
	if err != nil {
		return &csi.DeleteVolumeGroupSnapshotResponse{}, nil
	}
	unlock, err := p.LockGroup(id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	g, err := p.ReadGroup(id)
	if errors.Is(err, pool.ErrNotFound) {
		return &csi.DeleteVolumeGroupSnapshotResponse{}, nil
	}
	if err != nil {
		return nil, err
	}
	if err := checkMembers(g, req.GetSnapshotIds()); err != nil {
		return nil, err
	}
	if err := s.removeGroup(p, g); err != nil {
		return nil, err
	}
	klog.FromContext(ctx).V(2).Info("Deleted group snapshot", "groupSnapshotID", g.ID, "members", len(g.SnapshotIDs))
	return &csi.DeleteVolumeGroupSnapshotResponse{}, nil
}

// getGroup describes a group snapshot; an unknown one is NOT_FOUND.
func (s *Server) getGroup(_ context.Context, req *csi.GetVolumeGroupSnapshotRequest) (*csi.GetVolumeGroupSnapshotResponse, error) {
	if req.GetGroupSnapshotId() == "" {
		return nil, invalid("group_snapshot_id is required")
	}
	p, id, err := s.lookupGroup(req.GetGroupSnapshotId())
	if err != nil {
		return nil, err
	}
	g, err := p.ReadGroup(id)
	if err != nil {
		return nil, err
	}
	if err := checkMembers(g, req.GetSnapshotIds()); err != nil {
		return nil, err
	}
	vgs, err := s.csiGroup(p, g)
	if err != nil {
		return nil, err
	}
	return &csi.GetVolumeGroupSnapshotResponse{GroupSnapshot: vgs}, nil
}

// groupClassFieldInParameters is a VolumeGroupSnapshotClass field that the
// upstream storage e2e suite (k8s.io/kubernetes test/e2e/storage/utils
// GenerateVolumeGroupSnapshotClassSpec) also copies into the class's
// parameters, so that every group snapshot of its classes carries it. It
// is the snapshot-controller's business, nothing to the driver: taken and
// ignored, where any other unknown key is refused.
const groupClassFieldInParameters = "deletionPolicy"

// withoutGroupClassFields returns params without
// groupClassFieldInParameters.
func withoutGroupClassFields(params map[string]string) map[string]string {
	if _, ok := params[groupClassFieldInParameters]; !ok {
		return params
	}
	kept := maps.Clone(params)
	delete(kept, groupClassFieldInParameters)
	return kept
}
