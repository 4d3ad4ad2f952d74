package resize

import (
	"context"
	"fmt"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/loopvol/loopvol/internal/kube"
	"github.com/loopvol/loopvol/pkg/csiclient"
)

// CSI is the part of a driver connection the controller uses;
// *csiclient.Client implements it.
type CSI interface {
	kube.ClaimDriver
	// ControllerExpandVolume grows a volume. Errors keep their gRPC
	// status. Asked only of drivers with the controller's EXPAND_VOLUME.
	ControllerExpandVolume(ctx context.Context, req *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error)
	// NodeGetCapabilities returns the node service's capabilities. Asked
	// only of drivers without the controller's EXPAND_VOLUME, to learn
	// whether the node expands volumes by itself.
	NodeGetCapabilities(ctx context.Context) (*csi.NodeGetCapabilitiesResponse, error)
}

// Config is what New needs.
type Config struct {
	// ClaimConfig is what the modify controller is given too; only claims
	// bound to PersistentVolumes of DriverName are handled.
	kube.ClaimConfig
	// CSI is the driver connection.
	CSI CSI
	// HandleVolumeInUseError: after the driver refused to expand a volume
	// because it is in use (FAILED_PRECONDITION, a driver that expands only
	// unpublished volumes), do not call it again while a pod that has not
	// ended uses the claim.
	HandleVolumeInUseError bool
	// AnnotatePreResizeCapacity: record the claim's capacity from before an
	// expansion that needs the node in PreResizeCapacityAnnotation on the
	// PersistentVolume (upstream feature gate AnnotateFsResize).
	AnnotatePreResizeCapacity bool
}

// Validate reports the first field of c that cannot work.
func (c Config) Validate() error { return c.ClaimConfig.Validate(c.CSI) }

// Controller is the resize controller. Build it with New, start it with
// Run.
type Controller struct {
	cfg    Config
	client kube.Client
	csi    CSI
	clock  clock.PassiveClock

	// claims is the work loop, the caches and the record of the
	// controller's own writes, as the modify controller has its own.
	claims *kube.ClaimQueue
	// state is what the controller remembers of the driver's last answers.
	state *claimState
}

// New builds a controller over the PersistentVolumeClaim and
// PersistentVolume informers of cfg.Informers. It adds no event handlers:
// Run does, so that a replica waiting for its Lease keeps a warm cache and
// an empty queue.
func New(cfg Config) (*Controller, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("resize controller: %w", err)
	}
	c := &Controller{cfg: cfg, client: cfg.Client, csi: cfg.CSI, state: newClaimState()}
	// Final errors wait at least 32 initial intervals (32 s at the
	// defaults), growing to the maximum (kube.NewQueue): the same request
	// fails the same way until someone changes it, and that change queues
	// the claim at once anyway.
	claims, err := kube.NewClaimQueue(kube.ClaimQueueConfig{
		ClaimConfig: cfg.ClaimConfig, Controller: "resize", Name: QueueName(cfg.DriverName), EventComponent: EventComponent(cfg.DriverName),
		Metrics: metricNames, Ready: cfg.CSI.WaitReady, Sync: c.sync, Wants: c.shouldEnqueue,
		Forget: func(key string, pvc *corev1.PersistentVolumeClaim) { c.state.drop(key, string(pvc.UID)) },
		Writes: c.state.writes,
	})
	if err != nil {
		return nil, err
	}
	c.claims, c.clock = claims, claims.Clock
	return c, nil
}

// Run adds the event handlers, waits for the caches, runs the workers until
// ctx ends, then shuts the queue down and waits for the workers to finish
// their current claim (kube.ClaimQueue.Run). It returns nil when ctx ends,
// and an error only when it could not start.
func (c *Controller) Run(ctx context.Context) error {
	klog.FromContext(ctx).Info("Starting the resize controller", "driver", c.cfg.DriverName, "workers", c.cfg.Workers,
		"queue", c.claims.Queue.Name, "handleVolumeInUseError", c.cfg.HandleVolumeInUseError)
	return c.claims.Run(ctx, nil, nil)
}

var _ CSI = (*csiclient.Client)(nil)
