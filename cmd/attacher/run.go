package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"

	"github.com/kubernetes-csi/csi-lib-utils/connection"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/flowcontrol"
	_ "k8s.io/component-base/metrics/prometheus/clientgo/leaderelection" // leader-election metrics in the legacy registry
	_ "k8s.io/component-base/metrics/prometheus/workqueue"               // workqueue metrics in the legacy registry
	"k8s.io/klog/v2"

	"github.com/loopvol/loopvol/internal/health"
	"github.com/loopvol/loopvol/internal/kube"
	"github.com/loopvol/loopvol/internal/kube/leasewatch"
	"github.com/loopvol/loopvol/pkg/csiclient"
	"github.com/loopvol/loopvol/pkg/metrics"
)

// run connects everything and runs the controllers until ctx ends (nil) or
// something fails for good (an error).
func run(ctx context.Context, cfg *config) error {
	logger := klog.FromContext(ctx)
	logger.Info("Starting", "version", version, "controllers", cfg.controllers, "csiAddress", cfg.csiAddress,
		"workerThreads", cfg.workerThreads, "kubeAPIQPS", cfg.kubeAPIQPS, "kubeAPIBurst", cfg.kubeAPIBurst,
		"nodeDeployment", cfg.nodeDeployment, "nodeName", cfg.nodeName)
	connection.SetMaxGRPCLogLength(cfg.maxGRPCLogLength)

	d := &deps{cfg: cfg, health: &health.Checks{}, env: os.Getenv}
	// A registrar in kubelet mode has no RBAC at all: it must not even
	// build a client that could be used by mistake.
	if cfg.needsAPI() {
		restConfig, err := kubeConfig(cfg)
		if err != nil {
			return err
		}
		client, err := kube.NewClient(restConfig)
		if err != nil {
			return err
		}
		d.rest, d.client = restConfig, client
		d.informers = kube.NewInformers(client, cfg.resync)
	}

	// Metrics: CSI call latency (csi-lib-utils), the workqueue and
	// leader-election metrics (legacy registry) and the controllers' own.
	csiMetrics, ownMetrics := metrics.NewSidecar()
	d.registry = ownMetrics

	var csiConn atomic.Pointer[csiclient.Client]
	d.health.Add("csi", func() error {
		if c := csiConn.Load(); c != nil {
			return c.Healthy()
		}
		return fmt.Errorf("connecting to the CSI driver at %s", cfg.csiAddress)
	})
	var leaderHealth *leasewatch.Health
	if cfg.leaderElection {
		leaderHealth = &leasewatch.Health{}
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	if cfg.httpEndpoint != "" {
		mux := http.NewServeMux()
		csiMetrics.RegisterToServer(mux, cfg.metricsPath)
		if cfg.enablePprof {
			csiMetrics.RegisterPprofToServer(mux)
		}
		d.health.Register(mux)
		if leaderHealth != nil {
			mux.Handle("/healthz/leader-election", health.Handler(leaderHealth.Check, http.StatusInternalServerError))
		}
		// Listen before anything slow, so a bad address fails at once and
		// /healthz answers while the driver is awaited.
		ln, err := net.Listen("tcp", cfg.httpEndpoint)
		if err != nil {
			return fmt.Errorf("--http-endpoint: %w", err)
		}
		logger.Info("Serving HTTP", "address", ln.Addr().String(), "metricsPath", cfg.metricsPath)
		wg.Go(func() {
			if err := health.Serve(ctx, ln, mux); err != nil {
				cancel(fmt.Errorf("HTTP server: %w", err))
			}
		})
	}

	conn, err := csiclient.Connect(ctx, csiclient.Config{
		Address:    cfg.csiAddress,
		Timeout:    cfg.timeout,
		MaxEntries: cfg.maxEntries,
		Metrics:    csiMetrics,
	})
	if err != nil {
		return stopReason(ctx, err)
	}
	defer func() { _ = conn.Close() }()
	csiConn.Store(conn)
	d.csi = conn
	d.driver = conn.DriverName()
	logger = klog.LoggerWithValues(logger, "driver", d.driver)
	ctx = klog.NewContext(ctx, logger)

	runners, err := buildControllers(d)
	if err != nil {
		return err
	}
	if d.informers != nil {
		// Every replica runs the informers, leader or not: a standby that
		// takes over has a warm cache and acts at once. The controllers add
		// their handlers only when they start.
		d.informers.Start(ctx)
	}
	for i, r := range runners {
		if !cfg.leaderElection || r.lease == "" {
			continue
		}
		lease := r.lease
		if cfg.nodeDeployment {
			lease = nodeLeaseName(lease, cfg.nodeName)
		}
		le, lerr := newLeaderConfig(cfg, d.rest, lease, leaderHealth.Add())
		if lerr != nil {
			return lerr
		}
		inner := r.run
		runners[i].run = func(ctx context.Context) error { return leasewatch.Run(ctx, le, inner) }
	}
	if err := runControllers(ctx, runners); err != nil {
		return err
	}
	return stopReason(ctx, nil)
}

// needsAPI tells whether any chosen controller talks to the API server.
func (c *config) needsAPI() bool {
	for _, name := range c.controllers {
		if name != controllerRegistrar || c.registrar.needsAPI() {
			return true
		}
	}
	return false
}

// deps is what the controllers are built from.
type deps struct {
	cfg *config
	// rest is the API client configuration, for a client of a
	// controller's own (its own rate limit); nil when no chosen controller
	// needs the API, like client and informers.
	rest      *rest.Config
	client    kube.Client
	informers *kube.Informers
	csi       *csiclient.Client
	driver    string
	registry  prometheus.Registerer
	health    *health.Checks
	// env reads the environment (NAMESPACE, POD_NAME).
	env func(string) string
}

// runner is one controller's Run, and the Lease it runs under with
// --leader-election ("" for none).
type runner struct {
	name  string
	lease string
	run   func(context.Context) error
}

// buildControllers builds the controllers named in --controllers.
func buildControllers(d *deps) ([]runner, error) {
	builders := map[string]func(*deps) (*runner, error){
		controllerAttach:    buildAttach,
		controllerCapacity:  buildCapacity,
		controllerRegistrar: buildRegistrar,
		controllerResizer:   buildResizer,
		controllerWebhook:   buildWebhook,
		controllerPlacement: buildPlacement,
		controllerFencing:   buildFencing,
	}
	var out []runner
	for _, name := range d.cfg.controllers {
		build, ok := builders[name]
		if !ok {
			return nil, fmt.Errorf("controller %q is not known", name) // validate stops this earlier
		}
		r, err := build(d)
		if err != nil {
			return nil, fmt.Errorf("controller %s: %w", name, err)
		}
		r.name = name
		out = append(out, *r)
	}
	return out, nil
}

// nodeLeaseName is the Lease of a per-node controller: the upstream name and
// the node's, so that replicas on different nodes never share one (only two
// on the same node do). Long names are cut and given a hash suffix to stay a
// valid name.
func nodeLeaseName(lease, node string) string {
	name := lease + "-" + node
	if len(name) <= 63 {
		return name
	}
	sum := sha256.Sum256([]byte(name))
	return name[:63-17] + "-" + hex.EncodeToString(sum[:8])
}

// stopReason turns the end of ctx into the result of run: nil after a
// signal, the cause when something else (the HTTP server) ended it.
func stopReason(ctx context.Context, err error) error {
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		return cause
	}
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// kubeConfig builds the client configuration: protobuf, the rate limits of
// the flags and a user agent naming this command.
func kubeConfig(cfg *config) (*rest.Config, error) {
	rc, err := clientcmd.BuildConfigFromFlags(cfg.compat.master, cfg.kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("build the Kubernetes client configuration (--kubeconfig=%q): %w", cfg.kubeconfig, err)
	}
	rc.QPS = float32(cfg.kubeAPIQPS)
	rc.Burst = cfg.kubeAPIBurst
	// One limiter for every typed client made from rc: --kube-api-qps is
	// the budget of the whole process, not of each API group.
	rc.RateLimiter = flowcontrol.NewTokenBucketRateLimiter(rc.QPS, rc.Burst)
	rc.ContentType = runtime.ContentTypeProtobuf
	rc.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	rc.UserAgent = "loopvol-attacher/" + version
	return rc, nil
}

// runControllers runs every controller until ctx ends. When one fails, the
// others are stopped and its error returned.
func runControllers(ctx context.Context, runners []runner) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	for _, r := range runners {
		wg.Go(func() {
			if err := r.run(ctx); err != nil {
				cancel(fmt.Errorf("controller %s: %w", r.name, err))
			}
		})
	}
	wg.Wait()
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		return cause
	}
	return nil
}
