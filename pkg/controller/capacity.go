package controller

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// getCapacity reports the space available for new volumes in the pools that
// match the request: the "pool" parameter, if given, and the zone of the
// topology segment, if given. available_capacity is their sum;
// maximum_volume_size the largest single pool's, since one volume lives in
// one pool. A pool this controller does not have reports zero. Orphan images
// (images without a record) hold their space until Sweep reclaims them, so
// it is not offered.
func (s *Server) getCapacity(ctx context.Context, req *csi.GetCapacityRequest) (*csi.GetCapacityResponse, error) {
	if err := validateParameters(req.GetParameters()); err != nil {
		return nil, err
	}
	for i, c := range req.GetVolumeCapabilities() {
		if _, _, _, err := validateCapability(c, s.defaultFsType); err != nil {
			return nil, invalid("volume_capabilities[%d]: %w", i, err)
		}
	}
	want, byPool := req.GetParameters()[ParameterPool]
	var total, largest int64
	for _, name := range s.poolNames {
		p := s.pools[name]
		if byPool && name != want {
			continue
		}
		if seg := req.GetAccessibleTopology(); seg != nil && !segmentMatches(seg, p) {
			continue
		}
		avail, err := p.Available()
		if err != nil {
			return nil, err
		}
		total += avail
		largest = max(largest, avail)
	}
	return &csi.GetCapacityResponse{AvailableCapacity: total, MaximumVolumeSize: wrapperspb.Int64(largest)}, nil
}
