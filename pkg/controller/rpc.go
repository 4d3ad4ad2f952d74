package controller

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/loopvol/loopvol/pkg/pool"
)

// The edge of the Controller service: each RPC runs its unexported
// implementation, which returns plain wrapped errors, and turns the error
// into a status here and nowhere else.
//
// Lock order, for every RPC that takes more than one lock (each lock is
// only tried, never waited for, except the node lock and the pool lock,
// which wait under the RPC's context for 30 s at most (pool.NodeLockWait),
// so no order can deadlock; the order keeps ABORTED answers rare and
// predictable):
//
//  1. the in-process name lock (s.names for volumes, s.snapNames for
//     snapshots, s.groupNames for group snapshots), which keeps two calls
//     with one name apart;
//  2. the group lock (pool.LockGroup) of a group snapshot, then the
//     snapshot lock (pool.LockSnapshot) of the snapshot being made,
//     deleted or restored from (of each member of a group, in ID order);
//  3. the volume lock (pool.Lock) of each volume in pool-name order, a
//     source before the volume being made; a volume's lock is its home
//     pool's, wherever it lives; a move then takes the volume's lock
//     files in the pools it moves from and to (pool.MoveVolume);
//  4. the node lock (pool.LockNode) of each pool in pool-name order;
//  5. the pool lock around a capacity decision (inside pkg/pool, under
//     the ctx each pool call takes).

func answer[R any](r *R, err error) (*R, error) {
	if err != nil {
		return nil, toStatus(err)
	}
	return r, nil
}

// withVolume is the opening that the volume RPCs share: the volume ID is
// required, unknown IDs are NOT_FOUND, the volume's lock (in its home pool)
// is tried (ABORTED when held) and its record read under it, in the pool it
// lives in (settle); then act runs with the lock held, given that pool.
func (s *Server) withVolume(volumeID string, act func(p *pool.Pool, v *pool.Volume) error) error {
	if volumeID == "" {
		return invalid("volume_id is required")
	}
	p, id, err := s.lookup(volumeID)
	if err != nil {
		return err
	}
	unlock, err := p.Lock(id)
	if err != nil {
		return err
	}
	defer unlock()
	q, v, err := s.settle(p, id)
	if err != nil {
		return err
	}
	return act(q, v)
}

// CreateVolume makes a volume, empty or from a snapshot or another volume.
func (s *Server) CreateVolume(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	return answer(s.createVolume(ctx, req))
}

// DeleteVolume removes a volume that is attached nowhere.
func (s *Server) DeleteVolume(ctx context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	return answer(s.deleteVolume(ctx, req))
}

// ControllerExpandVolume grows a volume's image.
func (s *Server) ControllerExpandVolume(ctx context.Context, req *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
	return answer(s.controllerExpandVolume(ctx, req))
}

// ListVolumes lists volumes, a page at a time.
func (s *Server) ListVolumes(ctx context.Context, req *csi.ListVolumesRequest) (*csi.ListVolumesResponse, error) {
	return answer(s.listVolumes(ctx, req))
}

// ControllerGetVolume describes one volume.
func (s *Server) ControllerGetVolume(ctx context.Context, req *csi.ControllerGetVolumeRequest) (*csi.ControllerGetVolumeResponse, error) {
	return answer(s.controllerGetVolume(ctx, req))
}

// ControllerGetVolumeHealth reports a volume's condition.
func (s *Server) ControllerGetVolumeHealth(ctx context.Context, req *csi.ControllerGetVolumeHealthRequest) (*csi.ControllerGetVolumeHealthResponse, error) {
	return answer(s.controllerGetVolumeHealth(ctx, req))
}

// ControllerListVolumeHealth reports the condition of every volume.
func (s *Server) ControllerListVolumeHealth(ctx context.Context, req *csi.ControllerListVolumeHealthRequest) (*csi.ControllerListVolumeHealthResponse, error) {
	return answer(s.controllerListVolumeHealth(ctx, req))
}

// ControllerPublishVolume attaches a volume to a node.
func (s *Server) ControllerPublishVolume(ctx context.Context, req *csi.ControllerPublishVolumeRequest) (*csi.ControllerPublishVolumeResponse, error) {
	return answer(s.controllerPublishVolume(ctx, req))
}

// ControllerUnpublishVolume detaches a volume from a node.
func (s *Server) ControllerUnpublishVolume(ctx context.Context, req *csi.ControllerUnpublishVolumeRequest) (*csi.ControllerUnpublishVolumeResponse, error) {
	return answer(s.controllerUnpublishVolume(ctx, req))
}

// ValidateVolumeCapabilities confirms the capabilities a volume can serve.
func (s *Server) ValidateVolumeCapabilities(ctx context.Context, req *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
	return answer(s.validateVolumeCapabilities(ctx, req))
}

// GetCapacity reports the space available for new volumes.
func (s *Server) GetCapacity(ctx context.Context, req *csi.GetCapacityRequest) (*csi.GetCapacityResponse, error) {
	return answer(s.getCapacity(ctx, req))
}
