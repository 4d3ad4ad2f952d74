package csiclient

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/kubernetes-csi/csi-lib-utils/connection"
	"github.com/kubernetes-csi/csi-lib-utils/metrics"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"k8s.io/klog/v2"
)

// DefaultProbeTimeout bounds one Probe, GetPluginInfo or capability call when
// Config.ProbeTimeout is zero. These calls read constants; a driver that
// needs longer is not ready.
const DefaultProbeTimeout = time.Second

// probeRetryInterval is the pause between two failed probes.
const probeRetryInterval = time.Second

// errConnectionLost is the reason a Client gives while it waits for the
// driver socket to come back.
var errConnectionLost = errors.New("lost the connection to the CSI driver; waiting for it to come back")

// Config says how to reach a CSI driver.
type Config struct {
	// Address of the driver: a path of a unix socket or a unix:// URL.
	Address string
	// Timeout bounds each ControllerPublish and ControllerUnpublish call and a
	// whole ListVolumes pass (all its pages).
	Timeout time.Duration
	// ProbeTimeout bounds each Probe, GetPluginInfo and capability call; zero
	// means DefaultProbeTimeout.
	ProbeTimeout time.Duration
	// MaxEntries is the ListVolumes page size; zero lets the driver choose.
	MaxEntries int
	// Metrics times every call in csi_sidecar_operations_seconds by method
	// and gRPC code. Optional. Connect sets its driver name once known.
	Metrics metrics.CSIMetricsManager
}

// Validate reports the first field of c that cannot work.
func (c Config) Validate() error {
	switch {
	case c.Address == "":
		return errors.New("the CSI driver address is empty")
	case c.Timeout <= 0:
		return fmt.Errorf("the CSI call timeout must be positive, not %s", c.Timeout)
	case c.ProbeTimeout < 0:
		return fmt.Errorf("the CSI probe timeout must not be negative, not %s", c.ProbeTimeout)
	case c.MaxEntries < 0 || c.MaxEntries > 1<<31-1:
		return fmt.Errorf("the ListVolumes page size must be between 0 and %d, not %d", 1<<31-1, c.MaxEntries)
	}
	return nil
}

// Client is a live connection to one CSI driver. Its methods are safe for
// concurrent use.
type Client struct {
	cfg        Config
	conn       *grpc.ClientConn
	controller csi.ControllerClient
	node       csi.NodeClient
	name       string

	mu      sync.Mutex
	caps    Capabilities
	ready   chan struct{} // closed while the driver is ready
	isReady bool
	problem error     // why the driver is not ready
	since   time.Time // when it stopped being ready
	// onReconnected are called when the driver is ready again after it was
	// not; nil entries were removed.
	onReconnected []func()
	everReady     bool

	stop context.CancelFunc
	done chan struct{} // closed when the monitor has returned
}

// Connect dials the driver, waits until it answers Probe with ready, and
// learns its name and capabilities. It waits as long as ctx allows: a socket
// that does not exist yet is waited for, not an error, because the driver
// container may start after the sidecar. Connect fails only when ctx ends or
// cfg is invalid.
//
// The returned Client watches the connection until Close: when it is lost,
// the Client reports not ready, waits for the driver, probes it again and
// re-reads its capabilities. A driver that comes back under another name is
// never reported ready again (Healthy says why).
func Connect(ctx context.Context, cfg Config) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.ProbeTimeout == 0 {
		cfg.ProbeTimeout = DefaultProbeTimeout
	}
	logger := klog.FromContext(ctx)
	c := &Client{
		cfg:     cfg,
		ready:   make(chan struct{}),
		problem: fmt.Errorf("connecting to %s", cfg.Address),
		since:   time.Now(),
		done:    make(chan struct{}),
	}

	opts := []connection.Option{
		// No deadline: wait for the socket as long as ctx lasts.
		connection.WithTimeout(0),
		// Reconnect after a loss (csi-lib-utils logs it); the monitor
		// probes the driver again before anything is sent to it.
		connection.OnConnectionLoss(func(context.Context) bool { return true }),
	}
	logger.Info("Connecting to the CSI driver", "address", cfg.Address)
	conn, err := connection.Connect(ctx, cfg.Address, cfg.Metrics, opts...)
	if err != nil {
		return nil, fmt.Errorf("connect to the CSI driver at %s: %w", cfg.Address, err)
	}
	c.conn = conn
	c.controller = csi.NewControllerClient(conn)
	c.node = csi.NewNodeClient(conn)

	name, caps, err := c.probeUntilReady(ctx)
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("probe the CSI driver at %s: %w", cfg.Address, err)
	}
	c.name = name
	// Set once, before any other goroutine uses the metrics manager: its
	// SetDriverName is not synchronized with RecordMetrics.
	if cfg.Metrics != nil {
		cfg.Metrics.SetDriverName(name)
	}
	c.setReady(caps)
	logger.Info("Connected to the CSI driver", "driver", name, "capabilities", caps)

	mctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	c.stop = stop
	go c.monitor(mctx)
	return c, nil
}

// DriverName is the name the driver reported in GetPluginInfo.
func (c *Client) DriverName() string { return c.name }

// Conn is the connection to the driver, for a service beside CSI on its
// socket (pkg/fenceapi).
func (c *Client) Conn() grpc.ClientConnInterface { return c.conn }

// Capabilities returns the capabilities the driver reported at the last
// successful probe.
func (c *Client) Capabilities() Capabilities {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.caps
}

// Healthy returns nil while the driver is connected and ready, else an error
// that says since when and why not (for /healthz).
func (c *Client) Healthy() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.isReady {
		return nil
	}
	return fmt.Errorf("CSI driver at %s not ready for %s: %w", c.cfg.Address, time.Since(c.since).Round(time.Second), c.problem)
}

// WaitReady blocks until the driver is connected and ready, or ctx ends (then
// it returns ctx's error).
func (c *Client) WaitReady(ctx context.Context) error {
	c.mu.Lock()
	ch := c.ready
	c.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close stops watching the connection and closes it.
func (c *Client) Close() error {
	c.stop()
	err := c.conn.Close()
	<-c.done
	return err
}

func (c *Client) setReady(caps Capabilities) {
	c.mu.Lock()
	c.caps = caps
	c.problem = nil
	var callbacks []func()
	if !c.isReady {
		c.isReady = true
		close(c.ready)
		if c.everReady {
			callbacks = slices.Clone(c.onReconnected)
		}
		c.everReady = true
	}
	c.mu.Unlock()
	for _, f := range callbacks {
		if f != nil {
			f()
		}
	}
}

// OnReconnected registers f to be called each time the driver is ready again
// after it was not (a restart, a lost socket), so that a controller can
// retry at once what failed while it was away rather than wait out each
// item's backoff. f must not block. remove unregisters it.
func (c *Client) OnReconnected(f func()) (remove func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	i := len(c.onReconnected)
	c.onReconnected = append(c.onReconnected, f)
	return func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.onReconnected[i] = nil
	}
}

func (c *Client) setNotReady(problem error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.problem = problem
	if c.isReady {
		c.isReady = false
		c.since = time.Now()
		c.ready = make(chan struct{})
	}
}

func (c *Client) isReadyNow() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.isReady
}

// probeUntilReady probes once a second until the driver is ready or ctx ends.
func (c *Client) probeUntilReady(ctx context.Context) (string, Capabilities, error) {
	logger := klog.FromContext(ctx)
	var last string
	for {
		name, caps, err := c.probeOnce(ctx)
		if err == nil {
			return name, caps, nil
		}
		c.setNotReady(err)
		// Log each new reason once; repeats only at V(4).
		if msg := err.Error(); msg != last {
			logger.Info("CSI driver not ready yet", "address", c.cfg.Address, "reason", msg)
			last = msg
		} else {
			logger.V(4).Info("CSI driver still not ready", "address", c.cfg.Address, "reason", msg)
		}
		select {
		case <-ctx.Done():
			return "", Capabilities{}, ctx.Err()
		case <-time.After(probeRetryInterval):
		}
	}
}

// monitor follows the connection state until ctx ends. Leaving READY marks
// the driver not ready; coming back to READY probes it again before it is
// marked ready.
func (c *Client) monitor(ctx context.Context) {
	defer close(c.done)
	logger := klog.FromContext(ctx)
	state := c.conn.GetState()
	for {
		if state == connectivity.Ready && !c.isReadyNow() {
			if err := c.reprobe(ctx); err != nil {
				c.setNotReady(err)
				logger.V(2).Info("CSI driver not ready after reconnecting", "address", c.cfg.Address, "reason", err.Error())
				// Probe again after a pause, or at once if the state changes.
				wctx, cancel := context.WithTimeout(ctx, probeRetryInterval)
				c.conn.WaitForStateChange(wctx, state)
				cancel()
				if ctx.Err() != nil {
					return
				}
				state = c.conn.GetState()
				continue
			}
			logger.Info("Reconnected to the CSI driver", "driver", c.name, "capabilities", c.Capabilities())
		}
		switch state {
		case connectivity.Shutdown:
			return
		case connectivity.Idle:
			// gRPC leaves a lost connection idle until asked; ask now so
			// the driver is found as soon as it is back.
			c.conn.Connect()
		}
		if !c.conn.WaitForStateChange(ctx, state) {
			return
		}
		if state == connectivity.Ready {
			logger.Error(errConnectionLost, "CSI driver connection left the ready state", "address", c.cfg.Address)
			c.setNotReady(errConnectionLost)
		}
		state = c.conn.GetState()
	}
}

// reprobe runs one probe after a reconnect and marks the driver ready if it
// is ready and still has the same name.
func (c *Client) reprobe(ctx context.Context) error {
	name, caps, err := c.probeOnce(ctx)
	if err != nil {
		return err
	}
	if name != c.name {
		return fmt.Errorf("the driver on the socket is now %q, not %q; restart the sidecar to serve it", name, c.name)
	}
	c.setReady(caps)
	return nil
}
