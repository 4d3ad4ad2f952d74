package registrar

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/loopvol/loopvol/internal/kube"
	"github.com/loopvol/loopvol/internal/unixsock"
)

// Mode says who writes the driver's entry in the node's CSINode.
type Mode string

const (
	// ModeKubelet leaves the CSINode entry to kubelet, which writes it when
	// the registration succeeds: the registrar never writes it.
	ModeKubelet Mode = "kubelet"
	// ModeDirect makes the registrar write the entry itself, for a cluster
	// without kubelet (a bare API server in tests).
	ModeDirect Mode = "direct"
)

// Defaults of the optional Config fields.
const (
	DefaultSocketCheckInterval = time.Second
	DefaultHealthTimeout       = 2 * time.Second
)

// supportedVersions are the plugin registration versions kubelet may use
// with the driver: CSI's 1.x line.
var supportedVersions = []string{"1.0.0"}

// Driver is the part of the CSI driver connection the registrar uses;
// *csiclient.Client implements it.
type Driver interface {
	// NodeGetInfo returns the node service's node ID, topology and volume
	// limit. Errors keep their gRPC status.
	NodeGetInfo(ctx context.Context) (*csi.NodeGetInfoResponse, error)
	// Healthy returns nil while the driver is connected, ready and answers
	// GetPluginInfo with the name it had at the start, else why not.
	Healthy() error
	// WaitReady blocks until the driver is ready, or ctx ends (then it
	// returns ctx's error).
	WaitReady(ctx context.Context) error
}

// Config is what New needs.
type Config struct {
	// DriverName is the CSI driver's name, from GetPluginInfo.
	DriverName string
	// KubeletRegistrationPath is the driver socket's path as kubelet sees
	// it on the host: the endpoint handed to kubelet in GetInfo.
	KubeletRegistrationPath string
	// PluginRegistrationPath is the directory kubelet's plugin watcher
	// watches (the host's <kubelet root>/plugins_registry, mounted). The
	// registration socket is <PluginRegistrationPath>/<DriverName>-reg.sock.
	PluginRegistrationPath string
	// NodeName is the Kubernetes Node's name. Required in ModeDirect, and
	// in ModeKubelet when Client is set (to read the CSINode for drift).
	NodeName string
	// Mode says who writes the CSINode entry.
	Mode Mode
	// Driver is the CSI driver connection.
	Driver Driver
	// Client talks to the Kubernetes API. Required in ModeDirect. In
	// ModeKubelet it is optional: when set, the CSINode entry kubelet wrote
	// is compared with NodeGetInfo and drift is logged (a GET of the
	// CSINode, never a write); when nil, the registrar never touches the
	// API, and needs no RBAC.
	Client kube.Client
	// VolumeAttachments is the process's shared VolumeAttachment informer.
	// Required in ModeDirect: an attach of a volume on this node that fails
	// with RESOURCE_EXHAUSTED makes the registrar read NodeGetInfo again
	// at once. The caller starts it.
	VolumeAttachments cache.SharedIndexInformer
	// RetryIntervalStart and RetryIntervalMax bound the exponential backoff
	// of a failed CSINode write and of re-creating the registration socket
	// after kubelet reported a failed registration.
	RetryIntervalStart time.Duration
	RetryIntervalMax   time.Duration
	// SocketCheckInterval is how often the registration socket is checked
	// for being in place; zero means DefaultSocketCheckInterval.
	SocketCheckInterval time.Duration
	// HealthTimeout bounds the GetInfo that Healthy sends over the
	// registration socket; zero means DefaultHealthTimeout.
	HealthTimeout time.Duration
	// DriftCheckInterval is, in ModeKubelet with a Client, how often the
	// CSINode entry is compared with NodeGetInfo besides after each
	// registration; zero means only after each registration.
	DriftCheckInterval time.Duration
	// Registerer receives loopvol_registrar_registered. Optional.
	Registerer prometheus.Registerer
	// Clock drives every period, backoff and socket check of the
	// registrar, and the times Healthy reports. Optional: nil is the real
	// clock; tests step a fake one instead of waiting.
	Clock clock.WithTicker
}

// Validate reports the first field of c that cannot work.
func (c Config) Validate() error {
	switch {
	case c.DriverName == "":
		return errors.New("the driver name is empty")
	case c.KubeletRegistrationPath == "":
		return errors.New("the kubelet registration path (the driver socket as kubelet sees it) is empty")
	case !filepath.IsAbs(c.KubeletRegistrationPath):
		return fmt.Errorf("the kubelet registration path %q is not absolute", c.KubeletRegistrationPath)
	case len(c.KubeletRegistrationPath) > unixsock.MaxPathLen:
		return fmt.Errorf("the kubelet registration path %q is longer than %d bytes; kubelet cannot connect to it", c.KubeletRegistrationPath, unixsock.MaxPathLen)
	case c.PluginRegistrationPath == "":
		return errors.New("the plugin registration path is empty")
	case !filepath.IsAbs(c.PluginRegistrationPath):
		return fmt.Errorf("the plugin registration path %q is not absolute", c.PluginRegistrationPath)
	case len(socketPath(c.PluginRegistrationPath, c.DriverName)) > unixsock.MaxPathLen:
		return fmt.Errorf("the registration socket %s is longer than %d bytes", socketPath(c.PluginRegistrationPath, c.DriverName), unixsock.MaxPathLen)
	case c.Mode != ModeKubelet && c.Mode != ModeDirect:
		return fmt.Errorf("the CSINode mode %q is neither %q nor %q", c.Mode, ModeKubelet, ModeDirect)
	case c.Driver == nil:
		return errors.New("no CSI driver connection")
	case c.Mode == ModeDirect && c.Client == nil:
		return errors.New("the direct CSINode mode needs a Kubernetes client")
	case c.Mode == ModeDirect && c.VolumeAttachments == nil:
		return errors.New("the direct CSINode mode needs the VolumeAttachment informer")
	case (c.Mode == ModeDirect || c.Client != nil) && c.NodeName == "":
		return errors.New("the node name is empty")
	case kube.ValidateBackoff(c.RetryIntervalStart, c.RetryIntervalMax) != nil:
		return kube.ValidateBackoff(c.RetryIntervalStart, c.RetryIntervalMax)
	case c.SocketCheckInterval < 0 || c.HealthTimeout < 0 || c.DriftCheckInterval < 0:
		return errors.New("the socket check interval, health timeout and drift check interval must not be negative")
	}
	return nil
}

// socketPath is the registration socket of driver in dir, where kubelet's
// plugin watcher looks for it (node-driver-registrar's name).
func socketPath(dir, driver string) string {
	return filepath.Join(dir, driver+"-reg.sock")
}

// Registrar registers the driver with kubelet and, in ModeDirect, keeps the
// node's CSINode entry of the driver. Build it with New, run it with Run;
// Healthy is for /healthz.
type Registrar struct {
	cfg   Config
	reg   *registration
	node  *csiNodeController // ModeDirect only
	drift *driftChecker      // ModeKubelet with a Client only
}

// New builds a registrar.
func New(cfg Config) (*Registrar, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("registrar: %w", err)
	}
	if cfg.SocketCheckInterval == 0 {
		cfg.SocketCheckInterval = DefaultSocketCheckInterval
	}
	if cfg.HealthTimeout == 0 {
		cfg.HealthTimeout = DefaultHealthTimeout
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	r := &Registrar{cfg: cfg}
	var onRegistered func()
	switch {
	case cfg.Mode == ModeDirect:
		r.node = newCSINodeController(cfg)
	case cfg.Client != nil:
		r.drift = newDriftChecker(cfg)
		onRegistered = r.drift.kick
	}
	r.reg = newRegistration(cfg, onRegistered)
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "loopvol_registrar_registered",
			Help: "1 while the driver is registered on this node: kubelet confirmed the registration on the current socket (CSINode mode kubelet), or the CSINode entry is in place (mode direct); else 0.",
		}, func() float64 {
			if r.Registered() {
				return 1
			}
			return 0
		})); err != nil {
			return nil, fmt.Errorf("registrar metrics: %w", err)
		}
	}
	return r, nil
}

// Registered tells whether the driver is registered: kubelet confirmed the
// registration on the current socket (ModeKubelet), or the CSINode entry
// is in place (ModeDirect). Unlike Healthy it calls nothing.
func (r *Registrar) Registered() bool {
	if r.node != nil {
		return r.node.healthy() == nil
	}
	return r.reg.registered() == nil
}

// SocketPath is the registration socket's path.
func (r *Registrar) SocketPath() string { return r.reg.path }

// Run serves the registration socket and, in ModeDirect, keeps the CSINode
// entry, until ctx ends; then it removes the socket and returns nil. It
// returns an error only when it cannot start (the socket path holds a file
// that is not a socket, the directory cannot be created). Nothing that
// kubelet or the driver does later makes it return: failures are logged,
// retried and reported by Healthy.
func (r *Registrar) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	logger.Info("Starting the registrar", "socket", r.reg.path, "kubeletRegistrationPath", r.cfg.KubeletRegistrationPath,
		"csiNodeMode", r.cfg.Mode, "node", r.cfg.NodeName)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	fail := func(err error) {
		if err != nil {
			cancel(err)
		}
	}
	wg.Go(func() { fail(r.reg.run(ctx)) })
	if r.node != nil {
		wg.Go(func() { fail(r.node.run(ctx)) })
	}
	if r.drift != nil {
		wg.Go(func() { r.drift.run(ctx) })
	}
	wg.Wait()
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		return cause
	}
	logger.Info("Registrar stopped")
	return nil
}

// Healthy returns nil when the driver is healthy, the registration socket
// answers GetInfo with the driver's name and, in ModeKubelet, kubelet has
// confirmed the registration on the current socket or, in ModeDirect, the
// CSINode entry is in place. Otherwise it says what is missing.
func (r *Registrar) Healthy() error {
	var errs []error
	if err := r.cfg.Driver.Healthy(); err != nil {
		errs = append(errs, err)
	}
	if r.node != nil {
		errs = append(errs, r.node.healthy())
	} else {
		errs = append(errs, r.reg.registered())
	}
	errs = append(errs, r.reg.live(r.cfg.HealthTimeout))
	return errors.Join(errs...)
}
