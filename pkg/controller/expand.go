package controller

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/loopvol/loopvol/pkg/pool"
	"k8s.io/klog/v2"
)

// controllerExpandVolume grows a volume's image. Node expansion is always
// required: the loop device must learn the new size (and a filesystem grow
// into it), which only the node that has it attached can do. Online: the
// volume may be attached.
func (s *Server) controllerExpandVolume(ctx context.Context, req *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
	if req.GetCapacityRange() == nil {
		return nil, invalid("capacity_range is required")
	}
	if c := req.GetVolumeCapability(); c != nil {
		if _, _, _, err := validateCapability(c, s.defaultFsType); err != nil {
			return nil, invalid("volume_capability: %w", err)
		}
	}
	var size int64
	err := s.withVolume(req.GetVolumeId(), func(p *pool.Pool, v *pool.Volume) error {
		want, err := requestedSize(req.GetCapacityRange(), v.AccessType, v.FsType)
		if err != nil {
			return err
		}
		if limit := req.GetCapacityRange().GetLimitBytes(); limit > 0 && v.SizeBytes > limit {
			return outOfRange("volume %s is %d bytes, above limit_bytes %d; volumes never shrink", v.ID, v.SizeBytes, limit)
		}
		if want > v.SizeBytes {
			if err := p.ExpandVolume(ctx, v, want); err != nil {
				return err
			}
			klog.FromContext(ctx).V(2).Info("Expanded volume", "sizeBytes", v.SizeBytes)
		}
		size = v.SizeBytes
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &csi.ControllerExpandVolumeResponse{CapacityBytes: size, NodeExpansionRequired: true}, nil
}

var _ csi.ControllerServer = (*Server)(nil)
