package main

import (
	"flag"
	"fmt"
	"time"

	"github.com/loopvol/loopvol/pkg/resize"
)

// resizerConfig holds the flags of the resizer controller.
type resizerConfig struct {
	handleVolumeInUseError bool
	// workers and resyncPeriod are external-resizer's names for
	// --worker-threads and --resync; zero means "as those".
	workers      int
	resyncPeriod time.Duration
	// extraModifyMetadata is accepted for external-resizer manifests; the
	// modify controller it configures is not part of this sidecar.
	extraModifyMetadata bool
}

// addFlags declares the resizer controller's flags.
func (c *resizerConfig) addFlags(fs *flag.FlagSet) {
	fs.BoolVar(&c.handleVolumeInUseError, "handle-volume-inuse-error", true, "Resizer: after the driver refused to expand a volume because it is in use (FAILED_PRECONDITION, a driver that expands only unpublished volumes), "+
		"do not call it again while a pod that has not ended uses the claim (the pods of the claim's namespace are listed for such claims only).")
	fs.IntVar(&c.workers, "workers", 0, "Resizer: number of claims expanded at once (external-resizer's name). 0 means --worker-threads.")
	fs.DurationVar(&c.resyncPeriod, "resync-period", 0, "Resizer: how often every claim is looked at again (external-resizer's name). 0 means --resync.")
	fs.BoolVar(&c.extraModifyMetadata, "extra-modify-metadata", false, "Accepted for external-resizer manifests and ignored: it configures external-resizer's VolumeAttributesClass modify controller, which this sidecar does not have.")
}

// validate checks the resizer controller's flags; called only when it runs.
func (c *resizerConfig) validate(cfg *config) error {
	switch {
	case c.workers < 0:
		return fmt.Errorf("--workers must not be negative, not %d", c.workers)
	case c.workers > 10000:
		return fmt.Errorf("--workers=%d is more than 10000", c.workers)
	case c.resyncPeriod < 0:
		return fmt.Errorf("--resync-period must not be negative, not %s", c.resyncPeriod)
	}
	return nil
}

// buildResizer builds the resize controller (external-resizer).
func buildResizer(d *deps) (*runner, error) {
	rc := d.cfg.resizer
	workers := rc.workers
	if workers == 0 {
		workers = int(d.cfg.workerThreads)
	}
	resync := rc.resyncPeriod
	if resync == 0 {
		resync = d.cfg.resync
	}
	var node string
	if d.cfg.nodeDeployment {
		// Only the volumes of this node's pools: the driver next to it
		// knows no others.
		node = d.cfg.nodeName
	}
	c, err := resize.New(resize.Config{
		DriverName:                d.driver,
		Client:                    d.client,
		CSI:                       d.csi,
		Informers:                 d.informers,
		Workers:                   workers,
		Resync:                    resync,
		RetryIntervalStart:        d.cfg.retryIntervalStart,
		RetryIntervalMax:          d.cfg.retryIntervalMax,
		HandleVolumeInUseError:    rc.handleVolumeInUseError,
		AnnotatePreResizeCapacity: d.cfg.compat.featureGates.fg.Enabled("AnnotateFsResize"),
		Registerer:                d.registry,
		NodeName:                  node,
	})
	if err != nil {
		return nil, err
	}
	return &runner{lease: resize.LeaseName(d.driver), run: c.Run}, nil
}
