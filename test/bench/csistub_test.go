package bench

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// stubCSI is a CSI controller served by the benchmark process itself: it
// publishes nothing, but it answers like a driver whose ControllerPublish and
// ControllerUnpublish take a fixed time, counts the calls per volume and
// keeps the published set that ListVolumes reports. With it the benchmark
// measures the attacher and the API server, not a driver.
type stubCSI struct {
	csi.UnimplementedIdentityServer
	csi.UnimplementedControllerServer

	name        string
	latency     time.Duration
	listVolumes bool

	mu          sync.Mutex
	publishes   map[string]int             // volume ID → ControllerPublishVolume calls
	unpublishes map[string]int             // volume ID → ControllerUnpublishVolume calls
	published   map[string]map[string]bool // volume ID → node IDs it is published on
	probed      chan struct{}              // closed at the first ControllerGetCapabilities
	probedOnce  sync.Once

	Socket string
	server *grpc.Server
}

// startStubCSI serves a stub driver named name on a unix socket in a fresh
// temporary directory (short, whatever the benchmark's name: a socket path
// must fit in 108 bytes) until tb ends.
func startStubCSI(tb testing.TB, name string, latency time.Duration, listVolumes bool) *stubCSI {
	tb.Helper()
	dir, err := os.MkdirTemp("", "lvbench-csi-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	s := &stubCSI{
		name:        name,
		latency:     latency,
		listVolumes: listVolumes,
		publishes:   map[string]int{},
		unpublishes: map[string]int{},
		published:   map[string]map[string]bool{},
		probed:      make(chan struct{}),
		Socket:      filepath.Join(dir, "csi.sock"),
	}
	ln, err := net.Listen("unix", s.Socket)
	if err != nil {
		tb.Fatal(err)
	}
	s.server = grpc.NewServer()
	csi.RegisterIdentityServer(s.server, s)
	csi.RegisterControllerServer(s.server, s)
	go s.server.Serve(ln)
	tb.Cleanup(s.Stop)
	return s
}

// Stop closes the socket and ends the calls in flight.
func (s *stubCSI) Stop() { s.server.Stop() }

// Probed is closed once a client has asked for the controller capabilities:
// both attachers do that after connecting and before they start work.
func (s *stubCSI) Probed() <-chan struct{} { return s.probed }

// calls returns the publish and unpublish counts of the volumes handles.
func (s *stubCSI) calls(handles []string) (publishes, unpublishes []int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	publishes, unpublishes = make([]int, len(handles)), make([]int, len(handles))
	for i, h := range handles {
		publishes[i], unpublishes[i] = s.publishes[h], s.unpublishes[h]
	}
	return publishes, unpublishes
}

// publishedCount returns how many of handles are published on some node.
func (s *stubCSI) publishedCount(handles []string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, h := range handles {
		if len(s.published[h]) > 0 {
			n++
		}
	}
	return n
}

func (s *stubCSI) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: s.name, VendorVersion: "bench-stub"}, nil
}

func (s *stubCSI) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	return &csi.ProbeResponse{Ready: wrapperspb.Bool(true)}, nil
}

func (s *stubCSI) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	return &csi.GetPluginCapabilitiesResponse{Capabilities: []*csi.PluginCapability{{
		Type: &csi.PluginCapability_Service_{Service: &csi.PluginCapability_Service{Type: csi.PluginCapability_Service_CONTROLLER_SERVICE}},
	}}}, nil
}

func (s *stubCSI) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	s.probedOnce.Do(func() { close(s.probed) })
	types := []csi.ControllerServiceCapability_RPC_Type{csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME}
	if s.listVolumes {
		types = append(types, csi.ControllerServiceCapability_RPC_LIST_VOLUMES, csi.ControllerServiceCapability_RPC_LIST_VOLUMES_PUBLISHED_NODES)
	}
	resp := &csi.ControllerGetCapabilitiesResponse{}
	for _, t := range types {
		resp.Capabilities = append(resp.Capabilities, &csi.ControllerServiceCapability{
			Type: &csi.ControllerServiceCapability_Rpc{Rpc: &csi.ControllerServiceCapability_RPC{Type: t}},
		})
	}
	return resp, nil
}

// sleep waits the configured latency, or fails the call when the caller
// gives up first (as a driver would see its context cancelled).
func (s *stubCSI) sleep(ctx context.Context) error {
	if s.latency <= 0 {
		return nil
	}
	t := time.NewTimer(s.latency)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	}
}

func (s *stubCSI) ControllerPublishVolume(ctx context.Context, req *csi.ControllerPublishVolumeRequest) (*csi.ControllerPublishVolumeResponse, error) {
	if req.GetVolumeId() == "" || req.GetNodeId() == "" || req.GetVolumeCapability() == nil {
		return nil, status.Error(codes.InvalidArgument, "volume ID, node ID and capability are required")
	}
	s.mu.Lock()
	s.publishes[req.VolumeId]++
	s.mu.Unlock()
	if err := s.sleep(ctx); err != nil {
		return nil, err
	}
	s.mu.Lock()
	nodes := s.published[req.VolumeId]
	if nodes == nil {
		nodes = map[string]bool{}
		s.published[req.VolumeId] = nodes
	}
	nodes[req.NodeId] = true
	s.mu.Unlock()
	return &csi.ControllerPublishVolumeResponse{PublishContext: map[string]string{"device": "/dev/bench/" + req.VolumeId}}, nil
}

func (s *stubCSI) ControllerUnpublishVolume(ctx context.Context, req *csi.ControllerUnpublishVolumeRequest) (*csi.ControllerUnpublishVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume ID is required")
	}
	s.mu.Lock()
	s.unpublishes[req.VolumeId]++
	s.mu.Unlock()
	if err := s.sleep(ctx); err != nil {
		return nil, err
	}
	s.mu.Lock()
	if req.NodeId == "" {
		delete(s.published, req.VolumeId)
	} else if nodes := s.published[req.VolumeId]; nodes != nil {
		delete(nodes, req.NodeId)
		if len(nodes) == 0 {
			delete(s.published, req.VolumeId)
		}
	}
	s.mu.Unlock()
	return &csi.ControllerUnpublishVolumeResponse{}, nil
}

// ListVolumes reports the published set as it is at the call: every volume
// published somewhere, with its nodes, paged by max_entries with the index
// of the next entry as the token.
func (s *stubCSI) ListVolumes(_ context.Context, req *csi.ListVolumesRequest) (*csi.ListVolumesResponse, error) {
	if !s.listVolumes {
		return nil, status.Error(codes.Unimplemented, "ListVolumes is off")
	}
	s.mu.Lock()
	ids := make([]string, 0, len(s.published))
	nodes := make(map[string][]string, len(s.published))
	for id, set := range s.published {
		ids = append(ids, id)
		for n := range set {
			nodes[id] = append(nodes[id], n)
		}
	}
	s.mu.Unlock()
	slices.Sort(ids)
	start := 0
	if tok := req.GetStartingToken(); tok != "" {
		n, err := strconv.Atoi(tok)
		if err != nil || n < 0 || n > len(ids) {
			return nil, status.Errorf(codes.Aborted, "bad starting token %q", tok)
		}
		start = n
	}
	end := len(ids)
	if m := int(req.GetMaxEntries()); m > 0 && start+m < end {
		end = start + m
	}
	resp := &csi.ListVolumesResponse{}
	for _, id := range ids[start:end] {
		slices.Sort(nodes[id])
		resp.Entries = append(resp.Entries, &csi.ListVolumesResponse_Entry{
			Volume: &csi.Volume{VolumeId: id},
			Status: &csi.ListVolumesResponse_VolumeStatus{PublishedNodeIds: nodes[id]},
		})
	}
	if end < len(ids) {
		resp.NextToken = strconv.Itoa(end)
	}
	return resp, nil
}
