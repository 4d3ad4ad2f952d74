package main

import (
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/loopvol/loopvol/pkg/fenceapi"
	"github.com/loopvol/loopvol/pkg/fencing"
	"github.com/loopvol/loopvol/pkg/heartbeat"
)

// fencingConfig holds the flags of the fencing controller (loopvol's own:
// docs/fencing.md).
type fencingConfig struct {
	period            time.Duration
	taintOutOfService bool
	fenceByCopy       bool
}

// addFlags declares the fencing controller's flags.
func (c *fencingConfig) addFlags(fs *flag.FlagSet) {
	fs.DurationVar(&c.period, "fencing-period", heartbeat.DefaultFencingPeriod,
		"fencing: how long a node plugin's heartbeat Lease (in $NAMESPACE) must go unrenewed, as this sidecar sees it, before its node may be fenced; a node whose Lease states a longer period gets that. "+
			"The node is fenced only once its kubelet is not Ready either. It must be longer than the node plugins' --self-fence-after (they stop I/O by then).")
	fs.BoolVar(&c.taintOutOfService, "fencing-taint-out-of-service", false,
		"fencing: put node.kubernetes.io/out-of-service on a node once it is fenced, so that kube-controller-manager deletes its Pods and detaches their volumes at once and a StatefulSet's Pod starts elsewhere within a minute or two, "+
			"and take it off when the node is back and Ready. Off by default: it also deletes the Pods of the node's local volumes, which cannot run elsewhere (docs/fencing.md).")
	fs.BoolVar(&c.fenceByCopy, "fence-by-copy", true,
		"fencing: on a pool without reflink, fence a filesystem volume by a full copy of its image (it needs the space of the data once more, and takes the time of a copy: docs/fencing.md). "+
			"Off: such volumes are left staged on the fenced node, with an Event, until it is back. A raw block volume is never copied (its node cannot freeze it).")
}

// validate checks the fencing controller's flags; called only when it runs.
func (c *fencingConfig) validate(*config) error {
	if c.period < 2*time.Second {
		return fmt.Errorf("--fencing-period must be at least 2s, not %s", c.period)
	}
	return nil
}

// buildFencing builds the fencing controller. The heartbeat Leases are in
// $NAMESPACE, the driver's namespace, where its node plugins renew them.
func buildFencing(d *deps) (*runner, error) {
	ns := d.env("NAMESPACE")
	if ns == "" {
		return nil, errors.New("$NAMESPACE is empty: it names the namespace of the node plugins' heartbeat Leases (set it from metadata.namespace with the downward API)")
	}
	if d.cfg.nodeDeployment {
		return nil, errors.New("fencing runs centrally, not with --node-deployment: a node cannot judge whether another one is gone")
	}
	leases, err := heartbeat.NewClient(d.rest)
	if err != nil {
		return nil, err
	}
	c, err := fencing.New(fencing.Config{
		DriverName:         d.driver,
		Client:             d.client,
		Heartbeats:         leases,
		Informers:          d.informers,
		Fencer:             fenceapi.NewClient(d.csi.Conn()),
		Namespace:          ns,
		FencingPeriod:      d.cfg.fencing.period,
		TaintOutOfService:  d.cfg.fencing.taintOutOfService,
		FenceByCopy:        d.cfg.fencing.fenceByCopy,
		Registry:           d.registry,
		RetryIntervalStart: d.cfg.retryIntervalStart,
		RetryIntervalMax:   d.cfg.retryIntervalMax,
	})
	if err != nil {
		return nil, err
	}
	return &runner{lease: fencing.LeaseName(d.driver), run: c.Run}, nil
}
