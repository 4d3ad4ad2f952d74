package attach

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/util/wait"
	corelisters "k8s.io/client-go/listers/core/v1"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/loopvol/loopvol/internal/kube"
	"github.com/loopvol/loopvol/pkg/csiclient"
)

// Names of the work queues, as the workqueue metrics report them. The attach
// and PV queues keep the upstream names so existing dashboards still work.
const (
	AttachQueueName = "csi-attacher-va"
	DetachQueueName = "csi-attacher-va-detach"
	PVQueueName     = "csi-attacher-pv"
)

// EventComponent is the source component of the Events the controller
// records when Config.Recorder is nil.
const EventComponent = "loopvol-attacher"

// KubeClient is the part of the Kubernetes API the controller uses.
type KubeClient = kube.Client

// CSI is the part of a driver connection the controller uses;
// *csiclient.Client implements it.
type CSI interface {
	// WaitReady blocks until the driver is connected and ready, or ctx ends
	// (then it returns ctx's error). Workers wait here while the driver
	// socket is gone, instead of failing every object.
	WaitReady(ctx context.Context) error
	// Capabilities returns the driver's current capabilities.
	Capabilities() csiclient.Capabilities
	// ControllerPublish publishes a volume and returns its publish context.
	// Errors keep their gRPC status.
	ControllerPublish(ctx context.Context, req *csi.ControllerPublishVolumeRequest) (map[string]string, error)
	// ControllerUnpublish unpublishes a volume. It is not an error when the
	// volume is not published on the node.
	ControllerUnpublish(ctx context.Context, req *csi.ControllerUnpublishVolumeRequest) error
	// ListVolumes returns, for each volume ID, the node IDs it is published
	// on (all pages).
	ListVolumes(ctx context.Context) (map[string][]string, error)
	// OnReconnected registers f to run each time the driver is ready again
	// after it was not; remove unregisters it.
	OnReconnected(f func()) (remove func())
}

// Config is what New needs.
type Config struct {
	// DriverName is the CSI driver's name; only VolumeAttachments with this
	// spec.attacher are handled.
	DriverName string
	// Client talks to the Kubernetes API.
	Client KubeClient
	// CSI is the driver connection.
	CSI CSI
	// Recorder records the Events on VolumeAttachments. Optional: when nil,
	// the controller records through its own broadcaster to the Events API
	// while Run runs.
	Recorder record.EventRecorder
	// Workers is the number of workers of the attach queue and, separately,
	// of the detach queue. The PersistentVolume queue gets a quarter of it
	// (at least one).
	Workers int
	// RetryIntervalStart and RetryIntervalMax bound the per-object
	// exponential backoff after a failure.
	RetryIntervalStart time.Duration
	RetryIntervalMax   time.Duration
	// ReconcileSync is the period of the ListVolumes reconcile; zero
	// disables it.
	ReconcileSync time.Duration
	// DefaultFSType is the filesystem of mount volumes whose source names
	// none.
	DefaultFSType string
	// Registerer receives the controller's metrics. Optional.
	Registerer prometheus.Registerer
	// Informers are the process's shared informers; the caller starts
	// them (their resync period is every controller's).
	Informers *kube.Informers
	// NodeName, when set, limits the controller to the VolumeAttachments of
	// that node (--node-deployment: one sidecar per node, next to a driver
	// that can only serve its own node's pool).
	NodeName string
	// Timeout is the timeout of a ControllerPublishVolume or
	// ControllerUnpublishVolume call (--timeout). After a call of a
	// VolumeAttachment timed out, its next call gets twice as long, up to
	// TimeoutGrowthLimit × Timeout. Zero leaves the timeout to the CSI
	// connection and never grows it.
	Timeout time.Duration
	// LeakGrace is how long the reconcile must see a volume published to
	// a node that no VolumeAttachment wants before it unpublishes it. Zero
	// means twice ReconcileSync.
	LeakGrace time.Duration
}

// TimeoutGrowthLimit bounds the growth of the per-call timeout of a
// VolumeAttachment whose calls time out: at most this many times
// Config.Timeout (2 minutes at the default --timeout of 15 s).
const TimeoutGrowthLimit = 8

// Validate reports the first field of c that cannot work.
func (c Config) Validate() error {
	if err := kube.ValidateController(c.DriverName, c.Client, c.Informers, c.CSI, c.Workers, c.RetryIntervalStart, c.RetryIntervalMax); err != nil {
		return err
	}
	switch {
	case c.ReconcileSync < 0:
		return fmt.Errorf("the reconcile period must not be negative, not %s", c.ReconcileSync)
	case c.Timeout < 0:
		return fmt.Errorf("the CSI call timeout must not be negative, not %s", c.Timeout)
	case c.LeakGrace < 0:
		return fmt.Errorf("the leaked-publish grace period must not be negative, not %s", c.LeakGrace)
	}
	return nil
}

// queue is one of the controller's work queues.
type queue = kube.Queue[string]

// Controller is the VolumeAttachment controller. Build it with New, start it
// with Run.
type Controller struct {
	cfg       Config
	finalizer string
	client    KubeClient
	csi       CSI
	recorder  record.EventRecorder
	clock     clock.WithTicker

	vaInformer      cache.SharedIndexInformer
	pvInformer      cache.SharedIndexInformer
	csiNodeInformer cache.SharedIndexInformer
	vaIndexer       cache.Indexer
	vaLister        storagelisters.VolumeAttachmentLister
	pvLister        corelisters.PersistentVolumeLister
	csiNodeLister   storagelisters.CSINodeLister

	attachQ, detachQ, pvQ *queue

	locks   *keyLocks
	pending *pendingTracker
	state   *vaState
	leaks   *leakTracker
	metrics *metrics
	// api tells whether the API server answers (the shared informers'
	// view, with the controller's own requests added).
	api *kube.APIHealth
	// timeoutLogged is set once the first driver call timeout was logged
	// at level 0.
	timeoutLogged atomic.Bool
}

// New builds a controller over the VolumeAttachment, PersistentVolume and
// CSINode informers of cfg.Informers.
func New(cfg Config) (*Controller, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("attach controller: %w", err)
	}
	clk := clock.RealClock{}
	c := &Controller{
		cfg:       cfg,
		finalizer: FinalizerName(cfg.DriverName),
		client:    cfg.Client,
		csi:       cfg.CSI,
		recorder:  cfg.Recorder,
		clock:     clk,
		// A final error waits at least 32 initial intervals (32 s at the
		// defaults): it will fail the same way until something changes. A
		// detach on the same volume or node wakes it earlier.
		attachQ: kube.NewQueue[string](AttachQueueName, cfg.RetryIntervalStart, cfg.RetryIntervalMax),
		detachQ: kube.NewQueue[string](DetachQueueName, cfg.RetryIntervalStart, cfg.RetryIntervalMax),
		pvQ:     kube.NewQueue[string](PVQueueName, cfg.RetryIntervalStart, cfg.RetryIntervalMax),
		api:     cfg.Informers.APIHealth(),
		locks:   newKeyLocks(),
		pending: newPendingTracker(clk),
		state:   newVAState(),
		leaks:   newLeakTracker(),
	}
	m, err := newMetrics(c.trackedObjects, cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("attach controller metrics: %w", err)
	}
	c.metrics = m

	c.vaInformer = cfg.Informers.VolumeAttachments()
	if err := c.vaInformer.AddIndexers(vaIndexers); err != nil {
		return nil, fmt.Errorf("attach controller: VolumeAttachment indexes: %w", err)
	}
	c.pvInformer = cfg.Informers.PersistentVolumes(kube.PVAttach)
	c.csiNodeInformer = cfg.Informers.CSINodes()
	c.vaIndexer = c.vaInformer.GetIndexer()
	c.vaLister = storagelisters.NewVolumeAttachmentLister(c.vaIndexer)
	c.pvLister = corelisters.NewPersistentVolumeLister(c.pvInformer.GetIndexer())
	c.csiNodeLister = storagelisters.NewCSINodeLister(c.csiNodeInformer.GetIndexer())
	return c, nil
}

// Run waits for the caches of the informers, runs the workers and the
// reconcile until ctx ends, then shuts the queues down and waits for the
// workers to finish their current item. It returns nil when ctx ends, and an
// error only when it could not start.
func (c *Controller) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	if c.recorder == nil {
		var stop func()
		c.recorder, stop = kube.StartRecorder(ctx, c.client.CoreV1(), EventComponent)
		defer stop()
	}
	// The handlers are added only now, when this replica starts acting:
	// shared informers run (and keep a warm cache) on a standby replica
	// too, and adding a handler to a running informer replays its cache.
	handlers, err := c.addEventHandlers(logger, c.vaInformer, c.pvInformer, c.csiNodeInformer)
	if err != nil {
		c.shutDownQueues()
		return fmt.Errorf("attach controller: event handlers: %w", err)
	}
	defer handlers.Remove(logger)

	// After an API server outage, what failed meanwhile is retried at
	// once rather than after each item's backoff.
	removeRecovered := c.api.OnRecovered(func() {
		n := c.attachQ.ResetBackoff() + c.detachQ.ResetBackoff() + c.pvQ.ResetBackoff()
		logger.Info("The API server is back; retrying what failed meanwhile without waiting out its backoff", "queued", n)
	})
	defer removeRecovered()
	// The same after the driver was away: attaches and detaches that
	// failed with UNAVAILABLE while it restarted are retried at once.
	removeReconnected := c.csi.OnReconnected(func() {
		n := c.attachQ.ResetBackoff() + c.detachQ.ResetBackoff() + c.pvQ.ResetBackoff()
		logger.Info("The CSI driver is back; retrying what failed meanwhile without waiting out its backoff", "queued", n)
	})
	defer removeReconnected()

	pvWorkers := max(1, c.cfg.Workers/4)
	logger.Info("Starting the attach controller", "driver", c.cfg.DriverName, "finalizer", c.finalizer,
		"attachWorkers", c.cfg.Workers, "detachWorkers", c.cfg.Workers, "pvWorkers", pvWorkers)
	synced := append([]cache.InformerSynced{c.vaInformer.HasSynced, c.pvInformer.HasSynced, c.csiNodeInformer.HasSynced}, handlers.Synced()...)
	if !cache.WaitForNamedCacheSyncWithContext(ctx, synced...) {
		c.shutDownQueues()
		return nil // ctx ended
	}

	var wg sync.WaitGroup
	for range c.cfg.Workers {
		wg.Go(func() { wait.UntilWithContext(ctx, c.vaWorker(c.attachQ), time.Second) })
		wg.Go(func() { wait.UntilWithContext(ctx, c.vaWorker(c.detachQ), time.Second) })
	}
	for range pvWorkers {
		wg.Go(func() { wait.UntilWithContext(ctx, c.pvWorker, time.Second) })
	}
	if c.cfg.ReconcileSync > 0 {
		wg.Go(func() { kube.Every(ctx, c.clock, c.cfg.ReconcileSync, func() { c.reconcile(ctx) }) })
	}
	logger.Info("Attach controller started")
	<-ctx.Done()
	logger.Info("Stopping the attach controller")
	c.shutDownQueues()
	wg.Wait()
	logger.Info("Attach controller stopped")
	return nil
}

func (c *Controller) shutDownQueues() {
	c.attachQ.ShutDown()
	c.detachQ.ShutDown()
	c.pvQ.ShutDown()
}

// vaWorker returns a worker loop over one of the two VolumeAttachment
// queues.
func (c *Controller) vaWorker(q *queue) func(context.Context) {
	return func(ctx context.Context) {
		for c.processNextVA(ctx, q) {
		}
	}
}

func (c *Controller) pvWorker(ctx context.Context) {
	for c.processNextPV(ctx) {
	}
}

// processNextVA takes one VolumeAttachment off q and syncs it, through
// kube.Queue.ProcessNext: the only place that calls Done and that ends a
// sync with Forget or a re-add after a backoff. While the driver or the API server
// is away it waits with the items still queued (their backoff untouched,
// their age visible in the metrics) rather than fail each of them: without
// the API server the outcome of a driver call could not be recorded, so it
// would be made again and again. It returns false when the worker should
// stop.
func (c *Controller) processNextVA(ctx context.Context, q *queue) bool {
	return q.ProcessNext(ctx, c.ready, kube.Observing(c.api, func(ctx context.Context, key string) error {
		if !c.locks.tryLock(key, q.Q) {
			// The other VA queue's worker has it; it is queued here again
			// when that worker is done.
			return kube.ErrBusy
		}
		c.pending.start(key)
		err := c.syncVA(ctx, key)
		c.locks.unlock(key)
		c.pending.finish(key, err == nil)
		c.forgetIfGone(key)
		return err
	}), isFinal)
}

// ready waits until the driver and the API server are both there.
func (c *Controller) ready(ctx context.Context) error { return c.api.Gate(c.csi.WaitReady)(ctx) }

// stillLeading is kube.StillLeading: nil unless ctx ended or this replica
// can no longer be sure it holds its Lease.
func (c *Controller) stillLeading(ctx context.Context) error { return kube.StillLeading(ctx) }

// processNextPV takes one PersistentVolume off the PV queue and syncs it
// (kube.Queue.ProcessNext), waiting while the API server is away: the
// sync removes a finalizer and calls no driver.
func (c *Controller) processNextPV(ctx context.Context) bool {
	return c.pvQ.ProcessNext(ctx, c.api.WaitUp, kube.Observing(c.api, c.syncPV), isFinal)
}

// keyLocks makes sure one VolumeAttachment is processed by one worker at a
// time although it may sit in both the attach and the detach queue (it was
// deleted while an attach ran).
type keyLocks struct {
	mu   sync.Mutex
	held map[string][]workqueue.TypedRateLimitingInterface[string] // key → queues to re-add it to on unlock
}

func newKeyLocks() *keyLocks {
	return &keyLocks{held: map[string][]workqueue.TypedRateLimitingInterface[string]{}}
}

// size is how many VolumeAttachments are locked.
func (l *keyLocks) size() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.held)
}

// tryLock takes key's lock, or records that q wants key when the holder
// unlocks it and returns false.
func (l *keyLocks) tryLock(key string, q workqueue.TypedRateLimitingInterface[string]) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	waiting, busy := l.held[key]
	if !busy {
		l.held[key] = nil
		return true
	}
	for _, w := range waiting {
		if w == q {
			return false
		}
	}
	l.held[key] = append(waiting, q)
	return false
}

// unlock releases key and queues it again where it was refused meanwhile.
func (l *keyLocks) unlock(key string) {
	l.mu.Lock()
	waiting := l.held[key]
	delete(l.held, key)
	l.mu.Unlock()
	for _, q := range waiting {
		q.Add(key)
	}
}
