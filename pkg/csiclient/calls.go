package csiclient

import (
	"context"
	"fmt"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
)

type timeoutKey struct{}

// WithTimeout returns a copy of ctx under which ControllerPublish and
// ControllerUnpublish wait up to d instead of Config.Timeout: a caller
// gives more time to a volume whose previous call timed out.
func WithTimeout(ctx context.Context, d time.Duration) context.Context {
	return context.WithValue(ctx, timeoutKey{}, d)
}

// callTimeout is the timeout of a publish or unpublish under ctx.
func (c *Client) callTimeout(ctx context.Context) time.Duration {
	if d, ok := ctx.Value(timeoutKey{}).(time.Duration); ok && d > 0 {
		return d
	}
	return c.cfg.Timeout
}

// ControllerPublish calls ControllerPublishVolume, bounded by Config.Timeout
// (or the WithTimeout of ctx),
// and returns the publish context. An error keeps its gRPC status (IsFinal
// and Code see it). The request's secrets are never logged.
func (c *Client) ControllerPublish(ctx context.Context, req *csi.ControllerPublishVolumeRequest) (map[string]string, error) {
	ctx, cancel := context.WithTimeout(ctx, c.callTimeout(ctx))
	defer cancel()
	rsp, err := c.controller.ControllerPublishVolume(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("ControllerPublishVolume: %w", err)
	}
	return rsp.GetPublishContext(), nil
}

// ControllerUnpublish calls ControllerUnpublishVolume, bounded by
// Config.Timeout (or the WithTimeout of ctx). An error keeps its gRPC
// status.
func (c *Client) ControllerUnpublish(ctx context.Context, req *csi.ControllerUnpublishVolumeRequest) error {
	ctx, cancel := context.WithTimeout(ctx, c.callTimeout(ctx))
	defer cancel()
	if _, err := c.controller.ControllerUnpublishVolume(ctx, req); err != nil {
		return fmt.Errorf("ControllerUnpublishVolume: %w", err)
	}
	return nil
}

// ListVolumes pages through ListVolumes (Config.MaxEntries per page, the
// whole pass bounded by Config.Timeout) and returns, for each volume ID, the
// node IDs it is published on. Entries without a status are left out: the
// driver says nothing about where they are published. It is an error when
// the driver does not offer LIST_VOLUMES, or returns a page token it returned
// before (it would never end).
func (c *Client) ListVolumes(ctx context.Context) (map[string][]string, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	published := map[string][]string{}
	seen := map[string]bool{}
	token := ""
	for {
		rsp, err := c.controller.ListVolumes(ctx, &csi.ListVolumesRequest{
			MaxEntries:    int32(c.cfg.MaxEntries), // Validate bounds it
			StartingToken: token,
		})
		if err != nil {
			return nil, fmt.Errorf("ListVolumes: %w", err)
		}
		for _, e := range rsp.GetEntries() {
			if e.GetVolume() == nil || e.GetStatus() == nil {
				continue
			}
			published[e.GetVolume().GetVolumeId()] = e.GetStatus().GetPublishedNodeIds()
		}
		token = rsp.GetNextToken()
		if token == "" {
			return published, nil
		}
		if seen[token] {
			return nil, fmt.Errorf("ListVolumes: the driver returned page token %q twice", token)
		}
		seen[token] = true
	}
}

// GetCapacity calls GetCapacity, bounded by Config.Timeout. An error keeps
// its gRPC status.
func (c *Client) GetCapacity(ctx context.Context, req *csi.GetCapacityRequest) (*csi.GetCapacityResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	rsp, err := c.controller.GetCapacity(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("GetCapacity: %w", err)
	}
	return rsp, nil
}

// ControllerExpandVolume calls ControllerExpandVolume, bounded by
// Config.Timeout. An error keeps its gRPC status. The request's secrets are
// never logged.
func (c *Client) ControllerExpandVolume(ctx context.Context, req *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	rsp, err := c.controller.ControllerExpandVolume(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("ControllerExpandVolume: %w", err)
	}
	return rsp, nil
}

// ControllerModifyVolume calls ControllerModifyVolume, bounded by
// Config.Timeout. An error keeps its gRPC status. The request's secrets are
// never logged.
func (c *Client) ControllerModifyVolume(ctx context.Context, req *csi.ControllerModifyVolumeRequest) (*csi.ControllerModifyVolumeResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	rsp, err := c.controller.ControllerModifyVolume(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("ControllerModifyVolume: %w", err)
	}
	return rsp, nil
}

// NodeGetInfo calls the node service's NodeGetInfo, bounded by
// Config.Timeout: the node ID, its topology and its volume limit.
func (c *Client) NodeGetInfo(ctx context.Context) (*csi.NodeGetInfoResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	rsp, err := c.node.NodeGetInfo(ctx, &csi.NodeGetInfoRequest{})
	if err != nil {
		return nil, fmt.Errorf("NodeGetInfo: %w", err)
	}
	return rsp, nil
}

// NodeGetCapabilities calls the node service's NodeGetCapabilities, bounded
// by Config.Timeout.
func (c *Client) NodeGetCapabilities(ctx context.Context) (*csi.NodeGetCapabilitiesResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	rsp, err := c.node.NodeGetCapabilities(ctx, &csi.NodeGetCapabilitiesRequest{})
	if err != nil {
		return nil, fmt.Errorf("NodeGetCapabilities: %w", err)
	}
	return rsp, nil
}
