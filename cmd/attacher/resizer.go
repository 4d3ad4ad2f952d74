package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"sync"
	"time"

	"k8s.io/component-base/featuregate"
	"k8s.io/klog/v2"

	"github.com/loopvol/loopvol/internal/kube"
	"github.com/loopvol/loopvol/pkg/modify"
	"github.com/loopvol/loopvol/pkg/resize"
)

// volumeAttributesClassGate is external-resizer's feature gate of its
// modify controller (GA, on by default). Unless it is set explicitly, the
// controller also checks that the API server serves VolumeAttributesClasses.
const volumeAttributesClassGate featuregate.Feature = "VolumeAttributesClass"

// resizerConfig holds the flags of the resizer controller.
type resizerConfig struct {
	handleVolumeInUseError bool
	// workers and resyncPeriod are external-resizer's names for
	// --worker-threads and --resync; zero means "as those".
	workers      int
	resyncPeriod time.Duration
	// extraModifyMetadata adds the claim's and volume's names to the
	// mutable parameters of ControllerModifyVolume.
	extraModifyMetadata bool
}

// addFlags declares the resizer controller's flags.
func (c *resizerConfig) addFlags(fs *flag.FlagSet) {
	fs.BoolVar(&c.handleVolumeInUseError, "handle-volume-inuse-error", true, "Resizer: after the driver refused to expand a volume because it is in use (FAILED_PRECONDITION, a driver that expands only unpublished volumes), "+
		"do not call it again while a pod that has not ended uses the claim (the pods of the claim's namespace are listed for such claims only).")
	fs.IntVar(&c.workers, "workers", 0, "Resizer: number of claims expanded at once, and, separately, of claims whose VolumeAttributesClass is applied at once (external-resizer's name). 0 means --worker-threads.")
	fs.DurationVar(&c.resyncPeriod, "resync-period", 0, "Resizer: how often every claim is looked at again, for expansion and for its VolumeAttributesClass (external-resizer's name). 0 means --resync.")
	fs.BoolVar(&c.extraModifyMetadata, "extra-modify-metadata", false, "Resizer: add the claim's name and namespace and the volume's name to the mutable parameters of ControllerModifyVolume "+
		"(csi.storage.k8s.io/pvc/name, csi.storage.k8s.io/pvc/namespace, csi.storage.k8s.io/pv/name), as external-resizer does. "+
		"The modify controller runs with the resizer when the driver offers MODIFY_VOLUME; --feature-gates=VolumeAttributesClass=false turns it off.")
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

// buildResizer builds the resize controller and, as external-resizer runs
// both, the VolumeAttributesClass modify controller, under one Lease.
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
	// Both controllers get the same flags, as external-resizer's.
	claims := kube.ClaimConfig{
		DriverName:         d.driver,
		Client:             d.client,
		Informers:          d.informers,
		Workers:            workers,
		Resync:             resync,
		RetryIntervalStart: d.cfg.retryIntervalStart,
		RetryIntervalMax:   d.cfg.retryIntervalMax,
		Registerer:         d.registry,
		NodeName:           node,
	}
	c, err := resize.New(resize.Config{
		ClaimConfig:               claims,
		CSI:                       d.csi,
		HandleVolumeInUseError:    rc.handleVolumeInUseError,
		AnnotatePreResizeCapacity: d.cfg.compat.featureGates.fg.Enabled("AnnotateFsResize"),
	})
	if err != nil {
		return nil, err
	}
	gates := d.cfg.compat.featureGates.fg
	switch {
	case !gates.Enabled(volumeAttributesClassGate):
		return &runner{lease: resize.LeaseName(d.driver), run: func(ctx context.Context) error {
			klog.FromContext(ctx).Info("The VolumeAttributesClass modify controller is off (--feature-gates=VolumeAttributesClass=false)")
			return c.Run(ctx)
		}}, nil
	case !d.csi.Capabilities().ModifyVolume:
		// As upstream: a driver without MODIFY_VOLUME gets no modify
		// controller; one that gains it is served after a restart.
		return &runner{lease: resize.LeaseName(d.driver), run: func(ctx context.Context) error {
			klog.FromContext(ctx).Info("The driver does not offer MODIFY_VOLUME: the VolumeAttributesClass modify controller is off")
			return c.Run(ctx)
		}}, nil
	}
	explicit := false
	if g, ok := gates.(interface {
		ExplicitlySet(featuregate.Feature) bool
	}); ok {
		explicit = g.ExplicitlySet(volumeAttributesClassGate)
	}
	mc, err := modify.New(modify.Config{
		ClaimConfig:         claims,
		CSI:                 d.csi,
		ExtraModifyMetadata: rc.extraModifyMetadata,
		ProbeAPI:            !explicit,
	})
	if err != nil {
		return nil, err
	}
	return &runner{lease: resize.LeaseName(d.driver), run: func(ctx context.Context) error { return runTogether(ctx, c.Run, mc.Run) }}, nil
}

// runTogether runs every run func until ctx ends. One that returns nil
// early (the modify controller without a VolumeAttributesClass API) leaves
// the others running; one that fails stops them all, and its error is
// returned.
func runTogether(ctx context.Context, runs ...func(context.Context) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make([]error, len(runs))
	var wg sync.WaitGroup
	for i, run := range runs {
		wg.Go(func() {
			if errs[i] = run(ctx); errs[i] != nil {
				cancel()
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}
