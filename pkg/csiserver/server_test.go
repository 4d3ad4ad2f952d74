package csiserver

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2/ktesting"
)

// identity fails in the ways the interceptor must translate.
type identity struct {
	csi.UnimplementedIdentityServer
}

func (identity) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return nil, errors.New("plain error")
}

func (identity) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	panic("boom")
}

func (identity) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	return nil, status.Error(codes.NotFound, "kept")
}

func TestServeMapsErrorsAndPanics(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	sock := filepath.Join(t.TempDir(), "csi.sock")
	// A stale socket from an earlier run is replaced.
	if l, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"}); err != nil {
		t.Fatal(err)
	} else {
		l.SetUnlinkOnClose(false)
		l.Close()
	}
	srv, err := Listen(ctx, Config{Endpoint: "unix://" + sock, Identity: identity{}})
	if err != nil {
		t.Fatal(err)
	}
	if st, err := os.Lstat(sock); err != nil || st.Mode().Type() != os.ModeSocket || st.Mode().Perm() != 0o600 {
		t.Fatalf("driver socket: %v, %v; want an owner-only (0600) socket", st, err)
	}
	done := make(chan error)
	go func() { done <- srv.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
		if _, err := os.Stat(sock); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("socket left behind: %v", err)
		}
	})
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := csi.NewIdentityClient(conn)
	_, err = c.GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
	if status.Code(err) != codes.Internal {
		t.Errorf("plain error became %v, want Internal", err)
	}
	_, err = c.Probe(ctx, &csi.ProbeRequest{})
	if status.Code(err) != codes.Internal {
		t.Errorf("panic became %v, want Internal", err)
	}
	_, err = c.GetPluginCapabilities(ctx, &csi.GetPluginCapabilitiesRequest{})
	if status.Code(err) != codes.NotFound {
		t.Errorf("status error became %v, want it kept", err)
	}
}
