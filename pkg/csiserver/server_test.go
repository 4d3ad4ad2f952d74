package csiserver

import (
	"context"
	"errors"
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

func TestParseEndpoint(t *testing.T) {
	tests := []struct {
		in   string
		want string
		ok   bool
	}{
		{in: "unix:///run/csi/csi.sock", want: "/run/csi/csi.sock", ok: true},
		{in: "unix:///run/csi/../csi.sock", want: "/run/csi.sock", ok: true},
		{in: "unix://relative.sock"},
		{in: "tcp://127.0.0.1:10000"},
		{in: "/run/csi.sock"},
		{in: "unix:///a\x00b"},
		{in: ""},
	}
	for _, tc := range tests {
		got, err := ParseEndpoint(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParseEndpoint(%q) = %q, %v; want %q, ok=%t", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

func TestListenRefusesAnOrdinaryFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "data")
	if err := os.WriteFile(path, []byte("precious"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := listen(path); err == nil {
		t.Fatal("listen over a regular file succeeded")
	}
	if data, _ := os.ReadFile(path); string(data) != "precious" {
		t.Fatal("the file was changed")
	}
}

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
	if l, err := listen(sock); err != nil {
		t.Fatal(err)
	} else {
		l.(interface{ SetUnlinkOnClose(bool) }).SetUnlinkOnClose(false)
		l.Close()
	}
	srv, err := Listen(ctx, Config{Endpoint: "unix://" + sock, Identity: identity{}})
	if err != nil {
		t.Fatal(err)
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
