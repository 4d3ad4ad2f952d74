package controller

import (
	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/loopvol/loopvol/pkg/pool"
	"github.com/loopvol/loopvol/pkg/volspec"
)

// source is the snapshot or volume a CreateVolume restores or clones, locked
// for the call: a snapshot being restored from cannot be deleted, a volume
// being cloned cannot change, until the copy is done.
type source struct {
	pool   *pool.Pool
	spec   pool.Source
	unlock pool.Unlock
}

func (s *source) id() string {
	if s == nil {
		return ""
	}
	return s.spec.ID
}

func (s *source) poolSource() *pool.Source {
	if s == nil {
		return nil
	}
	return &s.spec
}

// lockSource finds, locks and reads the content source of req, if it has
// one. Unknown sources are NOT_FOUND. A source whose pool lies outside the
// requisite topology is RESOURCE_EXHAUSTED, never NOT_FOUND: the volume can
// only be made where the data is, and the provisioner tries another
// topology after RESOURCE_EXHAUSTED but gives up after NOT_FOUND. The new
// volume must have the source's access type and filesystem (the data is
// that filesystem).
func (s *Server) lockSource(req *csi.CreateVolumeRequest, shape volumeShape) (*source, error) {
	cs := req.GetVolumeContentSource()
	if cs == nil {
		return nil, nil
	}
	var (
		p                  *pool.Pool
		unlock             pool.Unlock
		id                 string
		size               int64
		accessType, fsType string
		err                error
	)
	switch {
	case cs.GetSnapshot() != nil:
		var sid pool.SnapshotID
		if p, sid, err = s.lookupSnapshot(cs.GetSnapshot().GetSnapshotId()); err != nil {
			return nil, err
		}
		if unlock, err = p.LockSnapshot(sid); err != nil {
			return nil, err
		}
		snap, err := p.ReadSnapshot(sid)
		if err != nil {
			unlock()
			return nil, err
		}
		if !snap.ReadyToUse {
			unlock()
			return nil, volspec.Errorf(volspec.ErrBusy, "snapshot %s is not ready to use yet", sid)
		}
		id, size, accessType, fsType = snap.ID, snap.SizeBytes, snap.AccessType, snap.FsType
	case cs.GetVolume() != nil:
		var vid pool.VolumeID
		if p, vid, err = s.lookup(cs.GetVolume().GetVolumeId()); err != nil {
			return nil, err
		}
		if unlock, err = p.Lock(vid); err != nil {
			return nil, err
		}
		// A clone is made where its source lives (a reflink needs
		// that), also when the source was moved out of its home pool.
		q, v, err := s.settle(p, vid)
		if err != nil {
			unlock()
			return nil, err
		}
		p = q
		id, size, accessType, fsType = v.ID, v.SizeBytes, v.AccessType, v.FsType
	default:
		return nil, invalid("volume_content_source names neither a snapshot nor a volume")
	}
	fail := func(err error) (*source, error) {
		unlock()
		return nil, err
	}
	if !reachable(req.GetAccessibilityRequirements(), p) {
		return fail(volspec.Errorf(volspec.ErrNoSpace, "%s lives in pool %s of zone %s, outside the requisite topology %v: a volume from it can only be made there", id, p.Name, p.Zone, req.GetAccessibilityRequirements().GetRequisite()))
	}
	if want, ok := req.GetParameters()[ParameterPool]; ok && want != p.Name {
		return fail(invalid("parameter pool is %q, but %s lives in pool %s: a volume from it is made in its pool", want, id, p.Name))
	}
	if accessType != shape.accessType || (accessType == pool.AccessMount && fsType != shape.fsType) {
		return fail(invalid("%s is a %s; a volume made from it cannot be a %s", id, describe(accessType, fsType), describe(shape.accessType, shape.fsType)))
	}
	return &source{pool: p, spec: pool.Source{ID: id, SizeBytes: size}, unlock: unlock}, nil
}

// sourcedSize is the size of a volume made from a source of srcSize bytes:
// the source's when the request gives no size, and never below it.
func sourcedSize(r *csi.CapacityRange, size, srcSize int64) (int64, error) {
	if r.GetRequiredBytes() == 0 {
		size = srcSize
	}
	if size < srcSize {
		size = srcSize
	}
	if limit := r.GetLimitBytes(); limit > 0 && size > limit {
		return 0, outOfRange("the source is %d bytes, above limit_bytes %d: a volume made from it is at least as large", srcSize, limit)
	}
	return size, nil
}

// isSnapshotID tells a snapshot ID from a volume ID the way pkg/pool
// parses them.
func isSnapshotID(id string) bool {
	_, err := pool.ParseSnapshotID(id)
	return err == nil
}

// contentSource describes the recorded source of a volume for CSI.
func contentSource(id string) *csi.VolumeContentSource {
	switch {
	case id == "":
		return nil
	case isSnapshotID(id):
		return &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: id}}}
	default:
		return &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: id}}}
	}
}
