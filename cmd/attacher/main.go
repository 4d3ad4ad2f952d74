// Command attacher is loopvol's CSI sidecar. One binary replaces four
// upstream sidecars: external-attacher (--controllers=attach), the capacity
// controller of external-provisioner (capacity), node-driver-registrar
// (registrar) and external-resizer (resizer). Flag names, finalizers,
// annotations, Lease and metric names are the upstream ones, so a cluster
// can switch between upstream's and ours in either direction; several
// controllers may run in one process, each with its own queues, workers,
// metrics and Lease.
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
	"os"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"k8s.io/client-go/tools/leaderelection"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/klog/v2"

	"github.com/loopvol/loopvol/internal/command"
)

// version is set at build time (-ldflags "-X main.version=...").
var version = "unknown"

// The controllers --controllers chooses from.
const (
	controllerAttach    = "attach"
	controllerCapacity  = "capacity"
	controllerRegistrar = "registrar"
	controllerResizer   = "resizer"
	controllerWebhook   = "webhook"
	controllerPlacement = "placement"
	controllerFencing   = "fencing"
)

var knownControllers = []string{controllerAttach, controllerCapacity, controllerRegistrar, controllerResizer, controllerWebhook, controllerPlacement, controllerFencing}

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

	// nodeDeployment: one sidecar per node, next to a driver that serves
	// only that node's pools; nodeName is the node.
	nodeDeployment bool
	nodeName       string

	// Per-controller flags.
	capacity  capacityConfig
	registrar registrarConfig
	resizer   resizerConfig
	webhook   webhookConfig
	fencing   fencingConfig

	// Flags of the upstream sidecars, accepted so that their manifests run
	// unchanged (compat.go).
	compat compatFlags

	logging *logsapi.LoggingConfiguration
}

func main() {
	os.Exit(mainWithCode(os.Args[1:], os.Stdout, os.Stderr))
}

// mainWithCode runs the command and returns its exit code: 0 after a clean
// stop, 1 when it failed, 2 for a bad command line.
func mainWithCode(args []string, stdout, stderr io.Writer) int {
	cfg, err := parseFlags(args, stdout, os.Getenv)
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
	if cfg.compat.registrationProbe() {
		// node-driver-registrar's deprecated liveness probe mode: its
		// manifests still run it; it only ever exited 0.
		return 0
	}

	flush, err := command.StartLogging(cfg.logging)
	if err != nil {
		fmt.Fprintf(stderr, "attacher: %v\n", err)
		if command.IsFlagError(err) {
			return 2
		}
		return 1
	}
	defer flush()

	// The sidecar runs next to every driver, and its memory counts more
	// than the little CPU a busier garbage collector costs: collect when the
	// heap has grown by a quarter (Go's default: doubled), unless GOGC says
	// otherwise. At 2000 VolumeAttachments this keeps the peak resident set
	// about 12 MB lower for a few percent of one core while attaching.
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(25)
	}
	ctx := command.SignalContext(klog.NewContext(context.Background(), klog.Background().WithName("attacher")))
	if err := run(ctx, cfg); err != nil {
		klog.FromContext(ctx).Error(err, "Attacher failed")
		return 1
	}
	return 0
}

// parseFlags reads args into a config and validates it; getenv supplies
// the environment defaults (NODE_NAME). It returns flag.ErrHelp after
// printing the help for -h; any other error is a bad command line.
func parseFlags(args []string, output io.Writer, getenv func(string) string) (*config, error) {
	cfg := &config{logging: logsapi.NewLoggingConfiguration()}
	fs, controllers := newFlagSet(cfg, getenv)
	if err := command.Parse(fs, args, output, "Usage: attacher [flags]\n\nloopvol's CSI sidecar: external-attacher, the capacity controller of external-provisioner,\nnode-driver-registrar and external-resizer in one binary, chosen with --controllers."); err != nil {
		return nil, err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	// A node-driver-registrar manifest names no controller: its
	// registration path says what it wants.
	if !set["controllers"] && set["kubelet-registration-path"] {
		*controllers = controllerRegistrar
	}
	for name := range strings.SplitSeq(*controllers, ",") {
		if name = strings.TrimSpace(name); name != "" && !slices.Contains(cfg.controllers, name) {
			cfg.controllers = append(cfg.controllers, name)
		}
	}
	if cfg.showVersion || cfg.compat.registrationProbe() {
		return cfg, nil
	}
	if err := cfg.compat.apply(cfg, set); err != nil {
		return nil, err
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return cfg, nil
}

// newFlagSet declares every flag into a new FlagSet bound to cfg. The
// returned string receives --controllers, still unsplit.
func newFlagSet(cfg *config, getenv func(string) string) (*flag.FlagSet, *string) {
	fs := flag.NewFlagSet("attacher", flag.ContinueOnError)
	// The flag package would print the whole help after any mistake; the
	// caller prints the error alone, the help only for -h.
	fs.SetOutput(io.Discard)
	controllers := controllerAttach

	fs.StringVar(&cfg.csiAddress, "csi-address", "/run/csi/socket", "Address of the CSI driver socket (a path or unix:// URL). The sidecar waits for it to appear, and waits again if it goes away, instead of exiting.")
	fs.StringVar(&cfg.kubeconfig, "kubeconfig", "", "Path to a kubeconfig file. Needed only outside a cluster; empty means the in-cluster service account.")
	fs.StringVar(&controllers, "controllers", controllers, "Comma-separated controllers to run: "+strings.Join(knownControllers, ", ")+
		". attach replaces external-attacher, capacity the CSIStorageCapacity controller of external-provisioner, registrar node-driver-registrar, resizer external-resizer, webhook the validating admission webhook (docs/webhook.md), "+
		"placement an Event on each Pod the scheduler cannot place because the nodes its volumes live on take no Pods (which node and pool, and why: docs/deploy.md), "+
		"fencing the fence of a node that stopped serving from its shared-pool volumes (docs/fencing.md). "+
		"Default attach, or registrar when --kubelet-registration-path is given (a node-driver-registrar manifest).")
	fs.UintVar(&cfg.workerThreads, "worker-threads", 32,
		"Workers of the attach queue and, separately, of the detach queue, so a burst of detaches never starves attaches (the PersistentVolume queue gets a quarter); also the resizer's workers. "+
			"32 (upstream: 10) keeps 32 slow ControllerPublish calls in flight at once; the API rate limit below, not the workers, is then what bounds throughput.")
	fs.Float64Var(&cfg.kubeAPIQPS, "kube-api-qps", 150,
		"Sustained rate of requests to the API server, shared by every controller of the process. An attach costs 3 writes (PV finalizer, VolumeAttachment finalizer and node ID, status) and a detach 1, so 150 (upstream: 5) "+
			"sustains about 50 attaches/s; that is a fraction of what one API server handles, and API Priority and Fairness queues this client's requests behind the control plane's.")
	fs.IntVar(&cfg.kubeAPIBurst, "kube-api-burst", 300, "Burst of requests to the API server above --kube-api-qps (upstream: 10). 300 lets about 100 attaches start at once after a quiet period.")
	fs.DurationVar(&cfg.timeout, "timeout", 15*time.Second, "Timeout of each CSI call (ControllerPublishVolume, ControllerUnpublishVolume, GetCapacity, ControllerExpandVolume, ControllerModifyVolume, NodeGetInfo), and of a whole ListVolumes reconcile pass. "+
		"After a ControllerPublishVolume or ControllerUnpublishVolume of a VolumeAttachment timed out, its next call gets twice as long, up to 8 times this (2 minutes at the default); the first timeout is logged and each is counted in loopvol_attacher_csi_call_timeouts_total.")
	fs.DurationVar(&cfg.retryIntervalStart, "retry-interval-start", time.Second, "Initial retry interval of a failed attach, detach, resize or VolumeAttributesClass modification. It doubles with each failure of the same object, up to --retry-interval-max. Final gRPC errors wait at least 32 times this (at most --retry-interval-max).")
	fs.DurationVar(&cfg.retryIntervalMax, "retry-interval-max", 5*time.Minute, "Maximum retry interval of a failed attach, detach, resize or modification; also how long the resizer waits before it asks the driver again for a VolumeAttributesClass it found infeasible.")
	fs.DurationVar(&cfg.resync, "resync", 10*time.Minute, "Resync period of the informers: every object is checked again this often. 0 disables it.")
	fs.DurationVar(&cfg.reconcileSync, "reconcile-sync", time.Minute, "Period of the reconcile that compares the driver's ListVolumes published nodes with the VolumeAttachments and repairs those that disagree (drivers with LIST_VOLUMES_PUBLISHED_NODES). 0 disables it.")
	fs.IntVar(&cfg.maxEntries, "max-entries", 256, "Page size of the ListVolumes calls of the reconcile; 0 lets the driver choose (upstream's default). "+
		"Pages of 256 (a few tens of kB each) keep the reconcile's memory flat however many volumes the driver has.")
	fs.StringVar(&cfg.defaultFSType, "default-fstype", "", "Filesystem type of mount volumes whose PersistentVolume names none. Empty leaves it to the driver.")
	fs.IntVar(&cfg.maxGRPCLogLength, "max-grpc-log-length", -1, "Longest CSI response logged at -v=5, in characters; 0 or less means no limit.")
	fs.BoolVar(&cfg.leaderElection, "leader-election", false, "Run each controller only while holding its Lease, named as the upstream sidecar it replaces names it (attach: external-attacher-leader-<sanitized driver name>, resizer: external-resizer-<sanitized driver name>), "+
		"so that only one of several replicas, ours or upstream's, acts. capacity holds loopvol-capacity-leader-<sanitized driver name>: the upstream provisioner keeps its own Lease beside it. "+
		"The registrar never needs one. With --node-deployment the Lease name ends in the node name.")
	fs.StringVar(&cfg.leaderElectionNamespace, "leader-election-namespace", "", "Namespace of the leader-election Leases. Empty means $POD_NAMESPACE, else \"default\".")
	fs.DurationVar(&cfg.leaderElectionLeaseDuration, "leader-election-lease-duration", 15*time.Second, "How long other replicas wait after the leader's last renewal before they take the Lease over.")
	fs.DurationVar(&cfg.leaderElectionRenewDeadline, "leader-election-renew-deadline", 10*time.Second, "How long the leader keeps trying to renew the Lease before it gives up leading (and exits, to be restarted).")
	fs.DurationVar(&cfg.leaderElectionRetryPeriod, "leader-election-retry-period", 5*time.Second, "Pause between two attempts to take or renew the Lease.")
	fs.StringVar(&cfg.httpEndpoint, "http-endpoint", "", "host:port of the HTTP server for diagnostics: Prometheus metrics on --metrics-path, /healthz (fails while the CSI driver is unreachable, or a controller reports a problem, e.g. the registrar before kubelet confirmed the registration) /healthz/webhook (the webhook alone: fails while it waits for its certificate, without failing /healthz) and, with leader election, /healthz/leader-election. Empty disables it.")
	fs.StringVar(&cfg.metricsPath, "metrics-path", "/metrics", "HTTP path of the Prometheus metrics on --http-endpoint.")
	fs.BoolVar(&cfg.enablePprof, "enable-pprof", false, "Serve Go profiles under /debug/pprof/ on --http-endpoint.")
	fs.BoolVar(&cfg.showVersion, "version", false, "Print the version and exit.")
	fs.BoolVar(&cfg.nodeDeployment, "node-deployment", false, "Run on every node (a DaemonSet) next to a driver that serves only that node's pools: attach handles only the VolumeAttachments of --node-name, capacity publishes only that node's topology segment. "+
		"Fencing stays on, unlike local-volume drivers that give up attach for distributed provisioning.")
	fs.StringVar(&cfg.nodeName, "node-name", getenv("NODE_NAME"), "Name of the Kubernetes Node this sidecar runs on, for --node-deployment and the registrar. Default: $NODE_NAME (set it from spec.nodeName with the downward API).")
	cfg.capacity.addFlags(fs)
	cfg.registrar.addFlags(fs)
	cfg.resizer.addFlags(fs)
	cfg.webhook.addFlags(fs)
	cfg.fencing.addFlags(fs)
	cfg.compat.addFlags(fs)
	logsapi.AddGoFlags(cfg.logging, fs)
	return fs, &controllers
}

// runs reports whether the controller name was chosen.
func (c *config) runs(name string) bool { return slices.Contains(c.controllers, name) }

// validate reports the first flag value that cannot work, naming the flag.
func (c *config) validate() error {
	if len(c.controllers) == 0 {
		return errors.New("--controllers is empty")
	}
	for _, name := range c.controllers {
		if !slices.Contains(knownControllers, name) {
			return fmt.Errorf("--controllers: unknown controller %q (known: %s)", name, strings.Join(knownControllers, ", "))
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
	if c.nodeDeployment && c.nodeName == "" {
		return errors.New("--node-deployment needs --node-name or $NODE_NAME")
	}
	if c.runs(controllerCapacity) {
		if err := c.capacity.validate(c); err != nil {
			return err
		}
	}
	if c.runs(controllerRegistrar) {
		if err := c.registrar.validate(c); err != nil {
			return err
		}
	}
	if c.runs(controllerResizer) {
		if err := c.resizer.validate(c); err != nil {
			return err
		}
	}
	if c.runs(controllerWebhook) {
		if err := c.webhook.validate(c); err != nil {
			return err
		}
	}
	if c.runs(controllerFencing) {
		if err := c.fencing.validate(c); err != nil {
			return err
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
