package controller

import (
	"context"
	"errors"
	"slices"
	"strconv"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/loopvol/loopvol/pkg/pool"
	"github.com/loopvol/loopvol/pkg/volspec"
	"k8s.io/klog/v2"
)

// controllerPublishVolume attaches a volume to a node by recording the
// attachment in the volume record. Node plugins stage only volumes attached
// to them, so this is what fences a single-node volume to one node.
func (s *Server) controllerPublishVolume(ctx context.Context, req *csi.ControllerPublishVolumeRequest) (*csi.ControllerPublishVolumeResponse, error) {
	switch {
	case req.GetVolumeId() == "":
		return nil, invalid("volume_id is required")
	case req.GetNodeId() == "":
		return nil, invalid("node_id is required")
	case req.GetVolumeCapability() == nil:
		return nil, invalid("volume_capability is required")
	}
	accessType, fsType, mode, err := validateCapability(req.GetVolumeCapability(), s.defaultFsType)
	if err != nil {
		return nil, invalid("volume_capability: %w", err)
	}
	node, readOnly := req.GetNodeId(), req.GetReadonly()
	var pubCtx map[string]string
	err = s.withVolume(req.GetVolumeId(), func(p *pool.Pool, v *pool.Volume) error {
		rec, err := p.ReadNode(node)
		if errors.Is(err, pool.ErrNotFound) || errors.Is(err, pool.ErrInvalidID) {
			return volspec.Errorf(volspec.ErrNotFound, "node %q does not serve pool %s (no node plugin has registered it)", node, p.Name)
		}
		if err != nil {
			return err
		}
		if v.AccessType != accessType || (accessType == pool.AccessMount && req.GetVolumeCapability().GetMount().GetFsType() != "" && v.FsType != fsType) {
			return invalid("volume %s is a %s; it cannot be published as a %s", v.ID, describe(v.AccessType, v.FsType), describe(accessType, fsType))
		}
		pubCtx = map[string]string{ContextNode: node, ContextReadOnly: strconv.FormatBool(readOnly), ContextAccessType: v.AccessType}
		if a, ok := v.AttachedTo(node); ok {
			if a.ReadOnly != readOnly {
				return volspec.Errorf(volspec.ErrExists, "volume %s is attached to node %s with readonly=%t; detach it before publishing with readonly=%t", v.ID, node, a.ReadOnly, readOnly)
			}
			return nil
		}
		if err := checkSharing(v, mode, readOnly); err != nil {
			return err
		}
		id, err := pool.ParseVolumeID(v.ID)
		if err != nil {
			return err
		}
		if err := checkFencePending(s.pools[id.Pool], id, v, node, mode, readOnly); err != nil {
			return err
		}
		if rec.MaxVolumes > 0 {
			// Lock order: the volume lock (held), then the node locks.
			unlockNode, err := s.lockNode(ctx, node)
			if err != nil {
				return err
			}
			defer unlockNode()
			n, err := s.countAttachments(node)
			if err != nil {
				return err
			}
			if int64(n) >= rec.MaxVolumes {
				return volspec.Errorf(volspec.ErrNoSpace, "node %s has %d volumes attached, its limit", node, n)
			}
		}
		v.Attachments = append(v.Attachments, pool.Attachment{Node: node, ReadOnly: readOnly})
		if err := p.WriteVolume(v); err != nil {
			return err
		}
		klog.FromContext(ctx).V(2).Info("Attached volume", "node", node, "readOnly", readOnly)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &csi.ControllerPublishVolumeResponse{PublishContext: pubCtx}, nil
}

// checkSharing enforces the access mode when the volume gets another node:
// single-node modes allow one node; MULTI_NODE_READER_ONLY allows many
// read-only; MULTI_NODE_SINGLE_WRITER one writer among readers;
// MULTI_NODE_MULTI_WRITER (block only) many of anything. The mode must be one
// the volume was created with, so nobody widens it at publish time.
func checkSharing(v *pool.Volume, mode string, readOnly bool) error {
	m := csi.VolumeCapability_AccessMode_Mode(csi.VolumeCapability_AccessMode_Mode_value[mode])
	if !volspec.SingleNodeAccessMode(m) && !slices.Contains(v.AccessModes, mode) {
		return invalid("volume %s was created for %v; it cannot be published as %s", v.ID, v.AccessModes, mode)
	}
	if len(v.Attachments) == 0 {
		return nil
	}
	others := nodesOf(v)
	switch m {
	case csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY:
		if !readOnly || slices.ContainsFunc(v.Attachments, func(a pool.Attachment) bool { return !a.ReadOnly }) {
			return volspec.Errorf(volspec.ErrPrecondition, "volume %s is attached to %v; MULTI_NODE_READER_ONLY shares it only read-only", v.ID, others)
		}
	case csi.VolumeCapability_AccessMode_MULTI_NODE_SINGLE_WRITER:
		if !readOnly && slices.ContainsFunc(v.Attachments, func(a pool.Attachment) bool { return !a.ReadOnly }) {
			return volspec.Errorf(volspec.ErrPrecondition, "volume %s already has a writer among %v; MULTI_NODE_SINGLE_WRITER allows one", v.ID, others)
		}
	case csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER:
	default:
		return volspec.Errorf(volspec.ErrPrecondition, "volume %s is attached to node %v; %s allows a single node", v.ID, others, mode)
	}
	return nil
}

// lockNode takes the node's lock in every pool of this controller that the
// node serves, in the order of their names, within one pool.NodeLockWait:
// until it is released, no publish of this or any other process on those
// pools attaches a volume to the node, so the count of the node's
// attachments that follows stays true until this publish's record is
// written. A pool the node does not serve gets no attachment to it (publish
// refuses it), so it needs no lock. Volume locks are only tried, never
// waited for, so holding one while waiting here cannot deadlock.
//
// A pool whose filesystem refuses to create the node's lock file
// (pool.ErrUnwritable) is left out, so that one full pool does not stop
// the publishes of every other. The count stays true: a lock this call
// holds has its file, which every other publish to the node opens and
// waits for whatever its filesystem's state, so no two of them count at
// once; and the lock left out had no file, so nobody held it. That needs
// one lock held: when every pool refuses, the refusal is the error.
func (s *Server) lockNode(ctx context.Context, node string) (func(), error) {
	ctx, cancel := context.WithTimeout(ctx, pool.NodeLockWait)
	defer cancel()
	var held []pool.Unlock
	release := func() {
		for i := len(held) - 1; i >= 0; i-- {
			held[i]()
		}
	}
	var refused error
	for _, name := range s.poolNames {
		p := s.pools[name]
		if !p.HasNode(node) {
			continue
		}
		unlock, err := p.LockNode(ctx, node)
		if errors.Is(err, pool.ErrUnwritable) {
			klog.FromContext(ctx).Error(err, "Counting the node's attachments without its lock in a pool that refuses writes", "pool", p.Name, "node", node)
			refused = err
			continue
		}
		if err != nil {
			release()
			return nil, err
		}
		held = append(held, unlock)
	}
	if len(held) == 0 && refused != nil {
		return nil, refused
	}
	return release, nil
}

// countAttachments counts the volumes attached to node over every pool.
func (s *Server) countAttachments(node string) (int, error) {
	total := 0
	for _, name := range s.poolNames {
		n, err := s.pools[name].CountAttachments(node)
		if err != nil {
			return 0, err
		}
		total += n
	}
	return total, nil
}

// controllerUnpublishVolume removes the volume's attachment to a node (to all
// nodes when node_id is empty). A volume or attachment that does not exist is
// already unpublished: success.
func (s *Server) controllerUnpublishVolume(ctx context.Context, req *csi.ControllerUnpublishVolumeRequest) (*csi.ControllerUnpublishVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, invalid("volume_id is required")
	}
	p, id, err := s.lookup(req.GetVolumeId())
	if err != nil {
		return &csi.ControllerUnpublishVolumeResponse{}, nil
	}
	unlock, err := p.Lock(id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	q, v, err := s.settle(p, id)
	if errors.Is(err, pool.ErrNotFound) || errors.Is(err, pool.ErrGuest) {
		return &csi.ControllerUnpublishVolumeResponse{}, nil
	}
	if err != nil {
		return nil, err
	}
	detached := func(node string) bool { return req.GetNodeId() == "" || node == req.GetNodeId() }
	kept := slices.DeleteFunc(slices.Clone(v.Attachments), func(a pool.Attachment) bool { return detached(a.Node) })
	if len(kept) != len(v.Attachments) {
		v.Attachments = kept
		if err := q.WriteVolume(v); err != nil {
			return nil, err
		}
		klog.FromContext(ctx).V(2).Info("Detached volume", "node", req.GetNodeId())
	}
	// Durably detached first, then fenced if the node still has it staged
	// (fence.go): also when a retry finds it detached already, since the
	// fence of the first call may have failed.
	if err := s.fenceDetached(ctx, p, q, id, detached); err != nil {
		return nil, err
	}
	return &csi.ControllerUnpublishVolumeResponse{}, nil
}

// validateVolumeCapabilities confirms the capabilities a volume can serve.
func (s *Server) validateVolumeCapabilities(ctx context.Context, req *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, invalid("volume_id is required")
	}
	if len(req.GetVolumeCapabilities()) == 0 {
		return nil, invalid("volume_capabilities are required")
	}
	p, id, err := s.lookup(req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	_, v, err := s.locate(p, id)
	if err != nil {
		return nil, err
	}
	if err := validateParameters(req.GetParameters()); err != nil {
		return &csi.ValidateVolumeCapabilitiesResponse{Message: err.Error()}, nil
	}
	for i, c := range req.GetVolumeCapabilities() {
		accessType, fsType, mode, err := validateCapability(c, v.FsType)
		if err != nil {
			return &csi.ValidateVolumeCapabilitiesResponse{Message: "volume_capabilities[" + strconv.Itoa(i) + "]: " + err.Error()}, nil
		}
		if accessType != v.AccessType || fsType != v.FsType {
			return &csi.ValidateVolumeCapabilitiesResponse{Message: "volume " + v.ID + " is a " + describe(v.AccessType, v.FsType) + ", not a " + describe(accessType, fsType)}, nil
		}
		if err := checkSharing(&pool.Volume{ID: v.ID, AccessModes: v.AccessModes}, mode, false); err != nil {
			return &csi.ValidateVolumeCapabilitiesResponse{Message: err.Error()}, nil
		}
	}
	return &csi.ValidateVolumeCapabilitiesResponse{Confirmed: &csi.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeContext:      req.GetVolumeContext(),
		VolumeCapabilities: req.GetVolumeCapabilities(),
		Parameters:         req.GetParameters(),
	}}, nil
}
