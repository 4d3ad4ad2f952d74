package main

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/loopvol/loopvol/pkg/heartbeat"
	"github.com/loopvol/loopvol/pkg/node"
)

// The node plugin's heartbeat (issue 26, docs/fencing.md): a Lease it
// renews every --heartbeat-interval, which the fencing controller watches;
// when no renewal succeeded for --self-fence-after, the node freezes its
// shared-pool volumes itself (pkg/node SelfFence) before anyone may fence it,
// and thaws them once a renewal succeeds again.
//
// /healthz does not follow the heartbeat: a node plugin that cannot reach
// the API server, restarted by its liveness probe, would lose what it froze
// and thaw it at its first renewal after a fence might have begun. The
// heartbeat's state is in the log and in two metrics instead.

// placeholderClient stands for the Kubernetes client when the flags are
// checked, before any client is made: RenewerConfig.Validate asks only that
// there is one.
type placeholderClient struct{ heartbeat.Client }

// validateHeartbeat checks the heartbeat's flags, each error naming its
// flags: durations on their own always, the rest (through
// heartbeat.RenewerConfig.Validate, the one statement of what works) when
// a heartbeat is asked for.
func (c *config) validateHeartbeat() []error {
	var errs []error
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{{"--heartbeat-interval", c.heartbeatInterval}, {"--fencing-period", c.fencingPeriod}, {"--self-fence-after", c.selfFenceAfter}} {
		if d.v <= 0 {
			errs = append(errs, fmt.Errorf("%s=%s must be positive", d.flag, d.v))
		}
	}
	if c.heartbeatNamespace == "" || len(errs) > 0 {
		return errs
	}
	if !c.serves(modeNode) {
		return append(errs, fmt.Errorf("--heartbeat-namespace: only a node plugin (--mode=node or all) renews a heartbeat, not --mode=%s", c.mode))
	}
	rc := c.renewerConfig(placeholderClient{}, time.Now(), nil)
	if err := rc.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("--heartbeat-namespace, --heartbeat-interval, --fencing-period, --self-fence-after: %w", err))
	}
	return errs
}

// renewerConfig is the Renewer's configuration from the flags; n, when not
// nil, is the node service it self-fences.
func (c *config) renewerConfig(client heartbeat.Client, incarnation time.Time, n *node.Server) heartbeat.RenewerConfig {
	rc := heartbeat.RenewerConfig{
		Client:         client,
		Namespace:      c.heartbeatNamespace,
		DriverName:     c.driverName,
		NodeID:         c.nodeID,
		Incarnation:    incarnation,
		RenewInterval:  c.heartbeatInterval,
		FencingPeriod:  c.fencingPeriod,
		SelfFenceAfter: c.selfFenceAfter,
	}
	if n != nil {
		rc.OnLost = n.SelfFence
		rc.OnRegained = n.EndSelfFence
		rc.FencedVolumes = n.FencedVolumes
	}
	return rc
}

// restConfig is the API server's client configuration: --kubeconfig, or
// the in-cluster one.
func (c *config) restConfig() (*rest.Config, error) {
	if c.kubeconfig == "" {
		rc, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("the heartbeat's API server (no --kubeconfig, so in-cluster): %w; give --kubeconfig, or no --heartbeat-namespace to run without a heartbeat", err)
		}
		return rc, nil
	}
	rc, err := clientcmd.BuildConfigFromFlags("", c.kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("--kubeconfig: %w", err)
	}
	return rc, nil
}

// startHeartbeat makes the Renewer of node service n and starts it in
// goroutines of run's group (go); they end with ctx. It also thaws what an
// earlier run of the plugin may have left frozen, at the first successful
// renewal: before that the node does not know it holds its heartbeat, and
// a thaw could let writes through while a fence may be on its way.
func startHeartbeat(ctx context.Context, cfg *config, n *node.Server, goFunc func(func())) (*heartbeat.Renewer, error) {
	rc, err := cfg.restConfig()
	if err != nil {
		return nil, err
	}
	rc = rest.CopyConfig(rc)
	rest.AddUserAgent(rc, "loopvol-driver-heartbeat")
	client, err := heartbeat.NewClient(rc)
	if err != nil {
		return nil, err
	}
	r, err := heartbeat.NewRenewer(cfg.renewerConfig(client, n.Incarnation(), n))
	if err != nil {
		return nil, err
	}
	logger := klog.FromContext(ctx)
	goFunc(func() {
		if err := r.Run(ctx); err != nil {
			logger.Error(err, "Heartbeat stopped")
		}
	})
	goFunc(func() {
		if waitFirstRenewal(ctx, r, cfg.heartbeatInterval) {
			n.ThawLeftovers(ctx)
		}
	})
	return r, nil
}

// waitFirstRenewal waits until r has renewed once (true) or ctx ends.
func waitFirstRenewal(ctx context.Context, r *heartbeat.Renewer, interval time.Duration) bool {
	tick := time.NewTicker(max(interval/8, 10*time.Millisecond))
	defer tick.Stop()
	for r.LastRenewed().IsZero() {
		select {
		case <-ctx.Done():
			return false
		case <-tick.C:
		}
	}
	return true
}

// heartbeatCollectors are the heartbeat's metrics: when the Lease was last
// renewed, and whether the node is self-fenced.
func heartbeatCollectors(r *heartbeat.Renewer, n *node.Server) []prometheus.Collector {
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "loopvol_node_heartbeat_last_renewed_timestamp_seconds",
			Help: "When the node plugin last renewed its heartbeat Lease (the start of the renewal, Unix seconds; 0 before the first).",
		}, func() float64 {
			t := r.LastRenewed()
			if t.IsZero() {
				return 0
			}
			return float64(t.UnixNano()) / 1e9
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "loopvol_node_self_fenced",
			Help: "1 while the node plugin, unable to renew its heartbeat, keeps the filesystems of its shared-pool volumes frozen (self-fenced), else 0.",
		}, func() float64 {
			if n.SelfFenced() {
				return 1
			}
			return 0
		}),
	}
}
