package controller

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/loopvol/loopvol/pkg/loop"
	"github.com/loopvol/loopvol/pkg/pool"
	"github.com/loopvol/loopvol/pkg/volspec"
)

// Volume context and publish context keys.
const (
	ContextPool       = "loopvol.csi.io/pool"
	ContextAccessType = "loopvol.csi.io/access-type"
	ContextNode       = "loopvol.csi.io/node"
	ContextReadOnly   = "loopvol.csi.io/readonly"
	ParameterPool     = "pool"
)

// Config configures the Controller service.
type Config struct {
	// Pools are every pool of every zone the controller manages.
	Pools []*pool.Pool
	// DefaultFsType is used when a mount capability names none.
	DefaultFsType string
	// OrphanGrace is the age past which Sweep reclaims an orphan image
	// that holds no data; 0 means pool.DefaultOrphanGrace.
	OrphanGrace time.Duration
	// SweepInterval is the time between sweeps after the first; 0 means
	// DefaultSweepInterval.
	SweepInterval time.Duration
	// Loop, if set, finds the loop device of a volume being snapshotted,
	// so that a filesystem mounted on this node is frozen for the clone
	// (freeze.go). Without it every snapshot is crash-consistent.
	Loop loop.Interface
	// MountInfo is the mount table the freeze reads; "" means
	// /proc/self/mountinfo.
	MountInfo string
}

// DefaultSweepInterval is how often Start sweeps the pools: leftovers only
// cost space, and an orphan waits out its grace (15 minutes) anyway.
const DefaultSweepInterval = 10 * time.Minute

// Server is the CSI Controller service.
type Server struct {
	csi.UnimplementedControllerServer
	csi.UnimplementedGroupControllerServer
	pools         map[string]*pool.Pool
	poolNames     []string // sorted, for stable choices and listings
	defaultFsType string

	// names serialises CreateVolume per volume name: the ID depends on the
	// pool chosen, so the per-volume lock alone cannot stop two calls with one
	// name from creating it in two pools.
	names keyedLock
	// snapNames does the same for CreateSnapshot, groupNames for
	// CreateVolumeGroupSnapshot.
	snapNames  keyedLock
	groupNames keyedLock

	orphanGrace   time.Duration
	sweepInterval time.Duration

	freezer *freezer
	// beforeClone, if set (by tests), runs while the source is frozen,
	// just before its clone; an error it returns fails the snapshot.
	beforeClone func() error
	// afterMoveStep, if set (by tests), runs after each durable step of a
	// move (pool.MoveOptions.AfterStep): an error stops the move there.
	afterMoveStep func(pool.MoveStep) error
}

// New returns the Controller service.
func New(cfg Config) (*Server, error) {
	if len(cfg.Pools) == 0 {
		return nil, errors.New("the controller needs at least one pool")
	}
	if cfg.OrphanGrace < 0 || cfg.SweepInterval < 0 {
		return nil, errors.New("the orphan grace and the sweep interval must not be negative")
	}
	s := &Server{pools: map[string]*pool.Pool{}, defaultFsType: cfg.DefaultFsType,
		orphanGrace: cmp.Or(cfg.OrphanGrace, pool.DefaultOrphanGrace), sweepInterval: cmp.Or(cfg.SweepInterval, DefaultSweepInterval)}
	if cfg.Loop != nil {
		s.freezer = &freezer{loop: cfg.Loop, mountInfo: cmp.Or(cfg.MountInfo, "/proc/self/mountinfo")}
	}
	if s.defaultFsType == "" {
		s.defaultFsType = volspec.DefaultFsType
	}
	if !volspec.SupportedFsType(s.defaultFsType) {
		return nil, fmt.Errorf("default filesystem %q is not one of %s", s.defaultFsType, strings.Join(volspec.Filesystems, ", "))
	}
	for _, p := range cfg.Pools {
		if _, dup := s.pools[p.Name]; dup {
			return nil, fmt.Errorf("pool %s is configured twice", p.Name)
		}
		s.pools[p.Name] = p
		s.poolNames = append(s.poolNames, p.Name)
	}
	sort.Strings(s.poolNames)
	return s, nil
}

var controllerCaps = []csi.ControllerServiceCapability_RPC_Type{
	csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
	csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME,
	csi.ControllerServiceCapability_RPC_PUBLISH_READONLY,
	csi.ControllerServiceCapability_RPC_LIST_VOLUMES,
	csi.ControllerServiceCapability_RPC_LIST_VOLUMES_PUBLISHED_NODES,
	csi.ControllerServiceCapability_RPC_GET_VOLUME,
	csi.ControllerServiceCapability_RPC_GET_VOLUME_HEALTH,
	csi.ControllerServiceCapability_RPC_LIST_VOLUME_HEALTH,
	csi.ControllerServiceCapability_RPC_GET_CAPACITY,
	csi.ControllerServiceCapability_RPC_EXPAND_VOLUME,
	csi.ControllerServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER,
	csi.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT,
	csi.ControllerServiceCapability_RPC_LIST_SNAPSHOTS,
	csi.ControllerServiceCapability_RPC_GET_SNAPSHOT,
	csi.ControllerServiceCapability_RPC_CLONE_VOLUME,
	csi.ControllerServiceCapability_RPC_MODIFY_VOLUME,
}

// ControllerGetCapabilities lists what the Controller service does.
func (s *Server) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	resp := &csi.ControllerGetCapabilitiesResponse{}
	for _, c := range controllerCaps {
		resp.Capabilities = append(resp.Capabilities, &csi.ControllerServiceCapability{
			Type: &csi.ControllerServiceCapability_Rpc{Rpc: &csi.ControllerServiceCapability_RPC{Type: c}},
		})
	}
	return resp, nil
}

// lookup parses a volume ID and finds its pool. Anything unknown is NOT_FOUND.
func (s *Server) lookup(volumeID string) (*pool.Pool, pool.VolumeID, error) {
	id, err := pool.ParseVolumeID(volumeID)
	if err != nil {
		return nil, id, volspec.Errorf(volspec.ErrNotFound, "volume %q does not exist: %w", volumeID, err)
	}
	p, ok := s.pools[id.Pool]
	if !ok {
		return nil, id, volspec.Errorf(volspec.ErrNotFound, "volume %q does not exist: no pool %q", volumeID, id.Pool)
	}
	return p, id, nil
}

// peer finds a configured pool by name: the pools a forwarding record may
// name (pool.Locate).
func (s *Server) peer(name string) *pool.Pool { return s.pools[name] }

// locate finds a volume whose home pool is p without a lock: the pool it
// lives in (p, or the one p's forwarding record names) and its record.
func (s *Server) locate(p *pool.Pool, id pool.VolumeID) (*pool.Pool, *pool.Volume, error) {
	return p.Locate(id, s.peer)
}

// settle is locate for a caller that holds the volume's lock: a move that
// a crash interrupted is finished or rolled back first (pool.FinishMove,
// which never copies), so that no RPC acts on a volume half-way between
// two pools.
func (s *Server) settle(p *pool.Pool, id pool.VolumeID) (*pool.Pool, *pool.Volume, error) {
	if _, err := p.FinishMove(id, s.peer); err != nil {
		return nil, nil, err
	}
	return s.locate(p, id)
}

// keyedLock is a set of try-locks by key.
type keyedLock struct {
	mu   sync.Mutex
	held map[string]bool
}

func (k *keyedLock) tryLock(key string) (unlock func(), ok bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.held == nil {
		k.held = map[string]bool{}
	}
	if k.held[key] {
		return nil, false
	}
	k.held[key] = true
	return func() {
		k.mu.Lock()
		delete(k.held, key)
		k.mu.Unlock()
	}, true
}
