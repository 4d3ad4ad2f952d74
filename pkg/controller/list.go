package controller

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/loopvol/loopvol/pkg/pool"
	"github.com/loopvol/loopvol/pkg/volspec"
	"k8s.io/klog/v2"
)

// allVolumeIDs returns the IDs of every volume in every pool, sorted by their
// string form: the order pagination tokens refer to.
func (s *Server) allVolumeIDs() ([]pool.VolumeID, error) {
	var ids []pool.VolumeID
	for _, name := range s.poolNames {
		more, err := s.pools[name].ListVolumeIDs()
		if err != nil {
			return nil, err
		}
		ids = append(ids, more...)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i].String() < ids[j].String() })
	return ids, nil
}

// volumePage returns one page of all volume IDs and the next token.
func (s *Server) volumePage(token string, maxEntries int32) ([]pool.VolumeID, string, error) {
	ids, err := s.allVolumeIDs()
	if err != nil {
		return nil, "", err
	}
	return page(ids, token, maxEntries)
}

// page cuts a sorted ID list at a starting token (the last ID of the previous
// page) and a maximum; it returns the page and the next token. A token that
// is not an ID we issue is ABORTED, as the spec asks.
func page(ids []pool.VolumeID, token string, maxEntries int32) ([]pool.VolumeID, string, error) {
	if maxEntries < 0 {
		return nil, "", invalid("max_entries must not be negative")
	}
	start := 0
	if token != "" {
		if _, err := pool.ParseVolumeID(token); err != nil {
			return nil, "", volspec.Errorf(volspec.ErrBusy, "starting_token %q was not issued by loopvol", token)
		}
		start = sort.Search(len(ids), func(i int) bool { return ids[i].String() > token })
	}
	ids = ids[start:]
	if maxEntries > 0 && int(maxEntries) < len(ids) {
		return ids[:maxEntries], ids[maxEntries-1].String(), nil
	}
	return ids, "", nil
}

// listVolumes lists volumes with the nodes they are published to, a page at
// a time. A volume whose record cannot be read (ControllerGetVolumeHealth
// says why) is listed with its ID only; the rest are listed as usual.
func (s *Server) listVolumes(ctx context.Context, req *csi.ListVolumesRequest) (*csi.ListVolumesResponse, error) {
	ids, next, err := s.volumePage(req.GetStartingToken(), req.GetMaxEntries())
	if err != nil {
		return nil, err
	}
	logger := klog.FromContext(ctx)
	resp := &csi.ListVolumesResponse{NextToken: next}
	for _, id := range ids {
		entry := &csi.ListVolumesResponse_Entry{Volume: &csi.Volume{VolumeId: id.String()}, Status: &csi.ListVolumesResponse_VolumeStatus{}}
		// A moved volume is listed once, by its ID, from its home's
		// forwarding record; its record where it lives is a guest there.
		q, v, err := s.locate(s.pools[id.Pool], id)
		switch {
		case err == nil:
			entry.Volume = s.csiVolume(q, v)
			entry.Status.PublishedNodeIds = nodesOf(v)
		case errors.Is(err, pool.ErrNotFound), errors.Is(err, pool.ErrGuest):
			continue // deleted while we listed, or a guest
		default:
			logger.V(2).Info("Listed a volume whose record cannot be read", "volumeID", id.String(), "err", err.Error())
		}
		resp.Entries = append(resp.Entries, entry)
	}
	return resp, nil
}

// controllerGetVolume describes one volume and the nodes it is published to.
func (s *Server) controllerGetVolume(ctx context.Context, req *csi.ControllerGetVolumeRequest) (*csi.ControllerGetVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, invalid("volume_id is required")
	}
	p, id, err := s.lookup(req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	q, v, err := s.locate(p, id)
	if err != nil {
		return nil, err
	}
	return &csi.ControllerGetVolumeResponse{
		Volume: s.csiVolume(q, v),
		Status: &csi.ControllerGetVolumeResponse_VolumeStatus{PublishedNodeIds: nodesOf(v)},
	}, nil
}

// controllerGetVolumeHealth reports the volume condition: CSI 1.13 moved the
// old volume_condition of ListVolumes and ControllerGetVolume here.
func (s *Server) controllerGetVolumeHealth(ctx context.Context, req *csi.ControllerGetVolumeHealthRequest) (*csi.ControllerGetVolumeHealthResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, invalid("volume_id is required")
	}
	p, id, err := s.lookup(req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	h, err := s.health(p, id)
	if err != nil {
		return nil, err
	}
	return &csi.ControllerGetVolumeHealthResponse{VolumeHealth: h}, nil
}

// controllerListVolumeHealth reports the condition of every volume, paged as
// ListVolumes. One broken entry (a record that is a FIFO, a directory, too
// large, unreadable) is reported in its own entry; it never fails the list.
func (s *Server) controllerListVolumeHealth(ctx context.Context, req *csi.ControllerListVolumeHealthRequest) (*csi.ControllerListVolumeHealthResponse, error) {
	ids, next, err := s.volumePage(req.GetStartingToken(), req.GetMaxEntries())
	if err != nil {
		return nil, err
	}
	resp := &csi.ControllerListVolumeHealthResponse{NextToken: next}
	for _, id := range ids {
		h, err := s.health(s.pools[id.Pool], id)
		if errors.Is(err, pool.ErrNotFound) || errors.Is(err, pool.ErrGuest) {
			continue // deleted while we listed, or a guest (listed from its home)
		}
		resp.Entries = append(resp.Entries, h)
	}
	return resp, nil
}

// Health reasons: what is wrong with a volume, as the controller sees it.
const (
	reasonRecordCorrupt    = "RecordCorrupt"
	reasonRecordUnreadable = "RecordUnreadable"
	reasonImageMissing     = "ImageMissing"
	reasonImageUntrusted   = "ImageUntrusted"
	reasonImageUnreadable  = "ImageUnreadable"
	reasonImageTruncated   = "ImageTruncated"
	reasonModifyPending    = "ModifyPending"
)

// health checks what the controller can see of a volume: its record and its
// image. An unknown volume is NOT_FOUND (with h nil); anything else that is
// wrong is reported in h, never as an error.
func (s *Server) health(home *pool.Pool, id pool.VolumeID) (*csi.VolumeHealth, error) {
	h := &csi.VolumeHealth{VolumeId: id.String()}
	bad := func(t csi.VolumeHealthErrorType, reason, msg string) (*csi.VolumeHealth, error) {
		h.HealthStatuses = append(h.HealthStatuses, &csi.VolumeHealth_VolumeHealthEntry{Status: t, Reason: reason, Message: msg})
		return h, nil
	}
	p, v, err := s.locate(home, id)
	switch {
	case errors.Is(err, pool.ErrNotFound), errors.Is(err, pool.ErrGuest):
		return nil, err
	case errors.Is(err, pool.ErrCorrupt):
		return bad(csi.VolumeHealthErrorType_INACCESSIBLE, reasonRecordCorrupt, err.Error())
	case err != nil:
		return bad(csi.VolumeHealthErrorType_INACCESSIBLE, reasonRecordUnreadable, err.Error())
	}
	size, err := p.ImageSize(id)
	switch {
	case errors.Is(err, pool.ErrNotFound):
		return bad(csi.VolumeHealthErrorType_DATA_LOSS, reasonImageMissing, fmt.Sprintf("the image file %s is missing", p.ImagePath(id)))
	case errors.Is(err, pool.ErrUntrusted):
		return bad(csi.VolumeHealthErrorType_INACCESSIBLE, reasonImageUntrusted, err.Error())
	case err != nil:
		return bad(csi.VolumeHealthErrorType_INACCESSIBLE, reasonImageUnreadable, err.Error())
	case size < v.SizeBytes:
		return bad(csi.VolumeHealthErrorType_DATA_LOSS, reasonImageTruncated, fmt.Sprintf(
			"the image file %s holds %d bytes, the volume is %d: it was truncated outside loopvol and the data past %d bytes is gone; restore the volume from a snapshot",
			p.ImagePath(id), size, v.SizeBytes, size))
	}
	if v.Move != nil {
		return bad(csi.VolumeHealthErrorType_DEGRADED, reasonModifyPending, fmt.Sprintf(
			"a move of the volume from pool %s to pool %s did not finish; the volume works from pool %s, and the move completes, or rolls back, when the ControllerModifyVolume is retried or the controller's sweep finds it",
			v.Move.From, v.Move.To, p.Name))
	}
	if v.Modifying != nil {
		// A ControllerModifyVolume died half-way: the image may be partly
		// thick, partly thin. Its caller retries (external-resizer does).
		return bad(csi.VolumeHealthErrorType_DEGRADED, reasonModifyPending, fmt.Sprintf(
			"a ControllerModifyVolume to %v did not finish; the volume works, and the modification completes when it is retried (external-resizer retries until it succeeds)",
			v.Modifying))
	}
	return h, nil
}
