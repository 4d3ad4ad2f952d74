package controller

import (
	"context"
	"slices"
	"sort"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/loopvol/loopvol/pkg/pool"
	"github.com/loopvol/loopvol/pkg/volspec"
	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/klog/v2"
)

// Snapshots live in the pool of their source volume, beside its image:
// a reflink where the pool's filesystem has them, else a sparse copy
// (pkg/pool). A snapshot of a volume that is mounted somewhere is
// crash-consistent: the image holds what the disk held at one instant, as
// after a power cut, and the filesystem's journal recovers it when the
// restored volume is first mounted. Data still in a node's page cache is not
// in it; an application that needs more flushes (or freezes) first. Where
// the volume is mounted on the controller's own node, the controller
// freezes it for the clone (freeze.go) and the snapshot is clean.
//
// A snapshot is reachable from the zone of its pool, which it reports as
// its accessible topology (SNAPSHOT_ACCESSIBILITY_CONSTRAINTS).

// CreateSnapshot makes a snapshot of a volume.
func (s *Server) CreateSnapshot(ctx context.Context, req *csi.CreateSnapshotRequest) (*csi.CreateSnapshotResponse, error) {
	return answer(s.createSnapshot(ctx, req))
}

// DeleteSnapshot removes a snapshot.
func (s *Server) DeleteSnapshot(ctx context.Context, req *csi.DeleteSnapshotRequest) (*csi.DeleteSnapshotResponse, error) {
	return answer(s.deleteSnapshot(ctx, req))
}

// ListSnapshots lists snapshots, a page at a time.
func (s *Server) ListSnapshots(ctx context.Context, req *csi.ListSnapshotsRequest) (*csi.ListSnapshotsResponse, error) {
	return answer(s.listSnapshots(ctx, req))
}

// GetSnapshot describes one snapshot.
func (s *Server) GetSnapshot(ctx context.Context, req *csi.GetSnapshotRequest) (*csi.GetSnapshotResponse, error) {
	return answer(s.getSnapshot(ctx, req))
}

// createSnapshot: validate; lock the name in this process; lock the
// snapshot's ID in every pool (another controller process may serve them)
// and look for a snapshot of that name; lock the source volume and read it;
// then make the snapshot in the source's pool. The copy runs in the call:
// the record says ready_to_use false until the image is whole, which
// ListSnapshots shows meanwhile, and a call that finds the locks held
// answers ABORTED, so the CO retries until it gets the finished snapshot.
func (s *Server) createSnapshot(ctx context.Context, req *csi.CreateSnapshotRequest) (*csi.CreateSnapshotResponse, error) {
	if err := validateName(req.GetName()); err != nil {
		return nil, err
	}
	if req.GetSourceVolumeId() == "" {
		return nil, invalid("source_volume_id is required")
	}
	if err := validateParameters(req.GetParameters()); err != nil {
		return nil, err
	}
	home, srcID, err := s.lookup(req.GetSourceVolumeId())
	if err != nil {
		return nil, err
	}
	// A snapshot is taken in the pool its volume lives in (its image is
	// there, and a reflink needs that); snapshots taken before a move stay
	// where they were taken.
	p := home.Resident(srcID, s.peer)
	if !reachable(req.GetAccessibilityRequirements(), p) {
		return nil, volspec.Errorf(volspec.ErrNoSpace, "volume %s lives in zone %s, outside the accessibility requirements of the snapshot: its snapshot can only be there", srcID, p.Zone)
	}
	unlock, ok := s.snapNames.tryLock(req.GetName())
	if !ok {
		return nil, volspec.Errorf(volspec.ErrBusy, "a CreateSnapshot for %q is in progress", req.GetName())
	}
	defer unlock()
	names, err := s.lockSnapshotName(req.GetName())
	if err != nil {
		return nil, err
	}
	defer names.unlock()
	q, found, err := s.findSnapshotByName(req.GetName())
	if err != nil {
		return nil, err
	} else if found != nil && found.SourceVolumeID != srcID.String() {
		return nil, volspec.Errorf(volspec.ErrExists, "snapshot %q exists as %s, of volume %s", req.GetName(), found.ID, found.SourceVolumeID)
	} else if found != nil && found.ReadyToUse && (q != p || names.refused[p.Name] != nil) {
		// Taken before its volume moved: it stays in its pool. Or
		// whole in a pool that refuses writes now: read, not changed.
		return &csi.CreateSnapshotResponse{Snapshot: csiSnapshot(q, found)}, nil
	} else if err := names.refused[p.Name]; err != nil {
		// Anything else makes or removes the name's files in p.
		return nil, volspec.Errorf(volspec.ErrNoSpace, "volume %s lives in pool %s, which cannot take its snapshot now: %v", srcID, p.Name, err)
	} else if found != nil && q != p && names.refused[q.Name] != nil {
		return nil, volspec.Errorf(volspec.ErrNoSpace, "snapshot %q was half-made in pool %s, which cannot remove it now: %v", req.GetName(), q.Name, names.refused[q.Name])
	} else if found != nil && q != p {
		// Half-made before the volume moved: made again where the
		// volume is now (its snapshot lock is held in every pool).
		sid, _ := pool.ParseSnapshotID(found.ID)
		if err := q.DeleteSnapshot(sid); err != nil {
			return nil, err
		}
		found = nil
	}
	var snap *pool.Snapshot
	err = s.withVolume(srcID.String(), func(q *pool.Pool, v *pool.Volume) error {
		if q != p {
			return volspec.Errorf(volspec.ErrBusy, "volume %s moved to pool %s while the snapshot was being prepared; retry", srcID, q.Name)
		}
		logger := klog.FromContext(ctx)
		last := int64(-1)
		progress := func(done, total int64) {
			// About every 10% of the volume, at V(4).
			if pct := done * 10 / max(total, 1); pct != last {
				last = pct
				logger.V(4).Info("Copying snapshot", "snapshot", req.GetName(), "doneBytes", done, "totalBytes", total)
			}
		}
		// A snapshot that is whole already is answered as it is;
		// anything else is cloned, frozen if mounted here.
		if found == nil || !found.ReadyToUse {
			thaw, err := s.freezeSnapshotSource(ctx, p, req.GetName(), v, srcID, found == nil)
			if err != nil {
				return err
			}
			defer thaw()
			if s.beforeClone != nil {
				if err := s.beforeClone(); err != nil {
					return err
				}
			}
		}
		var err error
		snap, err = p.CreateSnapshot(ctx, req.GetName(), v, progress)
		if err == nil {
			logger.V(2).Info("Created snapshot", "snapshotID", snap.ID, "sourceVolumeID", v.ID, "method", snap.Method)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return &csi.CreateSnapshotResponse{Snapshot: csiSnapshot(p, snap)}, nil
}

// lockSnapshotName takes the snapshot lock of name in every pool, in name
// order, without waiting, as lockName does for volumes.
func (s *Server) lockSnapshotName(name string) (*nameLocks, error) {
	return s.lockInEveryPool(func(p *pool.Pool) (pool.Unlock, error) { return p.LockSnapshot(pool.DeriveSnapshotID(p.Name, name)) })
}

// findSnapshotByName looks for the snapshot called name in every pool.
func (s *Server) findSnapshotByName(name string) (*pool.Pool, *pool.Snapshot, error) {
	return findInEveryPool(s, func(p *pool.Pool) (*pool.Snapshot, error) { return p.ReadSnapshot(pool.DeriveSnapshotID(p.Name, name)) })
}

// reachable says whether the zone of pool p meets the requisite topology
// of tr (no requisite: anywhere).
func reachable(tr *csi.TopologyRequirement, p *pool.Pool) bool {
	return len(tr.GetRequisite()) == 0 ||
		slices.ContainsFunc(tr.GetRequisite(), func(t *csi.Topology) bool { return segmentMatches(t, p) })
}

func csiSnapshot(p *pool.Pool, snap *pool.Snapshot) *csi.Snapshot {
	return &csi.Snapshot{
		SnapshotId:         snap.ID,
		SourceVolumeId:     snap.SourceVolumeID,
		SizeBytes:          snap.SizeBytes,
		CreationTime:       timestamppb.New(snap.Created),
		ReadyToUse:         snap.ReadyToUse,
		AccessibleTopology: []*csi.Topology{{Segments: map[string]string{volspec.TopologyKey: p.Zone}}},
		GroupSnapshotId:    snap.Group,
	}
}

// lookupSnapshot parses a snapshot ID and finds its pool; anything unknown
// is NOT_FOUND.
func (s *Server) lookupSnapshot(snapshotID string) (*pool.Pool, pool.SnapshotID, error) {
	id, err := pool.ParseSnapshotID(snapshotID)
	if err != nil {
		return nil, id, volspec.Errorf(volspec.ErrNotFound, "snapshot %q does not exist: %w", snapshotID, err)
	}
	p, ok := s.pools[id.Pool]
	if !ok {
		return nil, id, volspec.Errorf(volspec.ErrNotFound, "snapshot %q does not exist: no pool %q", snapshotID, id.Pool)
	}
	return p, id, nil
}

// deleteSnapshot removes a snapshot; one that does not exist is deleted
// already. A volume being restored from the snapshot holds the snapshot's
// lock for the copy, so a DeleteSnapshot meanwhile answers ABORTED and the
// CO retries after the restore: by design it waits, through the CO's
// retries, rather than fail or pull the image from under the copy.
func (s *Server) deleteSnapshot(ctx context.Context, req *csi.DeleteSnapshotRequest) (*csi.DeleteSnapshotResponse, error) {
	if req.GetSnapshotId() == "" {
		return nil, invalid("snapshot_id is required")
	}
	p, id, err := s.lookupSnapshot(req.GetSnapshotId())
	if err != nil {
		return &csi.DeleteSnapshotResponse{}, nil
	}
	unlock, err := p.LockSnapshot(id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	// A member of a group snapshot goes with its group (the spec's
	// "snapshot is part of a group": INVALID_ARGUMENT).
	if snap, err := p.ReadSnapshot(id); err == nil && snap.Group != "" {
		return nil, invalid("snapshot %s is a member of group snapshot %s; delete the group (DeleteVolumeGroupSnapshot)", id, snap.Group)
	}
	if err := p.DeleteSnapshot(id); err != nil {
		return nil, err
	}
	klog.FromContext(ctx).V(2).Info("Deleted snapshot", "snapshotID", id.String())
	return &csi.DeleteSnapshotResponse{}, nil
}

// getSnapshot describes one snapshot; an unknown one is NOT_FOUND.
func (s *Server) getSnapshot(_ context.Context, req *csi.GetSnapshotRequest) (*csi.GetSnapshotResponse, error) {
	if req.GetSnapshotId() == "" {
		return nil, invalid("snapshot_id is required")
	}
	p, id, err := s.lookupSnapshot(req.GetSnapshotId())
	if err != nil {
		return nil, err
	}
	snap, err := p.ReadSnapshot(id)
	if err != nil {
		return nil, err
	}
	return &csi.GetSnapshotResponse{Snapshot: csiSnapshot(p, snap)}, nil
}

// listSnapshots lists every snapshot, or the one of snapshot_id, or those
// of source_volume_id, sorted by ID, a page at a time (the token is the
// last ID of the previous page). An ID that names nothing gives an empty
// list, as the spec asks. A record that cannot be read is left out (it is
// no snapshot anyone can restore).
func (s *Server) listSnapshots(_ context.Context, req *csi.ListSnapshotsRequest) (*csi.ListSnapshotsResponse, error) {
	if req.GetMaxEntries() < 0 {
		return nil, invalid("max_entries must not be negative")
	}
	var ids []pool.SnapshotID
	if want := req.GetSnapshotId(); want != "" {
		// An unreadable record is left out by the loop below.
		if _, id, err := s.lookupSnapshot(want); err == nil {
			ids = append(ids, id)
		}
	} else {
		for _, name := range s.poolNames {
			more, err := s.pools[name].ListSnapshotIDs()
			if err != nil {
				return nil, err
			}
			ids = append(ids, more...)
		}
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i].String() < ids[j].String() })
	var snaps []*csi.Snapshot
	for _, id := range ids {
		p := s.pools[id.Pool]
		snap, err := p.ReadSnapshot(id)
		if err != nil {
			continue
		}
		if src := req.GetSourceVolumeId(); src != "" && snap.SourceVolumeID != src {
			continue
		}
		snaps = append(snaps, csiSnapshot(p, snap))
	}
	start := 0
	if token := req.GetStartingToken(); token != "" {
		if _, err := pool.ParseSnapshotID(token); err != nil {
			return nil, volspec.Errorf(volspec.ErrBusy, "starting_token %q was not issued by loopvol", token)
		}
		start = sort.Search(len(snaps), func(i int) bool { return snaps[i].SnapshotId > token })
	}
	snaps = snaps[start:]
	resp := &csi.ListSnapshotsResponse{}
	if n := int(req.GetMaxEntries()); n > 0 && n < len(snaps) {
		snaps, resp.NextToken = snaps[:n], snaps[n-1].SnapshotId
	}
	for _, snap := range snaps {
		resp.Entries = append(resp.Entries, &csi.ListSnapshotsResponse_Entry{Snapshot: snap})
	}
	return resp, nil
}
