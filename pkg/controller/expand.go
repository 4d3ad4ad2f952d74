package controller

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
)

// ControllerExpandVolume grows a volume's image. Node expansion is always
// required: the loop device must learn the new size (and a filesystem grow
// into it), which only the node that has it attached can do. Online: the
// volume may be attached.
func (s *Server) ControllerExpandVolume(ctx context.Context, req *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, invalid("volume_id is required")
	}
	if req.GetCapacityRange() == nil {
		return nil, invalid("capacity_range is required")
	}
	if c := req.GetVolumeCapability(); c != nil {
		if _, _, _, err := validateCapability(c, s.defaultFsType); err != nil {
			return nil, invalid("volume_capability: %v", err)
		}
	}
	p, id, err := s.lookup(req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	unlock, err := p.Lock(id)
	if err != nil {
		return nil, toStatus(err)
	}
	defer unlock()
	v, err := p.ReadVolume(id)
	if err != nil {
		return nil, toStatus(err)
	}
	size, err := requestedSize(req.GetCapacityRange(), v.AccessType, v.FsType)
	if err != nil {
		return nil, err
	}
	if limit := req.GetCapacityRange().GetLimitBytes(); limit > 0 && v.SizeBytes > limit {
		return nil, status.Errorf(codes.OutOfRange, "volume %s is %d bytes, above limit_bytes %d; volumes never shrink", id, v.SizeBytes, limit)
	}
	if size > v.SizeBytes {
		if err := p.ExpandVolume(v, size); err != nil {
			return nil, toStatus(err)
		}
		klog.FromContext(ctx).V(2).Info("Expanded volume", "sizeBytes", v.SizeBytes)
	}
	return &csi.ControllerExpandVolumeResponse{CapacityBytes: v.SizeBytes, NodeExpansionRequired: true}, nil
}

var _ csi.ControllerServer = (*Server)(nil)
