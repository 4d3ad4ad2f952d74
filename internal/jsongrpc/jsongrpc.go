// Package jsongrpc serves and calls gRPC methods whose messages are plain Go
// structs encoded as JSON: loopvol's own services beside CSI on the
// driver's socket (pkg/fenceapi, pkg/statusapi).
//
// JSON instead of protobuf keeps protoc out of the build: both ends are
// always built from the same tree, and the messages are a few structs. The
// codec is registered under the content subtype "json" and used only by
// calls that ask for it (Invoke does), so the protobuf calls of CSI on the
// same server are untouched.
package jsongrpc

import (
	"context"
	"encoding/json"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
)

// Method is one unary method of a service: Call is given the decoded
// request and returns the response.
type Method[Req, Resp any] struct {
	// Name is the method's name within its service ("FenceNode").
	Name string
	Call func(ctx context.Context, req *Req) (*Resp, error)
}

// Desc is the gRPC description of a method, to put in a ServiceDesc.
func (m Method[Req, Resp]) Desc(service string) grpc.MethodDesc {
	full := FullMethod(service, m.Name)
	return grpc.MethodDesc{
		MethodName: m.Name,
		Handler: func(_ any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
			req := new(Req)
			if err := dec(req); err != nil {
				return nil, err
			}
			call := func(ctx context.Context, req any) (any, error) { return m.Call(ctx, req.(*Req)) }
			if interceptor == nil {
				return call(ctx, req)
			}
			return interceptor(ctx, req, &grpc.UnaryServerInfo{FullMethod: full}, call)
		},
	}
}

// Register serves the methods as service on s. handlerType is a nil
// pointer to the service's interface, which gRPC checks the server against
// (srv must implement it).
func Register(s grpc.ServiceRegistrar, service string, handlerType, srv any, methods ...grpc.MethodDesc) {
	s.RegisterService(&grpc.ServiceDesc{ServiceName: service, HandlerType: handlerType, Methods: methods}, srv)
}

// FullMethod is a method's name on the wire: "/service/method".
func FullMethod(service, method string) string { return "/" + service + "/" + method }

// Invoke calls a unary method with JSON messages. A server without the
// service answers UNIMPLEMENTED.
func Invoke[Resp any](ctx context.Context, cc grpc.ClientConnInterface, fullMethod string, req any) (*Resp, error) {
	resp := new(Resp)
	if err := cc.Invoke(ctx, fullMethod, req, resp, grpc.CallContentSubtype(codecName)); err != nil {
		return nil, err
	}
	return resp, nil
}

const codecName = "json"

// codec marshals the messages. Registered under "json", it is what gRPC
// uses for calls of content type application/grpc+json only.
type codec struct{}

func (codec) Marshal(v any) ([]byte, error)      { return json.Marshal(v) }
func (codec) Unmarshal(data []byte, v any) error { return json.Unmarshal(data, v) }
func (codec) Name() string                       { return codecName }

func init() { encoding.RegisterCodec(codec{}) }
