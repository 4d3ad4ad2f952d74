package node

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	mount "k8s.io/mount-utils"

	"github.com/loopvol/loopvol/pkg/loop"
	"github.com/loopvol/loopvol/pkg/pool"
	"github.com/loopvol/loopvol/pkg/volspec"
)

// Config is everything the node service needs. System access (loop devices,
// mounts, commands) is injected so that unit tests can fake it.
type Config struct {
	// NodeID names this node in volume records (attachments) and node records.
	NodeID string
	// Zone is the topology zone of this node; it serves the pools of this zone.
	Zone string
	// MaxVolumes is reported as max_volumes_per_node (0: no limit).
	MaxVolumes int64
	// Version is the driver's build, reported by NodeStatus.
	Version string
	// KubeletDir is the only directory under which staging and target paths
	// are accepted.
	KubeletDir string
	// PodUID is the UID of the node plugin's own Pod (the Downward API's
	// metadata.uid), or empty. With it NodeStatus tells whether kubelet
	// keeps that Pod's directory under KubeletDir: the one sign, from
	// inside the node, that KubeletDir is not kubelet's --root-dir
	// (kubelet's configuration does not say).
	PodUID string
	// Pools maps pool names to pools. Pools of other zones are ignored.
	Pools map[string]*pool.Pool
	// Loop attaches images to loop devices. Its owner (loop.Owner) must be
	// NodeID: the node acts only on the loop devices it attached (and on
	// untagged ones an older plugin left), never on those of another
	// node's plugin on the same kernel, even for the same image.
	Loop loop.Interface
	// Mounter formats (its Exec runs blkid, mkfs and fsck) and resizes
	// filesystems (resize2fs, xfs_growfs through the same Exec). Its
	// Interface must be mount-utils' own (mount.New): the node mounts and
	// unmounts with system calls on resolved descriptors, never by path
	// through mount(8), and uses the Interface only for what it does not
	// do itself.
	Mounter *mount.SafeFormatAndMount

	// mounts replaces the kernel's mount table in the unit tests, and
	// freezer its freezes (nil there: nothing can be frozen).
	mounts  mountTable
	freezer fsFreezer
}

// Validate checks the configuration.
func (c *Config) Validate() error {
	var errs []error
	if err := pool.ValidateNodeID(c.NodeID); err != nil {
		errs = append(errs, err)
	}
	if c.Zone == "" {
		errs = append(errs, errors.New("zone must not be empty"))
	}
	if c.MaxVolumes < 0 {
		errs = append(errs, fmt.Errorf("max volumes %d must not be negative", c.MaxVolumes))
	}
	if !filepath.IsAbs(c.KubeletDir) || filepath.Clean(c.KubeletDir) == "/" {
		errs = append(errs, fmt.Errorf("kubelet directory %q must be an absolute path other than /", c.KubeletDir))
	}
	if err := ValidatePodUID(c.PodUID); err != nil {
		errs = append(errs, err)
	}
	for name, p := range c.Pools {
		if p == nil || p.Name != name {
			errs = append(errs, fmt.Errorf("pool %q: entry does not hold that pool", name))
		}
	}
	switch {
	case c.Loop == nil:
		errs = append(errs, errors.New("loop devices (Loop) are missing"))
	case c.Loop.Owner() != c.NodeID:
		errs = append(errs, fmt.Errorf("loop devices (Loop) act for owner %q, not for node %q (loop.New(loop.Owner(NodeID)))", c.Loop.Owner(), c.NodeID))
	}
	if c.Mounter == nil || c.Mounter.Interface == nil || c.Mounter.Exec == nil {
		errs = append(errs, errors.New("mounter (Mounter with Interface and Exec) is missing"))
	}
	return errors.Join(errs...)
}

// Server is the CSI Node service. It is a locking decorator over node: each
// volume RPC is validated, then takes the volume's lock without waiting
// (ABORTED if another call holds it), then runs unlocked in node. RPCs that
// only report constants, and NodeGetVolumeStats, which only reads and is
// polled often, take no lock.
type Server struct {
	csi.UnimplementedNodeServer
	node  *node
	locks sync.Map // volume ID → *sync.Mutex
}

var _ csi.NodeServer = (*Server)(nil)

// New checks cfg and returns the node service. It writes this node's record
// into every pool of its zone, so the controller knows the node (its zone
// and volume limit) and will attach volumes to it.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("node configuration: %w", err)
	}
	n := &node{
		Config:     cfg,
		kubeletDir: filepath.Clean(cfg.KubeletDir),
		pools:      map[string]*pool.Pool{},
	}
	_, real := cfg.Mounter.Interface.(*mount.Mounter)
	switch {
	case cfg.mounts != nil:
		n.mounts = cfg.mounts
		n.freezer = cfg.freezer
		if n.freezer == nil {
			n.freezer = noFreezer{}
		}
	case real:
		n.mounts = sysMounts{}
		n.ext4Size = ext4Size
		n.freezer = sysFreezer{}
	default:
		return nil, fmt.Errorf("node configuration: the mounter's Interface is %T, not mount-utils' own (mount.New)", cfg.Mounter.Interface)
	}
	n.kubeletReal = n.kubeletDir
	if real, err := filepath.EvalSymlinks(n.kubeletDir); err == nil {
		n.kubeletReal = real
	}
	names := make([]string, 0, len(cfg.Pools))
	for name, p := range cfg.Pools {
		if p.Zone == cfg.Zone {
			n.pools[name] = p
			names = append(names, name)
		}
	}
	if len(n.pools) == 0 {
		return nil, fmt.Errorf("node configuration: no pool of zone %q", cfg.Zone)
	}
	sort.Strings(names)
	rec := pool.NodeRecord{ID: cfg.NodeID, Zone: cfg.Zone, MaxVolumes: cfg.MaxVolumes, LastStart: time.Now().UTC()}
	n.started = rec.LastStart
	for _, name := range names {
		if err := n.pools[name].WriteNode(rec); err != nil {
			return nil, fmt.Errorf("pool %s: record node %s: %w", name, cfg.NodeID, err)
		}
	}
	return &Server{node: n}, nil
}

// lock takes the volume's lock without waiting.
func (s *Server) lock(id pool.VolumeID) (unlock func(), err error) {
	v, _ := s.locks.LoadOrStore(id.String(), &sync.Mutex{})
	mu := v.(*sync.Mutex)
	if !mu.TryLock() {
		return nil, volspec.Errorf(volspec.ErrBusy, "volume %s: another operation on this volume is in progress", id)
	}
	return mu.Unlock, nil
}

// volumeArgs are checked request arguments that name a volume.
type volumeArgs interface{ volumeID() pool.VolumeID }

func (a stageArgs) volumeID() pool.VolumeID     { return a.id }
func (a unstageArgs) volumeID() pool.VolumeID   { return a.id }
func (a publishArgs) volumeID() pool.VolumeID   { return a.id }
func (a unpublishArgs) volumeID() pool.VolumeID { return a.id }
func (a expandArgs) volumeID() pool.VolumeID    { return a.id }

// locked is the shape of every volume RPC that changes something: the
// request was checked (argErr), then the volume's lock is taken without
// waiting, then act runs; every error becomes a status here.
func locked[A volumeArgs, R any](s *Server, a A, argErr error, act func(A) (*R, error)) (*R, error) {
	if argErr != nil {
		return nil, toStatus(argErr)
	}
	unlock, err := s.lock(a.volumeID())
	if err != nil {
		return nil, toStatus(err)
	}
	defer unlock()
	resp, err := act(a)
	if err != nil {
		return nil, toStatus(err)
	}
	return resp, nil
}

// NodeStageVolume attaches the volume's image and, in mount mode, makes the
// filesystem if the device is blank and mounts it on the staging path. A
// self-fenced node refuses volumes of shared pools (selffence.go).
func (s *Server) NodeStageVolume(ctx context.Context, req *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
	a, err := s.node.stageArgs(req)
	return locked(s, a, err, func(a stageArgs) (*csi.NodeStageVolumeResponse, error) {
		if err := s.node.refuseSelfFenced(a.id); err != nil {
			return nil, err
		}
		if err := s.node.stage(ctx, a); err != nil {
			return nil, err
		}
		return &csi.NodeStageVolumeResponse{}, s.node.freezeAfterStage(ctx, a.id)
	})
}

// NodeUnstageVolume unmounts the staging path and detaches the loop device.
func (s *Server) NodeUnstageVolume(ctx context.Context, req *csi.NodeUnstageVolumeRequest) (*csi.NodeUnstageVolumeResponse, error) {
	a, err := s.node.unstageArgs(req)
	return locked(s, a, err, func(a unstageArgs) (*csi.NodeUnstageVolumeResponse, error) {
		return &csi.NodeUnstageVolumeResponse{}, s.node.unstage(ctx, a)
	})
}

// NodePublishVolume bind-mounts the staged volume onto the target path. A
// self-fenced node refuses volumes of shared pools (selffence.go).
func (s *Server) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	a, err := s.node.publishArgs(req)
	return locked(s, a, err, func(a publishArgs) (*csi.NodePublishVolumeResponse, error) {
		if err := s.node.refuseSelfFenced(a.id); err != nil {
			return nil, err
		}
		return &csi.NodePublishVolumeResponse{}, s.node.publish(ctx, a)
	})
}

// NodeUnpublishVolume unmounts and removes the target path.
func (s *Server) NodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	a, err := s.node.unpublishArgs(req)
	return locked(s, a, err, func(a unpublishArgs) (*csi.NodeUnpublishVolumeResponse, error) {
		return &csi.NodeUnpublishVolumeResponse{}, s.node.unpublish(ctx, a)
	})
}

// NodeExpandVolume makes the loop device take the grown image's size and
// grows the filesystem online.
func (s *Server) NodeExpandVolume(ctx context.Context, req *csi.NodeExpandVolumeRequest) (*csi.NodeExpandVolumeResponse, error) {
	a, err := s.node.expandArgs(req)
	return locked(s, a, err, func(a expandArgs) (*csi.NodeExpandVolumeResponse, error) {
		size, err := s.node.expand(ctx, a)
		return &csi.NodeExpandVolumeResponse{CapacityBytes: size}, err
	})
}

// NodeGetVolumeStats reports usage and the volume's condition. It takes no
// lock: it only reads, and kubelet polls it.
func (s *Server) NodeGetVolumeStats(ctx context.Context, req *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error) {
	a, err := s.node.statsArgs(req)
	if err != nil {
		return nil, toStatus(err)
	}
	resp, err := s.node.stats(ctx, a)
	return resp, toStatus(err)
}

// NodeGetVolumeHealth reports what is wrong with a volume on this node: a
// missing or damaged record or image, a missing loop device, a path that is
// not mounted or mounted from elsewhere. It takes no lock: it only reads.
// (CSI 1.13 moved the volume condition out of NodeGetVolumeStats into this
// RPC.)
func (s *Server) NodeGetVolumeHealth(ctx context.Context, req *csi.NodeGetVolumeHealthRequest) (*csi.NodeGetVolumeHealthResponse, error) {
	a, err := s.node.healthArgs(req)
	if err != nil {
		return nil, toStatus(err)
	}
	resp, err := s.node.health(ctx, a)
	return resp, toStatus(err)
}

// NodeGetInfo reports the node ID, its zone and its volume limit.
func (s *Server) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	return &csi.NodeGetInfoResponse{
		NodeId:             s.node.NodeID,
		MaxVolumesPerNode:  s.node.MaxVolumes,
		AccessibleTopology: &csi.Topology{Segments: map[string]string{volspec.TopologyKey: s.node.Zone}},
	}, nil
}

// NodeGetCapabilities reports what this node service does.
func (s *Server) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	var caps []*csi.NodeServiceCapability
	for _, c := range []csi.NodeServiceCapability_RPC_Type{
		csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME,
		csi.NodeServiceCapability_RPC_GET_VOLUME_STATS,
		csi.NodeServiceCapability_RPC_GET_VOLUME_HEALTH,
		csi.NodeServiceCapability_RPC_GET_STORAGE_HEALTH,
		csi.NodeServiceCapability_RPC_EXPAND_VOLUME,
		csi.NodeServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER,
	} {
		caps = append(caps, &csi.NodeServiceCapability{
			Type: &csi.NodeServiceCapability_Rpc{Rpc: &csi.NodeServiceCapability_RPC{Type: c}},
		})
	}
	return &csi.NodeGetCapabilitiesResponse{Capabilities: caps}, nil
}
