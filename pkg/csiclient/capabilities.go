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
	// GetCapacity: GET_CAPACITY.
	GetCapacity bool `json:"getCapacity"`
	// ExpandVolume: the controller's EXPAND_VOLUME (ControllerExpandVolume).
	ExpandVolume bool `json:"expandVolume"`
	// ModifyVolume: MODIFY_VOLUME (ControllerModifyVolume, the
	// VolumeAttributesClass parameters of a volume).
	ModifyVolume bool `json:"modifyVolume"`
	// Topology: the plugin's VOLUME_ACCESSIBILITY_CONSTRAINTS; volumes are
	// reachable only from some topology segments.
	Topology bool `json:"topology"`
	// OnlineExpansion and OfflineExpansion: the plugin's VolumeExpansion
	// capability; whether a volume can grow while published, or only when
	// it is not.
	OnlineExpansion  bool `json:"onlineExpansion"`
	OfflineExpansion bool `json:"offlineExpansion"`
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
	// Asked directly rather than through csi-lib-utils' rpc helper, which
	// keeps only the service capabilities and drops VolumeExpansion.
	plugin, err := withTimeout(ctx, c.cfg.ProbeTimeout, func(ctx context.Context) (*csi.GetPluginCapabilitiesResponse, error) {
		return csi.NewIdentityClient(c.conn).GetPluginCapabilities(ctx, &csi.GetPluginCapabilitiesRequest{})
	})
	if err != nil {
		return "", caps, fmt.Errorf("GetPluginCapabilities: %w", err)
	}
	for _, pc := range plugin.GetCapabilities() {
		switch pc.GetService().GetType() {
		case csi.PluginCapability_Service_CONTROLLER_SERVICE:
			caps.ControllerService = true
		case csi.PluginCapability_Service_VOLUME_ACCESSIBILITY_CONSTRAINTS:
			caps.Topology = true
		}
		switch pc.GetVolumeExpansion().GetType() {
		case csi.PluginCapability_VolumeExpansion_ONLINE:
			caps.OnlineExpansion = true
		case csi.PluginCapability_VolumeExpansion_OFFLINE:
			caps.OfflineExpansion = true
		}
	}
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
	caps.GetCapacity = ctrl[csi.ControllerServiceCapability_RPC_GET_CAPACITY]
	caps.ExpandVolume = ctrl[csi.ControllerServiceCapability_RPC_EXPAND_VOLUME]
	caps.ModifyVolume = ctrl[csi.ControllerServiceCapability_RPC_MODIFY_VOLUME]
	return name, caps, nil
}

// withTimeout runs f under a child context that ends after d.
func withTimeout[T any](ctx context.Context, d time.Duration, f func(context.Context) (T, error)) (T, error) {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	return f(ctx)
}
