package csiserver

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/kubernetes-csi/csi-lib-utils/metrics"
	"github.com/kubernetes-csi/csi-lib-utils/protosanitizer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/loopvol/loopvol/internal/unixsock"
	"github.com/loopvol/loopvol/pkg/fenceapi"
	"github.com/loopvol/loopvol/pkg/statusapi"
)

// Config says what to serve where.
type Config struct {
	// Endpoint is "unix:///path/to/csi.sock".
	Endpoint string
	// Identity is always served; Controller and Node when not nil.
	Identity   csi.IdentityServer
	Controller csi.ControllerServer
	Node       csi.NodeServer
	// Fence is loopvol's fencing service (pkg/fenceapi), beside the
	// Controller service; may be nil.
	Fence fenceapi.FenceServer
	// Status is loopvol's status service (pkg/statusapi), beside the Node
	// service; may be nil.
	Status statusapi.StatusServer
	// Metrics records csi_plugin_operations_seconds; may be nil.
	Metrics metrics.CSIMetricsManager
}

// Server is a running CSI gRPC server.
type Server struct {
	grpc     *grpc.Server
	listener *unixsock.Listener
}

// Listen opens the socket and registers the services; Serve starts answering.
// Splitting the two lets the caller report "listening" only once the socket
// exists.
func Listen(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.Identity == nil {
		return nil, errors.New("an identity server is required")
	}
	path, err := unixsock.ParseEndpoint(cfg.Endpoint)
	if err != nil {
		return nil, err
	}
	// Owner-only: kubelet and the sidecars run as the driver's user (root).
	l, err := unixsock.Listen(path, 0o600)
	if err != nil {
		return nil, err
	}
	logger := klog.FromContext(ctx)
	g := grpc.NewServer(grpc.UnaryInterceptor(interceptor(logger, cfg.Metrics)))
	csi.RegisterIdentityServer(g, cfg.Identity)
	if cfg.Controller != nil {
		csi.RegisterControllerServer(g, cfg.Controller)
		// The group snapshot RPCs are a service of their own in CSI; the
		// controller serves them when it implements them.
		if gc, ok := cfg.Controller.(csi.GroupControllerServer); ok {
			csi.RegisterGroupControllerServer(g, gc)
		}
	}
	if cfg.Node != nil {
		csi.RegisterNodeServer(g, cfg.Node)
	}
	if cfg.Fence != nil {
		fenceapi.RegisterFenceServer(g, cfg.Fence)
	}
	if cfg.Status != nil {
		statusapi.RegisterStatusServer(g, cfg.Status)
	}
	return &Server{grpc: g, listener: l}, nil
}

// Serve answers requests until ctx is done, then stops: running calls get
// up to a grace period to finish, and the socket file is removed (unless
// another process has replaced it meanwhile).
func (s *Server) Serve(ctx context.Context) error {
	errc := make(chan error, 1)
	go func() { errc <- s.grpc.Serve(s.listener) }()
	select {
	case err := <-errc:
		_ = s.listener.Close()
		return err
	case <-ctx.Done():
	}
	stopped := make(chan struct{})
	go func() { s.grpc.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(30 * time.Second):
		// A mkfs of a huge volume must not hold up a restart forever.
		s.grpc.Stop()
	}
	// Stopping closed the listener already; Close is idempotent.
	_ = s.listener.Close()
	return nil
}

// volumeIDGetter matches every CSI request that carries a volume ID.
type volumeIDGetter interface{ GetVolumeId() string }

func interceptor(base klog.Logger, m metrics.CSIMetricsManager) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		start := time.Now()
		logger := base.WithValues("method", info.FullMethod)
		if r, ok := req.(volumeIDGetter); ok && r.GetVolumeId() != "" {
			logger = logger.WithValues("volumeID", r.GetVolumeId())
		}
		ctx = klog.NewContext(ctx, logger)
		logger.V(5).Info("Received request", "request", protosanitizer.StripSecrets(req))
		defer func() {
			if r := recover(); r != nil {
				logger.Error(fmt.Errorf("panic: %v", r), "Request handler panicked", "stack", string(debug.Stack()))
				err = status.Error(codes.Internal, "internal error (panic); see the driver log")
			}
			if err != nil {
				if _, isStatus := status.FromError(err); !isStatus {
					err = status.Error(codes.Internal, err.Error())
				}
				logger.V(2).Info("Request failed", "code", status.Code(err), "err", err, "duration", time.Since(start))
			} else {
				logger.V(5).Info("Sent response", "response", protosanitizer.StripSecrets(resp), "duration", time.Since(start))
			}
			if m != nil {
				m.RecordMetrics(info.FullMethod, err, time.Since(start))
			}
		}()
		return handler(ctx, req)
	}
}
