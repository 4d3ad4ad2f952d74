package controller

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/loopvol/loopvol/pkg/pool"
	"google.golang.org/protobuf/types/known/wrapperspb"
	"k8s.io/klog/v2"
)

// Identity is the CSI Identity service; both driver modes serve it.
type Identity struct {
	csi.UnimplementedIdentityServer
	name, version string
	controller    bool
	pools         []*pool.Pool
}

// NewIdentity returns the Identity service. withController says whether this
// process also serves the Controller service (the plugin capability).
func NewIdentity(driverName, version string, withController bool, pools []*pool.Pool) *Identity {
	return &Identity{name: driverName, version: version, controller: withController, pools: pools}
}

// GetPluginInfo returns the driver name and version.
func (i *Identity) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: i.name, VendorVersion: i.version}, nil
}

// GetPluginCapabilities reports topology, online expansion and, in controller
// mode, the Controller and GroupController services and snapshot topology.
func (i *Identity) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	service := func(t csi.PluginCapability_Service_Type) *csi.PluginCapability {
		return &csi.PluginCapability{Type: &csi.PluginCapability_Service_{Service: &csi.PluginCapability_Service{Type: t}}}
	}
	caps := []*csi.PluginCapability{
		service(csi.PluginCapability_Service_VOLUME_ACCESSIBILITY_CONSTRAINTS),
		{Type: &csi.PluginCapability_VolumeExpansion_{VolumeExpansion: &csi.PluginCapability_VolumeExpansion{Type: csi.PluginCapability_VolumeExpansion_ONLINE}}},
	}
	if i.controller {
		caps = append(caps, service(csi.PluginCapability_Service_CONTROLLER_SERVICE),
			service(csi.PluginCapability_Service_GROUP_CONTROLLER_SERVICE),
			service(csi.PluginCapability_Service_SNAPSHOT_ACCESSIBILITY_CONSTRAINTS))
	}
	return &csi.GetPluginCapabilitiesResponse{Capabilities: caps}, nil
}

// Probe is ready while at least one pool is usable (its directory carries
// our marker and accepts writes), or there is none: a pool that is full or
// broken fails only its own volumes' calls (a name's locks leave it out,
// lockInEveryPool), so it must not take the whole plugin, and with it the
// sidecar, out of service. Each unusable pool is logged here, reported in
// loopvol_pool_usable and in NodeGetStorageHealth.
func (i *Identity) Probe(ctx context.Context, _ *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	usable := 0
	for _, p := range i.pools {
		if err := p.Check(); err != nil {
			klog.FromContext(ctx).Error(err, "Pool is not usable", "pool", p.Name)
			continue
		}
		usable++
	}
	return &csi.ProbeResponse{Ready: wrapperspb.Bool(usable > 0 || len(i.pools) == 0)}, nil
}
