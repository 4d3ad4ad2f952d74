package controller

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/loopvol/loopvol/pkg/pool"
	"github.com/loopvol/loopvol/pkg/volspec"
	"k8s.io/klog/v2"
)

// createVolume makes a volume: validate, lock the name, find an existing
// volume of that name (same request → same answer, different → ALREADY_EXISTS),
// else choose a pool by topology and parameters and create the image.
func (s *Server) createVolume(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	if err := validateName(req.GetName()); err != nil {
		return nil, err
	}
	shape, err := validateCapabilities(req.GetVolumeCapabilities(), s.defaultFsType)
	if err != nil {
		return nil, err
	}
	if err := validateParameters(req.GetParameters()); err != nil {
		return nil, err
	}
	mut, err := s.parseMutable(req.GetMutableParameters())
	if err != nil {
		return nil, err
	}
	size, err := requestedSize(req.GetCapacityRange(), shape.accessType, shape.fsType)
	if err != nil {
		return nil, err
	}
	// Lock order: the source (snapshot or volume) before the new volume.
	src, err := s.lockSource(req, shape)
	if err != nil {
		return nil, err
	}
	if src != nil {
		defer src.unlock()
		if size, err = sourcedSize(req.GetCapacityRange(), size, src.spec.SizeBytes); err != nil {
			return nil, err
		}
	}
	if err := checkCreateMutable(req, mut, src); err != nil {
		return nil, err
	}
	unlock, ok := s.names.tryLock(req.GetName())
	if !ok {
		return nil, volspec.Errorf(volspec.ErrBusy, "a CreateVolume for %q is in progress", req.GetName())
	}
	defer unlock()
	// Another controller process may serve the same pools: lock the name's
	// volume in every pool, then look it up. Whatever this call then
	// decides (return the existing volume, or create one) rests on records
	// read under those locks, so two processes never both create it, and
	// an image another process returned is never replaced.
	names, err := s.lockName(req.GetName())
	if err != nil {
		return nil, err
	}
	defer names.unlock()

	logger := klog.FromContext(ctx)
	if p, v, err := s.findByName(req.GetName()); err != nil {
		return nil, err
	} else if v != nil {
		if err := compatible(p, v, req, shape, src, mut); err != nil {
			return nil, volspec.Errorf(volspec.ErrExists, "volume %q exists as %s with other properties: %v", req.GetName(), v.ID, err)
		}
		logger.V(4).Info("Volume exists already", "volumeID", v.ID)
		return &csi.CreateVolumeResponse{Volume: s.csiVolume(p, v)}, nil
	}

	var p *pool.Pool
	if src != nil {
		p = src.pool
		if err := names.refused[p.Name]; err != nil {
			return nil, volspec.Errorf(volspec.ErrNoSpace, "the source of volume %q is in pool %s, which cannot take new volumes now: %v", req.GetName(), p.Name, err)
		}
	} else if p, err = s.choosePool(req, mut.pool, size, names.refused); err != nil {
		return nil, err
	}
	// The pool re-checks the space under its pool lock, with the
	// allocation: another process may have taken it since choosePool.
	v, err := p.CreateVolume(ctx, pool.VolumeSpec{
		Name:        req.GetName(),
		SizeBytes:   size,
		AccessType:  shape.accessType,
		FsType:      shape.fsType,
		AccessModes: shape.modes,
		Parameters:  storedParameters(req.GetParameters()),
		Thin:        mut.thin != nil && *mut.thin,
		Source:      src.poolSource(),
	})
	if err != nil {
		return nil, err
	}
	logger.V(2).Info("Created volume", "volumeID", v.ID, "pool", p.Name, "sizeBytes", v.SizeBytes)
	return &csi.CreateVolumeResponse{Volume: s.csiVolume(p, v)}, nil
}

// lockName takes the volume lock of name in every pool, in name order,
// without waiting: ErrBusy (ABORTED) if any is held, by this process or
// another. One lock per pool, because the volume's ID depends on the pool
// it lands in.
func (s *Server) lockName(name string) (*nameLocks, error) {
	return s.lockInEveryPool(func(p *pool.Pool) (pool.Unlock, error) { return p.Lock(pool.DeriveVolumeID(p.Name, name)) })
}

// nameLocks are the locks of one name (volume, snapshot, group) taken in
// every pool, but for the pools in refused.
type nameLocks struct {
	held []pool.Unlock
	// refused are the pools whose filesystem refused to create the
	// name's lock file (pool.ErrUnwritable), with why: the call may read
	// what they hold of the name but must make, change or remove nothing
	// there.
	refused map[string]error
}

// unlock releases the locks, last first.
func (l *nameLocks) unlock() {
	for i := len(l.held) - 1; i >= 0; i-- {
		l.held[i]()
	}
}

// lockInEveryPool takes lock in every pool, in name order; a lock it
// cannot take releases the ones it holds and is the error, except
// pool.ErrUnwritable: such a pool is left out (nameLocks.refused), so that
// one full or broken pool does not stop the names of every other.
//
// That keeps the locks' promise, that two calls of one name never both
// create it. A call makes its object only in a pool whose lock it holds,
// and a held lock's file exists: another call opens it whatever the
// filesystem's state (pool.Lock falls back to a read-only descriptor) and
// finds it held (ErrBusy), so the two never run at once. A pool left out
// had no lock file of the name, so nobody held it, and this call makes
// nothing there. The callers still read it (findInEveryPool, findByName),
// so a name that exists there is found; a pool that cannot even be read
// (EIO) fails the call then, since the name may be there.
func (s *Server) lockInEveryPool(lock func(*pool.Pool) (pool.Unlock, error)) (*nameLocks, error) {
	l := &nameLocks{refused: map[string]error{}}
	for _, pn := range s.poolNames {
		u, err := lock(s.pools[pn])
		if errors.Is(err, pool.ErrUnwritable) {
			l.refused[pn] = err
			continue
		}
		if err != nil {
			l.unlock()
			return nil, err
		}
		l.held = append(l.held, u)
	}
	return l, nil
}

// findInEveryPool reads the record of a name in each pool, in name order,
// and returns the first pool that has one (nil without any); an error other
// than ErrNotFound ends the search.
func findInEveryPool[T any](s *Server, read func(*pool.Pool) (*T, error)) (*pool.Pool, *T, error) {
	for _, pn := range s.poolNames {
		p := s.pools[pn]
		r, err := read(p)
		if errors.Is(err, pool.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, nil, err
		}
		return p, r, nil
	}
	return nil, nil, nil
}

// findByName looks for the volume called name in every pool; the caller
// holds lockName. A corrupt record of that name is an error: we cannot tell
// whether it matches.
func (s *Server) findByName(name string) (*pool.Pool, *pool.Volume, error) {
	for _, pn := range s.poolNames {
		p := s.pools[pn]
		// locate, not settle: the name's lock files are held in every
		// pool, which a move's FinishMove would try to take again. A
		// volume with a move pending exists all the same.
		q, v, err := s.locate(p, pool.DeriveVolumeID(p.Name, name))
		if errors.Is(err, pool.ErrNotFound) || errors.Is(err, pool.ErrGuest) {
			continue // none, or one moved here from its home, found there
		}
		if err != nil {
			return nil, nil, err
		}
		return q, v, nil
	}
	return nil, nil, nil
}

// compatible says why an existing volume does not satisfy req, or nil.
func compatible(p *pool.Pool, v *pool.Volume, req *csi.CreateVolumeRequest, shape volumeShape, src *source, mut mutable) error {
	if want := src.id(); v.Source != want {
		return fmt.Errorf("it was made from %q, the request asks for %q", v.Source, want)
	}
	r := req.GetCapacityRange()
	if v.SizeBytes < r.GetRequiredBytes() {
		return fmt.Errorf("its size %d is below required_bytes %d", v.SizeBytes, r.GetRequiredBytes())
	}
	if r.GetLimitBytes() > 0 && v.SizeBytes > r.GetLimitBytes() {
		return fmt.Errorf("its size %d is above limit_bytes %d", v.SizeBytes, r.GetLimitBytes())
	}
	if v.AccessType != shape.accessType || v.FsType != shape.fsType {
		return fmt.Errorf("it is a %s, the request asks for a %s", describe(v.AccessType, v.FsType), describe(shape.accessType, shape.fsType))
	}
	if !slices.Equal(v.AccessModes, shape.modes) {
		return fmt.Errorf("its access modes are %v, the request asks for %v", v.AccessModes, shape.modes)
	}
	if v.Parameters[ParameterPool] != req.GetParameters()[ParameterPool] {
		return fmt.Errorf("its pool parameter is %q, the request gives %q", v.Parameters[ParameterPool], req.GetParameters()[ParameterPool])
	}
	if mut.pool != "" && p.Name != mut.pool {
		return fmt.Errorf("it is in pool %s, the request's mutable parameters ask for pool %s", p.Name, mut.pool)
	}
	if mut.thin != nil && v.Thin != *mut.thin {
		return fmt.Errorf("its preallocate is %t, the request's mutable parameters ask for %t", !v.Thin, !*mut.thin)
	}
	return nil
}

// choosePool picks the pool for a new volume: the "pool" parameter or
// mutable parameter (poolName) if given, else the pools in the zones of the preferred segments (in order), then of
// the requisite ones, then any; among equals the one with most space.
//
// A pool in refused cannot take new volumes (lockInEveryPool); when no
// other pool fits, the answer is RESOURCE_EXHAUSTED with its reason.
func (s *Server) choosePool(req *csi.CreateVolumeRequest, poolName string, size int64, refused map[string]error) (*pool.Pool, error) {
	candidates := s.poolNames
	if name, ok := req.GetParameters()[ParameterPool]; ok || poolName != "" {
		name = cmp.Or(name, poolName)
		if _, known := s.pools[name]; !known {
			return nil, invalid("parameter pool: no pool %q (pools: %s)", name, strings.Join(s.poolNames, ", "))
		}
		candidates = []string{name}
	}
	tr := req.GetAccessibilityRequirements()
	allowed := func(p *pool.Pool) bool {
		if len(tr.GetRequisite()) == 0 {
			return true
		}
		return slices.ContainsFunc(tr.GetRequisite(), func(t *csi.Topology) bool { return segmentMatches(t, p) })
	}
	// Ranks: preferred segments in order, then everything else allowed.
	rank := func(p *pool.Pool) int {
		for i, t := range tr.GetPreferred() {
			if segmentMatches(t, p) {
				return i
			}
		}
		return len(tr.GetPreferred())
	}
	var best *pool.Pool
	bestRank, bestAvail := 0, int64(-1)
	var total int64
	var lastErr, refusal error
	for _, name := range candidates {
		p := s.pools[name]
		if !allowed(p) {
			continue
		}
		if err := refused[name]; err != nil {
			refusal = fmt.Errorf("pool %s cannot take new volumes now: %w", name, err)
			continue
		}
		u, err := p.Usage()
		if err != nil {
			lastErr = err
			continue
		}
		total = max(total, u.TotalBytes)
		if u.AvailableBytes < size {
			continue
		}
		if r := rank(p); best == nil || r < bestRank || (r == bestRank && u.AvailableBytes > bestAvail) {
			best, bestRank, bestAvail = p, r, u.AvailableBytes
		}
	}
	switch {
	case best != nil:
		return best, nil
	case lastErr != nil:
		return nil, lastErr
	case refusal != nil:
		return nil, volspec.Errorf(volspec.ErrNoSpace, "no pool can take %d bytes: %v", size, refusal)
	case total == 0:
		return nil, volspec.Errorf(volspec.ErrNoSpace, "no pool in the accessible topology %v can hold the volume", tr.GetRequisite())
	case size > total:
		return nil, outOfRange("%d bytes is larger than any pool's filesystem (%d bytes)", size, total)
	default:
		return nil, volspec.Errorf(volspec.ErrNoSpace, "no pool has %d bytes available", size)
	}
}

// segmentMatches: a segment selects pools by zone; a segment without our key
// does not constrain the pool.
func segmentMatches(t *csi.Topology, p *pool.Pool) bool {
	zone, ok := t.GetSegments()[volspec.TopologyKey]
	return !ok || zone == p.Zone
}

// csiVolume describes a volume for a CreateVolume, ListVolumes or
// controllerGetVolume answer.
func (s *Server) csiVolume(p *pool.Pool, v *pool.Volume) *csi.Volume {
	return &csi.Volume{
		ContentSource:      contentSource(v.Source),
		VolumeId:           v.ID,
		CapacityBytes:      v.SizeBytes,
		VolumeContext:      map[string]string{ContextPool: p.Name, ContextAccessType: v.AccessType},
		AccessibleTopology: []*csi.Topology{{Segments: map[string]string{volspec.TopologyKey: p.Zone}}},
	}
}

// deleteVolume removes a volume that is attached nowhere. An unknown volume
// is already deleted: success. The record is read under the volume lock, so
// the decision holds against another controller process on the pool.
//
// A record that cannot be read says nothing of the volume's attachments:
// it may be staged and written on a node right now. The controller cannot
// see the loop devices of other nodes, only the pool's node records. So it
// deletes such a volume only when no node serves the pool at all (nothing
// can have attached it); otherwise it refuses with FAILED_PRECONDITION and
// says what to check and how to make the intent explicit (move the record
// aside, then retry): lost data is worse than a stuck delete.
func (s *Server) deleteVolume(ctx context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, invalid("volume_id is required")
	}
	p, id, err := s.lookup(req.GetVolumeId())
	if err != nil {
		// An ID we could never have made names no volume of ours.
		return &csi.DeleteVolumeResponse{}, nil
	}
	unlock, err := p.Lock(id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	logger := klog.FromContext(ctx)
	q, v, err := s.settle(p, id)
	switch {
	case errors.Is(err, pool.ErrGuest):
		// The record under this ID is of another pool's volume moved
		// here: no volume of this ID, and nothing of it to delete.
		return &csi.DeleteVolumeResponse{}, nil
	case errors.Is(err, pool.ErrNotFound):
		// Finish a delete that crashed after removing the record, or
		// clean up an image whose create never finished.
		if err := p.DeleteVolume(id); err != nil {
			return nil, err
		}
		return &csi.DeleteVolumeResponse{}, nil
	case err != nil:
		if err := unreadableDeletable(p, id, err); err != nil {
			return nil, err
		}
		logger.Error(err, "Deleting a volume whose record is unreadable: no node serves its pool, so none can have it attached")
		q = p
	case len(v.Attachments) > 0:
		return nil, volspec.Errorf(volspec.ErrPrecondition, "volume %s is still attached to %s; ControllerUnpublishVolume it first", id, nodesOf(v))
	}
	if q != p {
		// A moved volume: its files where it lives first, then the
		// forwarding record, so that a crash in between leaves a
		// forwarding record to nothing, which a retry removes (NOT_FOUND
		// above), never files that no record names.
		if err := q.DeleteVolume(id); err != nil {
			return nil, err
		}
	}
	if err := p.DeleteVolume(id); err != nil {
		return nil, err
	}
	logger.V(2).Info("Deleted volume", "pool", p.Name)
	return &csi.DeleteVolumeResponse{}, nil
}

// unreadableDeletable decides whether a volume whose record could not be
// read (readErr) may be deleted: only if no node serves its pool. Otherwise
// it returns the FAILED_PRECONDITION that tells the operator what to do.
func unreadableDeletable(p *pool.Pool, id pool.VolumeID, readErr error) error {
	nodes, err := p.ListNodes()
	if err == nil && len(nodes) == 0 {
		return nil
	}
	served := fmt.Sprintf("nodes %s serve pool %s", strings.Join(nodes, ", "), p.Name)
	if err != nil {
		served = fmt.Sprintf("the nodes of pool %s cannot be listed (%v)", p.Name, err)
	}
	record := p.Path + "/volumes/" + id.Hash + ".json"
	return volspec.Errorf(volspec.ErrPrecondition,
		"volume %s was not deleted: its record cannot be read (%v), so loopvol cannot tell whether it is attached, and %s and may have it staged. "+
			"Check on each of them that no loop device uses %s (losetup -j %s), then move the record aside (mv %s %s.unreadable) and retry: DeleteVolume then removes the image",
		id, readErr, served, p.ImagePath(id), p.ImagePath(id), record, record)
}

func nodesOf(v *pool.Volume) []string {
	var nodes []string
	for _, a := range v.Attachments {
		nodes = append(nodes, a.Node)
	}
	return nodes
}
