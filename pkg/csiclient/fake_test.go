package csiclient

import (
	"context"
	"net"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// fakeDriver is an in-process CSI Identity and Controller server for the
// tests: its answers are fields the test sets.
type fakeDriver struct {
	csi.UnimplementedIdentityServer
	csi.UnimplementedControllerServer

	name       string
	controller bool // offer the Controller service
	caps       []csi.ControllerServiceCapability_RPC_Type

	mu          sync.Mutex
	notReady    int // answer Probe with ready=false this many more times
	publish     func(context.Context, *csi.ControllerPublishVolumeRequest) (*csi.ControllerPublishVolumeResponse, error)
	publishReqs []*csi.ControllerPublishVolumeRequest
	volumes     []*csi.ListVolumesResponse_Entry
	badToken    bool // ListVolumes: always answer next_token "1"
}

func (d *fakeDriver) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: d.name, VendorVersion: "test"}, nil
}

func (d *fakeDriver) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	rsp := &csi.GetPluginCapabilitiesResponse{}
	if d.controller {
		rsp.Capabilities = append(rsp.Capabilities, &csi.PluginCapability{
			Type: &csi.PluginCapability_Service_{Service: &csi.PluginCapability_Service{Type: csi.PluginCapability_Service_CONTROLLER_SERVICE}},
		})
	}
	return rsp, nil
}

func (d *fakeDriver) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.notReady > 0 {
		d.notReady--
		return &csi.ProbeResponse{Ready: wrapperspb.Bool(false)}, nil
	}
	return &csi.ProbeResponse{Ready: wrapperspb.Bool(true)}, nil
}

func (d *fakeDriver) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	rsp := &csi.ControllerGetCapabilitiesResponse{}
	for _, c := range d.caps {
		rsp.Capabilities = append(rsp.Capabilities, &csi.ControllerServiceCapability{
			Type: &csi.ControllerServiceCapability_Rpc{Rpc: &csi.ControllerServiceCapability_RPC{Type: c}},
		})
	}
	return rsp, nil
}

func (d *fakeDriver) ControllerPublishVolume(ctx context.Context, req *csi.ControllerPublishVolumeRequest) (*csi.ControllerPublishVolumeResponse, error) {
	d.mu.Lock()
	d.publishReqs = append(d.publishReqs, req)
	f := d.publish
	d.mu.Unlock()
	if f == nil {
		return &csi.ControllerPublishVolumeResponse{}, nil
	}
	return f(ctx, req)
}

func (d *fakeDriver) ControllerUnpublishVolume(context.Context, *csi.ControllerUnpublishVolumeRequest) (*csi.ControllerUnpublishVolumeResponse, error) {
	return &csi.ControllerUnpublishVolumeResponse{}, nil
}

// ListVolumes pages through d.volumes; the token is the index of the next
// entry.
func (d *fakeDriver) ListVolumes(_ context.Context, req *csi.ListVolumesRequest) (*csi.ListVolumesResponse, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.badToken {
		return &csi.ListVolumesResponse{NextToken: "1"}, nil
	}
	start := 0
	if req.StartingToken != "" {
		n, err := strconv.Atoi(req.StartingToken)
		if err != nil || n > len(d.volumes) {
			return nil, status.Error(codes.Aborted, "bad token")
		}
		start = n
	}
	end := len(d.volumes)
	if req.MaxEntries > 0 && start+int(req.MaxEntries) < end {
		end = start + int(req.MaxEntries)
	}
	rsp := &csi.ListVolumesResponse{Entries: d.volumes[start:end]}
	if end < len(d.volumes) {
		rsp.NextToken = strconv.Itoa(end)
	}
	return rsp, nil
}

// serve starts d on a unix socket at path and stops it at the end of the
// test (or earlier through the returned func).
func serve(t *testing.T, path string, d *fakeDriver) (stop func()) {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatalf("listen on %s: %v", path, err)
	}
	s := grpc.NewServer()
	csi.RegisterIdentityServer(s, d)
	csi.RegisterControllerServer(s, d)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = s.Serve(l)
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			s.Stop()
			<-done
		})
	}
	t.Cleanup(stop)
	return stop
}

func socketPath(t *testing.T) string {
	return filepath.Join(t.TempDir(), "csi.sock")
}

func volume(id string, nodes ...string) *csi.ListVolumesResponse_Entry {
	sort.Strings(nodes)
	return &csi.ListVolumesResponse_Entry{
		Volume: &csi.Volume{VolumeId: id},
		Status: &csi.ListVolumesResponse_VolumeStatus{PublishedNodeIds: nodes},
	}
}
