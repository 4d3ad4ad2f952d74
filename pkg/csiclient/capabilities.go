package csiclient

import (
	"context"
	"fmt"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/kubernetes-csi/csi-lib-utils/rpc"
)

// Capabilities is the part of a driver's plugin and controller capabilities
// the sidecar controllers act on.
type Capabilities struct {
	// ControllerService: the plugin offers the Controller service at all.
	// Without it every controller capability below is false.
	ControllerService bool `json:"controllerService"`
	// PublishUnpublish: PUBLISH_UNPUBLISH_VOLUME. Without it volumes need no
	// ControllerPublishVolume and VolumeAttachments are simply marked
	// attached.
	PublishUnpublish bool `json:"publishUnpublish"`
	// PublishReadOnly: PUBLISH_READONLY. Without it the CO must send
	// readonly=false in ControllerPublishVolume.
	PublishReadOnly bool `json:"publishReadOnly"`
	// ListVolumes: LIST_VOLUMES.
	ListVolumes bool `json:"listVolumes"`
	// ListVolumesPublishedNodes: LIST_VOLUMES_PUBLISHED_NODES.
	ListVolumesPublishedNodes bool `json:"listVolumesPublishedNodes"`
	// SingleNodeMultiWriter: SINGLE_NODE_MULTI_WRITER, which decides how
	// ReadWriteOnce and ReadWriteOncePod map to CSI access modes.
	SingleNodeMultiWriter bool `json:"singleNodeMultiWriter"`
}

// CanListPublished reports whether ListVolumes tells on which nodes each
// volume is published, which a reconcile against VolumeAttachments needs.
func (c Capabilities) CanListPublished() bool {
	return c.ListVolumes && c.ListVolumesPublishedNodes
}

// probeOnce checks that the driver is ready, then reads its name and
// capabilities, each call bounded by the probe timeout.
func (c *Client) probeOnce(ctx context.Context) (string, Capabilities, error) {
	var caps Capabilities
	ready, err := withTimeout(ctx, c.cfg.ProbeTimeout, func(ctx context.Context) (bool, error) {
		return rpc.Probe(ctx, c.conn)
	})
	if err != nil {
		return "", caps, fmt.Errorf("Probe: %w", err)
	}
	if !ready {
		return "", caps, fmt.Errorf("Probe: the driver reports that it is not ready")
	}
	name, err := withTimeout(ctx, c.cfg.ProbeTimeout, func(ctx context.Context) (string, error) {
		return rpc.GetDriverName(ctx, c.conn)
	})
	if err != nil {
		return "", caps, fmt.Errorf("GetPluginInfo: %w", err)
	}
	plugin, err := withTimeout(ctx, c.cfg.ProbeTimeout, func(ctx context.Context) (rpc.PluginCapabilitySet, error) {
		return rpc.GetPluginCapabilities(ctx, c.conn)
	})
	if err != nil {
		return "", caps, fmt.Errorf("GetPluginCapabilities: %w", err)
	}
	caps.ControllerService = plugin[csi.PluginCapability_Service_CONTROLLER_SERVICE]
	if !caps.ControllerService {
		return name, caps, nil
	}
	ctrl, err := withTimeout(ctx, c.cfg.ProbeTimeout, func(ctx context.Context) (rpc.ControllerCapabilitySet, error) {
		return rpc.GetControllerCapabilities(ctx, c.conn)
	})
	if err != nil {
		return "", caps, fmt.Errorf("ControllerGetCapabilities: %w", err)
	}
	caps.PublishUnpublish = ctrl[csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME]
	caps.PublishReadOnly = ctrl[csi.ControllerServiceCapability_RPC_PUBLISH_READONLY]
	caps.ListVolumes = ctrl[csi.ControllerServiceCapability_RPC_LIST_VOLUMES]
	caps.ListVolumesPublishedNodes = ctrl[csi.ControllerServiceCapability_RPC_LIST_VOLUMES_PUBLISHED_NODES]
	caps.SingleNodeMultiWriter = ctrl[csi.ControllerServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER]
	return name, caps, nil
}

// withTimeout runs f under a child context that ends after d.
func withTimeout[T any](ctx context.Context, d time.Duration, f func(context.Context) (T, error)) (T, error) {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	return f(ctx)
}
