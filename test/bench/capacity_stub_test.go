package bench

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// capacityStub is a CSI controller served by the benchmark process for the
// capacity benchmark: its GetCapacity answers, per zone of the topology key,
// a figure the benchmark sets (a volume made or deleted changes it before
// the PersistentVolume appears or goes, as with a real driver), and counts
// the calls. It offers CREATE_DELETE_VOLUME and GET_CAPACITY and topology,
// like a local-volume driver; nothing is ever provisioned.
type capacityStub struct {
	csi.UnimplementedIdentityServer
	csi.UnimplementedControllerServer

	name  string
	mu    sync.Mutex
	free  map[string]int64 // zone → available bytes
	calls atomic.Int64

	Socket string
	server *grpc.Server
}

// startCapacityStub serves a stub named name until tb ends, on a socket in a
// fresh short temporary directory.
func startCapacityStub(tb testing.TB, name string, free map[string]int64) *capacityStub {
	tb.Helper()
	dir, err := os.MkdirTemp("", "lvbench-cap-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	s := &capacityStub{name: name, free: free, Socket: filepath.Join(dir, "csi.sock")}
	ln, err := net.Listen("unix", s.Socket)
	if err != nil {
		tb.Fatal(err)
	}
	s.server = grpc.NewServer()
	csi.RegisterIdentityServer(s.server, s)
	csi.RegisterControllerServer(s.server, s)
	go s.server.Serve(ln)
	tb.Cleanup(s.server.Stop)
	return s
}

// add changes the figure of zone by delta and returns the new one.
func (s *capacityStub) add(zone string, delta int64) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.free[zone] += delta
	return s.free[zone]
}

func (s *capacityStub) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: s.name, VendorVersion: "bench-stub"}, nil
}

func (s *capacityStub) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	return &csi.ProbeResponse{Ready: wrapperspb.Bool(true)}, nil
}

func (s *capacityStub) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	svc := func(t csi.PluginCapability_Service_Type) *csi.PluginCapability {
		return &csi.PluginCapability{Type: &csi.PluginCapability_Service_{Service: &csi.PluginCapability_Service{Type: t}}}
	}
	return &csi.GetPluginCapabilitiesResponse{Capabilities: []*csi.PluginCapability{
		svc(csi.PluginCapability_Service_CONTROLLER_SERVICE),
		svc(csi.PluginCapability_Service_VOLUME_ACCESSIBILITY_CONSTRAINTS),
	}}, nil
}

func (s *capacityStub) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	resp := &csi.ControllerGetCapabilitiesResponse{}
	for _, t := range []csi.ControllerServiceCapability_RPC_Type{
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
		csi.ControllerServiceCapability_RPC_GET_CAPACITY,
	} {
		resp.Capabilities = append(resp.Capabilities, &csi.ControllerServiceCapability{
			Type: &csi.ControllerServiceCapability_Rpc{Rpc: &csi.ControllerServiceCapability_RPC{Type: t}},
		})
	}
	return resp, nil
}

// GetCapacity answers the zone's figure; maximum_volume_size is the same
// figure, as for a driver whose zone is one pool.
func (s *capacityStub) GetCapacity(_ context.Context, req *csi.GetCapacityRequest) (*csi.GetCapacityResponse, error) {
	s.calls.Add(1)
	zone := req.GetAccessibleTopology().GetSegments()[capZoneKey]
	s.mu.Lock()
	free, ok := s.free[zone]
	s.mu.Unlock()
	if !ok {
		return nil, status.Errorf(codes.InvalidArgument, "no zone %q", zone)
	}
	return &csi.GetCapacityResponse{AvailableCapacity: free, MaximumVolumeSize: wrapperspb.Int64(free)}, nil
}
