package resize

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/loopvol/loopvol/internal/kube"
	"github.com/loopvol/loopvol/pkg/csiclient"
)

// KubeClient is the part of the Kubernetes API the controller uses.
type KubeClient = kube.Client

// CSI is the part of a driver connection the controller uses;
// *csiclient.Client implements it.
type CSI interface {
	// WaitReady blocks until the driver is connected and ready, or ctx ends
	// (then it returns ctx's error). Workers wait here while the driver
	// socket is gone, instead of failing every claim.
	WaitReady(ctx context.Context) error
	// Capabilities returns the driver's current capabilities.
	Capabilities() csiclient.Capabilities
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
	cfg      Config
	client   KubeClient
	csi      CSI
	recorder record.EventRecorder
	clock    clock.PassiveClock

	pvcInformer cache.SharedIndexInformer
	pvInformer  cache.SharedIndexInformer
	pvcLister   corelisters.PersistentVolumeClaimLister
	pvLister    corelisters.PersistentVolumeLister

	claimQueue
	metrics *kube.ClaimMetrics
}

// New builds a controller over the PersistentVolumeClaim and
// PersistentVolume informers of cfg.Informers. It adds no event handlers:
// Run does, so that a replica waiting for its Lease keeps a warm cache and
// an empty queue.
func New(cfg Config) (*Controller, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("resize controller: %w", err)
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("resize controller metrics: %w", err)
	}
	c := &Controller{
		cfg:      cfg,
		client:   cfg.Client,
		csi:      cfg.CSI,
		recorder: cfg.Recorder,
		clock:    clock.RealClock{},
		// Final errors wait at least 32 initial intervals (32 s at the
		// defaults), growing to the maximum: the same request fails the
		// same way until someone changes it, and that change queues the
		// claim at once anyway.
		claimQueue: newClaimQueue(QueueName(cfg.DriverName), cfg.Informers, cfg.RetryIntervalStart, cfg.RetryIntervalMax, cfg.CSI.WaitReady),
		metrics:    m,
	}
	c.syncKey, c.wants = c.sync, c.shouldEnqueue
	c.pvcInformer = cfg.Informers.PersistentVolumeClaims()
	c.pvInformer = cfg.Informers.PersistentVolumes(kube.PVResize)
	c.pvcLister = corelisters.NewPersistentVolumeClaimLister(c.pvcInformer.GetIndexer())
	c.pvLister = corelisters.NewPersistentVolumeLister(c.pvInformer.GetIndexer())
	return c, nil
}

// Run adds the event handlers, waits for the caches, runs the workers until
// ctx ends, then shuts the queue down and waits for the workers to finish
// their current claim. It returns nil when ctx ends, and an error only when
// it could not start.
func (c *Controller) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	defer c.queue.ShutDown()
	if c.recorder == nil {
		events := record.NewBroadcaster(record.WithContext(ctx))
		events.StartStructuredLogging(3)
		events.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: c.client.CoreV1().Events("")})
		defer events.Shutdown()
		c.recorder = events.NewRecorder(scheme.Scheme, corev1.EventSource{Component: EventComponent(c.cfg.DriverName)})
	}
	// Added only now, when this replica starts acting: the shared
	// informers run on a standby replica too, and adding a handler to a
	// running informer replays its cache.
	handlers, err := c.addEventHandlers(logger)
	if err != nil {
		return fmt.Errorf("resize controller: event handlers: %w", err)
	}
	defer handlers.Remove(logger)

	logger.Info("Starting the resize controller", "driver", c.cfg.DriverName, "workers", c.cfg.Workers,
		"queue", c.queue.Name, "handleVolumeInUseError", c.cfg.HandleVolumeInUseError)
	synced := append([]cache.InformerSynced{c.pvcInformer.HasSynced, c.pvInformer.HasSynced}, handlers.Synced()...)
	if !cache.WaitForNamedCacheSyncWithContext(ctx, synced...) {
		return nil // ctx ended
	}
	var wg sync.WaitGroup
	for range c.cfg.Workers {
		wg.Go(func() { wait.UntilWithContext(ctx, c.worker, time.Second) })
	}
	logger.Info("Resize controller started")
	<-ctx.Done()
	logger.Info("Stopping the resize controller")
	c.queue.ShutDown()
	wg.Wait()
	logger.Info("Resize controller stopped")
	return nil
}

// permanent and isFinal are the shared sync-error classification
// (kube.Permanent, kube.IsFinal).
var (
	permanent = kube.Permanent
	isFinal   = kube.IsFinal
)

var _ CSI = (*csiclient.Client)(nil)
