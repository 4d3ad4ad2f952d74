package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kubernetes-csi/csi-lib-utils/connection"
	"github.com/kubernetes-csi/csi-lib-utils/metrics"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/runtime"
	corev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	storagev1 "k8s.io/client-go/kubernetes/typed/storage/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/util/flowcontrol"
	"k8s.io/component-base/metrics/legacyregistry"
	_ "k8s.io/component-base/metrics/prometheus/clientgo/leaderelection" // leader-election metrics in the legacy registry
	_ "k8s.io/component-base/metrics/prometheus/workqueue"               // workqueue metrics in the legacy registry
	"k8s.io/klog/v2"

	"github.com/loopvol/loopvol/pkg/attach"
	"github.com/loopvol/loopvol/pkg/csiclient"
)

// run connects everything and runs the controllers until ctx ends (nil) or
// something fails for good (an error).
func run(ctx context.Context, cfg *config) error {
	logger := klog.FromContext(ctx)
	logger.Info("Starting", "version", version, "controllers", cfg.controllers, "csiAddress", cfg.csiAddress,
		"workerThreads", cfg.workerThreads, "kubeAPIQPS", cfg.kubeAPIQPS, "kubeAPIBurst", cfg.kubeAPIBurst)
	connection.SetMaxGRPCLogLength(cfg.maxGRPCLogLength)

	restConfig, err := kubeConfig(cfg)
	if err != nil {
		return err
	}
	client, err := newKubeClient(restConfig)
	if err != nil {
		return err
	}

	// Metrics: CSI call latency (csi-lib-utils), the workqueue and
	// leader-election metrics (legacy registry) and the controllers' own.
	csiMetrics := metrics.NewCSIMetricsManagerForSidecar("")
	ownMetrics := prometheus.NewRegistry()
	csiMetrics.WithAdditionalRegistry(legacyregistry.DefaultGatherer)
	csiMetrics.WithAdditionalRegistry(ownMetrics)

	var csiConn atomic.Pointer[csiclient.Client]
	health := func() error {
		if c := csiConn.Load(); c != nil {
			return c.Healthy()
		}
		return fmt.Errorf("connecting to the CSI driver at %s", cfg.csiAddress)
	}
	var leaderHealth *leaderelection.HealthzAdaptor
	if cfg.leaderElection {
		leaderHealth = leaderelection.NewLeaderHealthzAdaptor(leaderHealthTimeout)
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
		mux.Handle("/healthz", checkHandler(health, http.StatusServiceUnavailable))
		if leaderHealth != nil {
			mux.Handle("/healthz/leader-election", checkHandler(func() error { return leaderHealth.Check(nil) }, http.StatusInternalServerError))
		}
		// Listen before anything slow, so a bad address fails at once and
		// /healthz answers while the driver is awaited.
		ln, err := net.Listen("tcp", cfg.httpEndpoint)
		if err != nil {
			return fmt.Errorf("--http-endpoint: %w", err)
		}
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		logger.Info("Serving HTTP", "address", ln.Addr().String(), "metricsPath", cfg.metricsPath)
		wg.Go(func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				cancel(fmt.Errorf("HTTP server: %w", err))
			}
		})
		wg.Go(func() {
			<-ctx.Done()
			sctx, scancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer scancel()
			_ = srv.Shutdown(sctx)
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
	driver := conn.DriverName()
	logger = klog.LoggerWithValues(logger, "driver", driver)
	ctx = klog.NewContext(ctx, logger)

	runners, err := buildControllers(cfg, client, conn, ownMetrics)
	if err != nil {
		return err
	}
	runAll := func(ctx context.Context) error { return runControllers(ctx, runners) }
	if cfg.leaderElection {
		le, lerr := newLeaderConfig(cfg, restConfig, attach.LeaseName(driver), leaderHealth)
		if lerr != nil {
			return lerr
		}
		err = runWithLeaderElection(ctx, le, runAll)
	} else {
		err = runAll(ctx)
	}
	if err != nil {
		return err
	}
	return stopReason(ctx, nil)
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
	rc, err := clientcmd.BuildConfigFromFlags("", cfg.kubeconfig)
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

// kubeClient holds just the typed clients the controllers use. Linking the
// whole kubernetes.Clientset (every API group, with an informer factory for
// each) makes the binary half again as large, and its resident memory with
// it.
type kubeClient struct {
	core    corev1.CoreV1Interface
	storage storagev1.StorageV1Interface
}

func (k kubeClient) CoreV1() corev1.CoreV1Interface          { return k.core }
func (k kubeClient) StorageV1() storagev1.StorageV1Interface { return k.storage }

func newKubeClient(rc *rest.Config) (kubeClient, error) {
	core, err := corev1.NewForConfig(rc)
	if err != nil {
		return kubeClient{}, fmt.Errorf("create the Kubernetes core/v1 client: %w", err)
	}
	st, err := storagev1.NewForConfig(rc)
	if err != nil {
		return kubeClient{}, fmt.Errorf("create the Kubernetes storage/v1 client: %w", err)
	}
	return kubeClient{core: core, storage: st}, nil
}

// runner is one controller's Run.
type runner struct {
	name string
	run  func(context.Context) error
}

// buildControllers builds the controllers named in --controllers.
func buildControllers(cfg *config, client attach.KubeClient, conn *csiclient.Client, reg prometheus.Registerer) ([]runner, error) {
	var out []runner
	for _, name := range cfg.controllers {
		switch name {
		case controllerAttach:
			c, err := attach.New(attach.Config{
				DriverName:         conn.DriverName(),
				Client:             client,
				CSI:                conn,
				Workers:            int(cfg.workerThreads),
				Resync:             cfg.resync,
				RetryIntervalStart: cfg.retryIntervalStart,
				RetryIntervalMax:   cfg.retryIntervalMax,
				ReconcileSync:      cfg.reconcileSync,
				DefaultFSType:      cfg.defaultFSType,
				Registerer:         reg,
			})
			if err != nil {
				return nil, err
			}
			out = append(out, runner{name: name, run: c.Run})
		default:
			return nil, fmt.Errorf("controller %q is not implemented", name) // validate stops this earlier
		}
	}
	return out, nil
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

// checkHandler serves check: "ok" while it passes, else its error with
// failCode.
func checkHandler(check func() error, failCode int) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if err := check(); err != nil {
			http.Error(w, err.Error(), failCode)
			return
		}
		fmt.Fprint(w, "ok")
	})
}
