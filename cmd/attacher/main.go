// Command attacher is loopvol's CSI sidecar. It can replace the upstream
// external-attacher (--controllers=attach); the flag names, finalizers,
// annotations, Lease and metric names are the upstream ones, so a cluster
// can switch between the two in either direction.
//
// main only parses flags into a config, validates it and calls run; run
// wires the Kubernetes client, the CSI driver connection, the HTTP endpoint
// and leader election to the controllers and returns when they stop.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kubernetes-csi/csi-lib-utils/connection"
	"github.com/kubernetes-csi/csi-lib-utils/metrics"
	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/uuid"
	coordinationv1 "k8s.io/client-go/kubernetes/typed/coordination/v1"
	corev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	storagev1 "k8s.io/client-go/kubernetes/typed/storage/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/util/flowcontrol"
	"k8s.io/component-base/featuregate"
	"k8s.io/component-base/logs"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/component-base/metrics/legacyregistry"
	_ "k8s.io/component-base/metrics/prometheus/clientgo/leaderelection" // leader-election metrics in the legacy registry
	_ "k8s.io/component-base/metrics/prometheus/workqueue"               // workqueue metrics in the legacy registry
	"k8s.io/klog/v2"

	"github.com/loopvol/loopvol/pkg/attach"
	"github.com/loopvol/loopvol/pkg/csiclient"
)

// version is set at build time (-ldflags "-X main.version=...").
var version = "unknown"

// Known controllers. Only attach is implemented so far; the others are named
// so that asking for them gives a precise error.
const (
	controllerAttach    = "attach"
	controllerCapacity  = "capacity"
	controllerRegistrar = "registrar"
)

var (
	implementedControllers = []string{controllerAttach}
	plannedControllers     = []string{controllerCapacity, controllerRegistrar}
)

// leaderHealthTimeout is how long past a missed lease renewal
// /healthz/leader-election still reports healthy (upstream's value).
const leaderHealthTimeout = 20 * time.Second

// config holds every flag.
type config struct {
	csiAddress         string
	kubeconfig         string
	controllers        []string
	workerThreads      uint
	kubeAPIQPS         float64
	kubeAPIBurst       int
	timeout            time.Duration
	retryIntervalStart time.Duration
	retryIntervalMax   time.Duration
	resync             time.Duration
	reconcileSync      time.Duration
	maxEntries         int
	defaultFSType      string
	maxGRPCLogLength   int

	leaderElection              bool
	leaderElectionNamespace     string
	leaderElectionLeaseDuration time.Duration
	leaderElectionRenewDeadline time.Duration
	leaderElectionRetryPeriod   time.Duration

	httpEndpoint string
	metricsPath  string
	enablePprof  bool
	showVersion  bool

	logging *logsapi.LoggingConfiguration
}

func main() {
	os.Exit(mainWithCode(os.Args[1:], os.Stdout, os.Stderr))
}

// mainWithCode runs the command and returns its exit code: 0 after a clean
// stop, 1 when it failed, 2 for a bad command line.
func mainWithCode(args []string, stdout, stderr io.Writer) int {
	cfg, err := parseFlags(args, stdout)
	switch {
	case errors.Is(err, flag.ErrHelp):
		return 0
	case err != nil:
		fmt.Fprintf(stderr, "attacher: %v\nRun 'attacher --help' for the flags.\n", err)
		return 2
	}
	if cfg.showVersion {
		fmt.Fprintln(stdout, "attacher", version)
		return 0
	}

	logs.InitLogs()
	defer logs.FlushLogs()
	fg := featuregate.NewFeatureGate()
	if err := logsapi.AddFeatureGates(fg); err != nil {
		fmt.Fprintf(stderr, "attacher: logging feature gates: %v\n", err)
		return 1
	}
	if err := logsapi.ValidateAndApply(cfg.logging, fg); err != nil {
		fmt.Fprintf(stderr, "attacher: logging flags: %v\n", err)
		return 2
	}

	// The sidecar runs next to every driver, and its memory counts more
	// than the little CPU a busier garbage collector costs: collect when the
	// heap has grown by a quarter (Go's default: doubled), unless GOGC says
	// otherwise. At 2000 VolumeAttachments this keeps the peak resident set
	// about 12 MB lower for a few percent of one core while attaching.
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(25)
	}
	ctx := signalContext(klog.NewContext(context.Background(), klog.Background().WithName("attacher")))
	if err := run(ctx, cfg); err != nil {
		klog.FromContext(ctx).Error(err, "Attacher failed")
		return 1
	}
	return 0
}

// signalContext returns a context that ends on the first SIGINT or SIGTERM.
// After that the default handling is back, so a second signal kills the
// process at once.
func signalContext(parent context.Context) context.Context {
	ctx, stop := signal.NotifyContext(parent, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop()
	}()
	return ctx
}

// parseFlags reads args into a config and validates it. It returns
// flag.ErrHelp after printing the help for -h; any other error is a bad
// command line.
func parseFlags(args []string, output io.Writer) (*config, error) {
	cfg := &config{logging: logsapi.NewLoggingConfiguration()}
	fs := flag.NewFlagSet("attacher", flag.ContinueOnError)
	// The flag package would print the whole help after any mistake; the
	// caller prints the error alone, the help only for -h.
	fs.SetOutput(io.Discard)
	controllers := controllerAttach

	fs.StringVar(&cfg.csiAddress, "csi-address", "/run/csi/socket", "Address of the CSI driver socket (a path or unix:// URL). The attacher waits for it to appear, and waits again if it goes away, instead of exiting.")
	fs.StringVar(&cfg.kubeconfig, "kubeconfig", "", "Path to a kubeconfig file. Needed only outside a cluster; empty means the in-cluster service account.")
	fs.StringVar(&controllers, "controllers", controllers, "Comma-separated controllers to run. Implemented: "+strings.Join(implementedControllers, ", ")+".")
	fs.UintVar(&cfg.workerThreads, "worker-threads", 32,
		"Workers of the attach queue and, separately, of the detach queue, so a burst of detaches never starves attaches (the PersistentVolume queue gets a quarter). "+
			"32 (upstream: 10) keeps 32 slow ControllerPublish calls in flight at once; the API rate limit below, not the workers, is then what bounds throughput.")
	fs.Float64Var(&cfg.kubeAPIQPS, "kube-api-qps", 150,
		"Sustained rate of requests to the API server. An attach costs 3 writes (PV finalizer, VolumeAttachment finalizer and node ID, status) and a detach 1, so 150 (upstream: 5) "+
			"sustains about 50 attaches/s; that is a fraction of what one API server handles, and API Priority and Fairness queues this client's requests behind the control plane's.")
	fs.IntVar(&cfg.kubeAPIBurst, "kube-api-burst", 300, "Burst of requests to the API server above --kube-api-qps (upstream: 10). 300 lets about 100 attaches start at once after a quiet period.")
	fs.DurationVar(&cfg.timeout, "timeout", 15*time.Second, "Timeout of each ControllerPublishVolume and ControllerUnpublishVolume call, and of a whole ListVolumes reconcile pass.")
	fs.DurationVar(&cfg.retryIntervalStart, "retry-interval-start", time.Second, "Initial retry interval of a failed attach or detach. It doubles with each failure of the same object, up to --retry-interval-max. Final gRPC errors wait at least 32 times this (at most --retry-interval-max).")
	fs.DurationVar(&cfg.retryIntervalMax, "retry-interval-max", 5*time.Minute, "Maximum retry interval of a failed attach or detach.")
	fs.DurationVar(&cfg.resync, "resync", 10*time.Minute, "Resync period of the informers: every object is checked again this often. 0 disables it.")
	fs.DurationVar(&cfg.reconcileSync, "reconcile-sync", time.Minute, "Period of the reconcile that compares the driver's ListVolumes published nodes with the VolumeAttachments and repairs those that disagree (drivers with LIST_VOLUMES_PUBLISHED_NODES). 0 disables it.")
	fs.IntVar(&cfg.maxEntries, "max-entries", 256, "Page size of the ListVolumes calls of the reconcile; 0 lets the driver choose (upstream's default). "+
		"Pages of 256 (a few tens of kB each) keep the reconcile's memory flat however many volumes the driver has.")
	fs.StringVar(&cfg.defaultFSType, "default-fstype", "", "Filesystem type of mount volumes whose PersistentVolume names none. Empty leaves it to the driver.")
	fs.IntVar(&cfg.maxGRPCLogLength, "max-grpc-log-length", -1, "Longest CSI response logged at -v=5, in characters; 0 or less means no limit.")
	fs.BoolVar(&cfg.leaderElection, "leader-election", false, "Run the controllers only while holding the Lease external-attacher-leader-<sanitized driver name> (the upstream name), so that only one of several replicas, ours or upstream's, acts.")
	fs.StringVar(&cfg.leaderElectionNamespace, "leader-election-namespace", "", "Namespace of the leader-election Lease. Empty means $POD_NAMESPACE, else \"default\".")
	fs.DurationVar(&cfg.leaderElectionLeaseDuration, "leader-election-lease-duration", 15*time.Second, "How long other replicas wait after the leader's last renewal before they take the Lease over.")
	fs.DurationVar(&cfg.leaderElectionRenewDeadline, "leader-election-renew-deadline", 10*time.Second, "How long the leader keeps trying to renew the Lease before it gives up leading (and exits, to be restarted).")
	fs.DurationVar(&cfg.leaderElectionRetryPeriod, "leader-election-retry-period", 5*time.Second, "Pause between two attempts to take or renew the Lease.")
	fs.StringVar(&cfg.httpEndpoint, "http-endpoint", "", "host:port of the HTTP server for diagnostics: Prometheus metrics on --metrics-path, /healthz (fails while the CSI driver is unreachable) and, with leader election, /healthz/leader-election. Empty disables it.")
	fs.StringVar(&cfg.metricsPath, "metrics-path", "/metrics", "HTTP path of the Prometheus metrics on --http-endpoint.")
	fs.BoolVar(&cfg.enablePprof, "enable-pprof", false, "Serve Go profiles under /debug/pprof/ on --http-endpoint.")
	fs.BoolVar(&cfg.showVersion, "version", false, "Print the version and exit.")
	logsapi.AddGoFlags(cfg.logging, fs)

	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(output, "Usage: attacher [flags]\n\nloopvol's CSI sidecar: the external-attacher and more, chosen with --controllers.\n\nFlags:\n")
			fs.SetOutput(output)
			fs.PrintDefaults()
		}
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q (every option is a --flag)", fs.Args())
	}
	for name := range strings.SplitSeq(controllers, ",") {
		if name = strings.TrimSpace(name); name != "" && !slices.Contains(cfg.controllers, name) {
			cfg.controllers = append(cfg.controllers, name)
		}
	}
	if cfg.showVersion {
		return cfg, nil
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return cfg, nil
}

// validate reports the first flag value that cannot work, naming the flag.
func (c *config) validate() error {
	if len(c.controllers) == 0 {
		return errors.New("--controllers is empty")
	}
	for _, name := range c.controllers {
		switch {
		case slices.Contains(implementedControllers, name):
		case slices.Contains(plannedControllers, name):
			return fmt.Errorf("--controllers: %q is not implemented yet (implemented: %s)", name, strings.Join(implementedControllers, ", "))
		default:
			return fmt.Errorf("--controllers: unknown controller %q (implemented: %s)", name, strings.Join(implementedControllers, ", "))
		}
	}
	switch {
	case c.csiAddress == "":
		return errors.New("--csi-address is empty")
	case c.workerThreads == 0:
		return errors.New("--worker-threads must be greater than zero")
	case c.workerThreads > 10000:
		return fmt.Errorf("--worker-threads=%d is more than 10000", c.workerThreads)
	case c.kubeAPIQPS <= 0:
		return fmt.Errorf("--kube-api-qps must be greater than zero, not %g", c.kubeAPIQPS)
	case c.kubeAPIBurst < 1:
		return fmt.Errorf("--kube-api-burst must be at least 1, not %d", c.kubeAPIBurst)
	case c.timeout <= 0:
		return fmt.Errorf("--timeout must be positive, not %s", c.timeout)
	case c.retryIntervalStart <= 0:
		return fmt.Errorf("--retry-interval-start must be positive, not %s", c.retryIntervalStart)
	case c.retryIntervalMax < c.retryIntervalStart:
		return fmt.Errorf("--retry-interval-max=%s is shorter than --retry-interval-start=%s", c.retryIntervalMax, c.retryIntervalStart)
	case c.resync < 0:
		return fmt.Errorf("--resync must not be negative, not %s", c.resync)
	case c.reconcileSync < 0:
		return fmt.Errorf("--reconcile-sync must not be negative, not %s", c.reconcileSync)
	case c.maxEntries < 0 || c.maxEntries > 1<<31-1:
		return fmt.Errorf("--max-entries must be between 0 and %d, not %d", 1<<31-1, c.maxEntries)
	case c.metricsPath == "" || !strings.HasPrefix(c.metricsPath, "/"):
		return fmt.Errorf("--metrics-path must start with /, not %q", c.metricsPath)
	case strings.HasPrefix(c.metricsPath, "/healthz"):
		return fmt.Errorf("--metrics-path %q collides with /healthz", c.metricsPath)
	}
	if c.httpEndpoint != "" {
		if _, _, err := net.SplitHostPort(c.httpEndpoint); err != nil {
			return fmt.Errorf("--http-endpoint %q is not host:port: %w", c.httpEndpoint, err)
		}
	}
	if c.leaderElection {
		switch {
		case c.leaderElectionLeaseDuration <= 0 || c.leaderElectionRenewDeadline <= 0 || c.leaderElectionRetryPeriod <= 0:
			return errors.New("--leader-election-lease-duration, --leader-election-renew-deadline and --leader-election-retry-period must be positive")
		case c.leaderElectionLeaseDuration <= c.leaderElectionRenewDeadline:
			return fmt.Errorf("--leader-election-lease-duration=%s must be longer than --leader-election-renew-deadline=%s",
				c.leaderElectionLeaseDuration, c.leaderElectionRenewDeadline)
		case float64(c.leaderElectionRenewDeadline) <= leaderelection.JitterFactor*float64(c.leaderElectionRetryPeriod):
			return fmt.Errorf("--leader-election-renew-deadline=%s must be longer than %g × --leader-election-retry-period=%s",
				c.leaderElectionRenewDeadline, leaderelection.JitterFactor, c.leaderElectionRetryPeriod)
		}
	}
	return nil
}

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
		mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
			c := csiConn.Load()
			switch {
			case c == nil:
				http.Error(w, "connecting to the CSI driver at "+cfg.csiAddress, http.StatusServiceUnavailable)
			case c.Healthy() != nil:
				http.Error(w, c.Healthy().Error(), http.StatusServiceUnavailable)
			default:
				fmt.Fprint(w, "ok")
			}
		})
		if leaderHealth != nil {
			mux.HandleFunc("/healthz/leader-election", func(w http.ResponseWriter, r *http.Request) {
				if err := leaderHealth.Check(r); err != nil {
					http.Error(w, err.Error(), http.StatusInternalServerError)
					return
				}
				fmt.Fprint(w, "ok")
			})
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
		err = runWithLeaderElection(ctx, cfg, restConfig, attach.LeaseName(driver), leaderHealth, runAll)
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

// runWithLeaderElection runs run while this process holds the Lease
// lockName. On a signal (ctx ends) the controllers stop first and the Lease
// is released after, so another replica takes over at once without a moment
// with two leaders. Losing the Lease is an error: the process exits and
// starts again from a clean state, as the upstream sidecars do.
func runWithLeaderElection(ctx context.Context, cfg *config, rc *rest.Config, lockName string,
	health *leaderelection.HealthzAdaptor, run func(context.Context) error) error {
	logger := klog.FromContext(ctx)
	// Its own client, so that a busy controller's rate limit never delays a
	// renewal.
	lec := rest.CopyConfig(rc)
	lec.RateLimiter = nil // its own limiter (from QPS and Burst)
	leClient, err := coordinationv1.NewForConfig(lec)
	if err != nil {
		return fmt.Errorf("create the leader-election client: %w", err)
	}
	host, err := os.Hostname()
	if err != nil {
		return fmt.Errorf("leader-election identity: %w", err)
	}
	// Unique even for two replicas on one host.
	id := host + "_" + string(uuid.NewUUID())
	ns := cfg.leaderElectionNamespace
	if ns == "" {
		ns = os.Getenv("POD_NAMESPACE")
	}
	if ns == "" {
		ns = metav1.NamespaceDefault
	}
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: ns, Name: lockName},
		Client:     leClient,
		LockConfig: resourcelock.ResourceLockConfig{Identity: id},
	}

	// leCtx is the election's; it ends after the controllers have stopped.
	leCtx, leCancel := context.WithCancel(context.WithoutCancel(ctx))
	defer leCancel()
	var (
		leading atomic.Bool
		runErr  error
		ran     = make(chan struct{})
	)
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		Name:            lockName,
		LeaseDuration:   cfg.leaderElectionLeaseDuration,
		RenewDeadline:   cfg.leaderElectionRenewDeadline,
		RetryPeriod:     cfg.leaderElectionRetryPeriod,
		ReleaseOnCancel: true,
		WatchDog:        health,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(lctx context.Context) {
				defer close(ran)
				leading.Store(true)
				logger.Info("Became the leader; starting the controllers", "lease", klog.KRef(ns, lockName), "identity", id)
				// Stop on a signal or when the Lease is lost.
				rctx, rcancel := context.WithCancel(klog.NewContext(lctx, logger))
				stop := context.AfterFunc(ctx, rcancel)
				runErr = run(rctx)
				stop()
				rcancel()
				leCancel() // release the Lease only now
			},
			OnStoppedLeading: func() {
				logger.Info("Stopped leading", "lease", klog.KRef(ns, lockName), "identity", id)
			},
			OnNewLeader: func(leader string) {
				logger.Info("Leader elected", "lease", klog.KRef(ns, lockName), "leader", leader, "self", leader == id)
			},
		},
	})
	if err != nil {
		return fmt.Errorf("leader election: %w", err)
	}
	// A signal while still waiting for the Lease ends the election at once.
	stopWaiting := context.AfterFunc(ctx, func() {
		if !leading.Load() {
			leCancel()
		}
	})
	defer stopWaiting()

	logger.Info("Waiting to become the leader", "lease", klog.KRef(ns, lockName), "identity", id)
	le.Run(leCtx)
	if leading.Load() {
		<-ran
	}
	switch {
	case runErr != nil:
		return runErr
	case ctx.Err() != nil:
		return nil
	case leading.Load():
		return fmt.Errorf("lost the leader-election Lease %s/%s", ns, lockName)
	}
	return nil
}
