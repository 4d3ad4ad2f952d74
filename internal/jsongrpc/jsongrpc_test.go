package jsongrpc

import (
	"context"
	"errors"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
)

type echoReq struct {
	Text string `json:"text"`
}

type echoResp struct {
	Text  string `json:"text"`
	Calls int    `json:"calls"`
}

type echoer interface {
	Echo(context.Context, *echoReq) (*echoResp, error)
}

type echo struct{ calls int }

func (e *echo) Echo(_ context.Context, req *echoReq) (*echoResp, error) {
	e.calls++
	if req.Text == "" {
		return nil, status.Error(codes.InvalidArgument, "text is empty")
	}
	return &echoResp{Text: req.Text, Calls: e.calls}, nil
}

// serve runs a gRPC server with the echo service (and an interceptor that
// records the method names it saw) and returns a connection to it.
func serve(t *testing.T) (grpc.ClientConnInterface, *[]string) {
	t.Helper()
	var seen []string
	l := bufconn.Listen(1 << 20)
	s := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		seen = append(seen, info.FullMethod)
		return h(ctx, req)
	}))
	e := &echo{}
	Register(s, "test.Echo", (*echoer)(nil), e, Method[echoReq, echoResp]{Name: "Echo", Call: e.Echo}.Desc("test.Echo"))
	go func() { _ = s.Serve(l) }()
	t.Cleanup(s.Stop)
	cc, err := grpc.NewClient("passthrough:///bufconn",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return l.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc, &seen
}

func TestRoundTrip(t *testing.T) {
	cc, seen := serve(t)
	ctx := context.Background()
	for i, text := range []string{"one", "two"} {
		resp, err := Invoke[echoResp](ctx, cc, FullMethod("test.Echo", "Echo"), &echoReq{Text: text})
		if err != nil {
			t.Fatalf("Echo(%q): %v", text, err)
		}
		if resp.Text != text || resp.Calls != i+1 {
			t.Errorf("Echo(%q) = %+v, want the text back and call %d", text, resp, i+1)
		}
	}
	if len(*seen) != 2 || (*seen)[0] != "/test.Echo/Echo" {
		t.Errorf("the interceptor saw %q, want /test.Echo/Echo twice", *seen)
	}
}

func TestErrorsKeepTheirCode(t *testing.T) {
	cc, _ := serve(t)
	ctx := context.Background()
	_, err := Invoke[echoResp](ctx, cc, FullMethod("test.Echo", "Echo"), &echoReq{})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("empty text: %v, want INVALID_ARGUMENT", err)
	}
	_, err = Invoke[echoResp](ctx, cc, FullMethod("test.Other", "Echo"), &echoReq{Text: "x"})
	if status.Code(err) != codes.Unimplemented {
		t.Errorf("a service the server lacks: %v, want UNIMPLEMENTED", err)
	}
}

func TestMalformedRequest(t *testing.T) {
	cc, seen := serve(t)
	// A message that is not the request's JSON fails to decode on the
	// server, before the method runs.
	_, err := Invoke[echoResp](context.Background(), cc, FullMethod("test.Echo", "Echo"), []int{1, 2})
	var se interface{ GRPCStatus() *status.Status }
	if !errors.As(err, &se) || status.Code(err) == codes.OK {
		t.Fatalf("a malformed request: %v, want a gRPC error", err)
	}
	if len(*seen) != 0 {
		t.Errorf("the method ran on a malformed request (%q)", *seen)
	}
}
