package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"
	"k8s.io/mount-utils"
	utilexec "k8s.io/utils/exec"
	"sigs.k8s.io/yaml"

	"github.com/loopvol/loopvol/internal/health"
	"github.com/loopvol/loopvol/pkg/controller"
	"github.com/loopvol/loopvol/pkg/csiserver"
	"github.com/loopvol/loopvol/pkg/loop"
	"github.com/loopvol/loopvol/pkg/metrics"
	"github.com/loopvol/loopvol/pkg/node"
	"github.com/loopvol/loopvol/pkg/pool"
	"github.com/loopvol/loopvol/pkg/pool/poolmetrics"
)

// listenFunc opens the HTTP endpoint's listener: net.Listen, or in tests
// one that fails on purpose.
type listenFunc func(network, address string) (net.Listener, error)

// run serves the CSI services until ctx ends (nil) or something fails for
// good (an error): the CSI server, or the metrics and health endpoint,
// whose failure stops the driver too, since its probes and metrics would
// be gone without anyone noticing.
func run(ctx context.Context, cfg *config, listen listenFunc) error {
	logger := klog.FromContext(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)

	// Listen before anything touches a pool, so that a bad address fails
	// at once and leaves no node record behind.
	var ln net.Listener
	if cfg.httpEndpoint != "" {
		var err error
		if ln, err = listen("tcp", cfg.httpEndpoint); err != nil {
			return fmt.Errorf("--http-endpoint: %w", err)
		}
		defer ln.Close() // for the returns before Serve
	}
	pools, err := cfg.openPools()
	if err != nil {
		return err
	}
	srvCfg := csiserver.Config{Endpoint: cfg.endpoint}
	var extra []prometheus.Collector // registered beside the pools'
	served := pools
	if cfg.serves(modeNode) {
		byName := map[string]*pool.Pool{}
		served = nil
		for _, p := range pools {
			byName[p.Name] = p
			if p.Zone == cfg.zone {
				served = append(served, p)
			}
		}
		n, err := node.New(node.Config{
			NodeID:     cfg.nodeID,
			Zone:       cfg.zone,
			MaxVolumes: cfg.maxVolumes,
			Version:    version,
			KubeletDir: cfg.kubeletDir,
			PodUID:     cfg.podUID,
			Pools:      byName,
			Loop:       loop.New(loop.Owner(cfg.nodeID)), // only this node's devices (docs/security.md)
			Mounter:    &mount.SafeFormatAndMount{Interface: mount.New(""), Exec: utilexec.New()},
		})
		if err != nil {
			return err
		}
		n.Start(ctx) // its staged records, as its loop devices say
		srvCfg.Node = n
		srvCfg.Status = n
		if cfg.heartbeatNamespace == "" {
			// Nothing of this run freezes: what an earlier run, with a
			// heartbeat, may have left frozen is thawed now.
			n.ThawLeftovers(ctx)
		} else {
			r, err := startHeartbeat(ctx, cfg, n, wg.Go)
			if err != nil {
				return err
			}
			extra = append(extra, heartbeatCollectors(r, n)...)
		}
	}
	if cfg.serves(modeController) {
		// Loop: a volume mounted on this node is frozen for its snapshot.
		// Beside this node's plugin (--mode=all) that is a device the node
		// attached; a controller alone is no node and sees every device.
		devices := loop.New()
		if cfg.serves(modeNode) {
			devices = loop.New(loop.Owner(cfg.nodeID))
		}
		c, err := controller.New(controller.Config{Pools: pools, DefaultFsType: cfg.defaultFsType, Loop: devices})
		if err != nil {
			return err
		}
		c.Start(ctx) // sweeps what killed processes left in the pools, then every 10 minutes
		srvCfg.Controller = c
		srvCfg.Fence = c
		served = pools
	}
	identity := controller.NewIdentity(cfg.driverName, version, srvCfg.Controller != nil, served)
	srvCfg.Identity = identity
	mm := metrics.NewPlugin(cfg.driverName)
	mm.GetRegistry().RawMustRegister(poolmetrics.Collector{Usage: func() []poolmetrics.Usage {
		return poolmetrics.Measure(served)
	}})
	for _, c := range extra {
		mm.GetRegistry().RawMustRegister(c)
	}
	if srvCfg.Controller != nil {
		for _, c := range controller.Collectors() { // fencing's
			mm.GetRegistry().RawMustRegister(c)
		}
	}
	srvCfg.Metrics = mm

	srv, err := csiserver.Listen(ctx, srvCfg)
	if err != nil {
		return err
	}
	if ln != nil {
		mux := http.NewServeMux()
		mm.RegisterToServer(mux, "/metrics")
		mux.Handle("/healthz", health.Handler(func() error { return ready(ctx, identity) }, http.StatusServiceUnavailable))
		logger.Info("Serving HTTP", "address", ln.Addr().String())
		wg.Go(func() {
			if err := health.Serve(ctx, ln, mux); err != nil {
				cancel(fmt.Errorf("HTTP endpoint %s: %w", cfg.httpEndpoint, err))
			}
		})
	}
	var names []string
	for _, p := range served {
		names = append(names, p.Name+"="+p.Path+" ("+p.Zone+")")
	}
	logger.Info("Serving CSI", "endpoint", cfg.endpoint, "mode", cfg.mode, "driver", cfg.driverName, "nodeID", cfg.nodeID, "pools", names, "version", version)
	if err := srv.Serve(ctx); err != nil {
		return err
	}
	// Serve stopped because ctx ended: by a signal (a clean stop), or by
	// the HTTP endpoint's failure, which is the driver's.
	if cause := context.Cause(ctx); !errors.Is(cause, context.Canceled) {
		return cause
	}
	return nil
}

// errNotReady is what /healthz answers while Probe is not ready.
var errNotReady = errors.New("not ready: no pool is usable (see the driver log)")

// ready is the check of /healthz: the Identity service's Probe.
func ready(ctx context.Context, identity *controller.Identity) error {
	resp, err := identity.Probe(ctx, nil)
	if err != nil || !resp.GetReady().GetValue() {
		return errNotReady
	}
	return nil
}

// configFile is the --config format: pools of several zones, for a
// controller that serves them all.
type configFile struct {
	Pools []struct {
		Name         string `json:"name"`
		Zone         string `json:"zone"`
		Path         string `json:"path"`
		ReserveBytes int64  `json:"reserveBytes"`
	} `json:"pools"`
}

// openPools opens the pools of --pool (in --zone) and of --config.
func (c *config) openPools() ([]*pool.Pool, error) {
	all := []pool.Options{}
	for _, p := range c.pools {
		p.Zone = c.zone
		all = append(all, p)
	}
	if c.configFile != "" {
		data, err := os.ReadFile(c.configFile)
		if err != nil {
			return nil, fmt.Errorf("--config: %w", err)
		}
		var cf configFile
		if err := yaml.UnmarshalStrict(data, &cf); err != nil {
			return nil, fmt.Errorf("--config %s: %w", c.configFile, err)
		}
		for _, p := range cf.Pools {
			all = append(all, pool.Options{Name: p.Name, Zone: p.Zone, Path: p.Path, ReserveBytes: p.ReserveBytes})
		}
	}
	seen := map[string]bool{}
	var pools []*pool.Pool
	for _, opts := range all {
		if seen[opts.Name] {
			return nil, fmt.Errorf("pool %q is given twice", opts.Name)
		}
		seen[opts.Name] = true
		p, err := pool.Open(opts)
		if err != nil {
			return nil, err
		}
		pools = append(pools, p)
	}
	return pools, nil
}
