package attach

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	typedstoragev1 "k8s.io/client-go/kubernetes/typed/storage/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

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
// *kubernetes.Clientset and the fake clientset implement it. A client made of
// just these two typed clients keeps a binary about a third smaller than one
// that links the whole clientset, and with it its resident memory.
type KubeClient interface {
	CoreV1() typedcorev1.CoreV1Interface
	StorageV1() typedstoragev1.StorageV1Interface
}

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
	// Resync is the informer resync period; zero disables resyncs.
	Resync time.Duration
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
}

// Validate reports the first field of c that cannot work.
func (c Config) Validate() error {
	switch {
	case c.DriverName == "":
		return errors.New("the driver name is empty")
	case c.Client == nil:
		return errors.New("no Kubernetes client")
	case c.CSI == nil:
		return errors.New("no CSI driver connection")
	case c.Workers < 1:
		return fmt.Errorf("workers must be at least 1, not %d", c.Workers)
	case c.Resync < 0:
		return fmt.Errorf("the resync period must not be negative, not %s", c.Resync)
	case c.RetryIntervalStart <= 0:
		return fmt.Errorf("the initial retry interval must be positive, not %s", c.RetryIntervalStart)
	case c.RetryIntervalMax < c.RetryIntervalStart:
		return fmt.Errorf("the maximum retry interval %s is shorter than the initial one %s", c.RetryIntervalMax, c.RetryIntervalStart)
	case c.ReconcileSync < 0:
		return fmt.Errorf("the reconcile period must not be negative, not %s", c.ReconcileSync)
	}
	return nil
}

// queue is one work queue with its rate limiter, which processNextWorkItem
// also asks for delays directly.
type queue struct {
	name string
	q    workqueue.TypedRateLimitingInterface[string]
	rl   workqueue.TypedRateLimiter[string]
}

func newQueue(name string, start, max time.Duration) *queue {
	rl := workqueue.NewTypedItemExponentialFailureRateLimiter[string](start, max)
	return &queue{
		name: name,
		rl:   rl,
		q:    workqueue.NewTypedRateLimitingQueueWithConfig(rl, workqueue.TypedRateLimitingQueueConfig[string]{Name: name}),
	}
}

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

	// finalRetryFloor is the shortest wait after a final error.
	finalRetryFloor time.Duration

	locks   *keyLocks
	pending *pendingTracker
	state   *vaState
	metrics *metrics
}

// New builds a controller and its informers (VolumeAttachments,
// PersistentVolumes, CSINodes; managedFields dropped from the cache). Run
// starts them. The informers are made here rather than taken from a shared
// informer factory: the factory links an informer for every API type.
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
		attachQ:   newQueue(AttachQueueName, cfg.RetryIntervalStart, cfg.RetryIntervalMax),
		detachQ:   newQueue(DetachQueueName, cfg.RetryIntervalStart, cfg.RetryIntervalMax),
		pvQ:       newQueue(PVQueueName, cfg.RetryIntervalStart, cfg.RetryIntervalMax),
		// A final error will fail the same way until something changes;
		// 32 initial intervals (32 s at the defaults) keeps it off the hot
		// path. A detach on the same volume or node wakes it earlier.
		finalRetryFloor: min(32*cfg.RetryIntervalStart, cfg.RetryIntervalMax),
		locks:           newKeyLocks(),
		pending:         newPendingTracker(clk),
		state:           newVAState(),
	}
	m, err := newMetrics(c.pending, cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("attach controller metrics: %w", err)
	}
	c.metrics = m

	st := cfg.Client.StorageV1()
	core := cfg.Client.CoreV1()
	c.vaInformer = newInformer(cfg.Client, &storagev1.VolumeAttachment{}, cfg.Resync, vaIndexers,
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return st.VolumeAttachments().List(ctx, o)
		},
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return st.VolumeAttachments().Watch(ctx, o)
		})
	c.pvInformer = newInformer(cfg.Client, &corev1.PersistentVolume{}, cfg.Resync, nil,
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return core.PersistentVolumes().List(ctx, o)
		},
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return core.PersistentVolumes().Watch(ctx, o)
		})
	c.csiNodeInformer = newInformer(cfg.Client, &storagev1.CSINode{}, cfg.Resync, nil,
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return st.CSINodes().List(ctx, o)
		},
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return st.CSINodes().Watch(ctx, o)
		})
	c.vaIndexer = c.vaInformer.GetIndexer()
	c.vaLister = storagelisters.NewVolumeAttachmentLister(c.vaIndexer)
	c.pvLister = corelisters.NewPersistentVolumeLister(c.pvInformer.GetIndexer())
	c.csiNodeLister = storagelisters.NewCSINodeLister(c.csiNodeInformer.GetIndexer())
	if err := c.addEventHandlers(c.vaInformer, c.pvInformer, c.csiNodeInformer); err != nil {
		return nil, fmt.Errorf("attach controller: event handlers: %w", err)
	}
	return c, nil
}

// Run starts the informers, waits for their caches, runs the workers and the
// reconcile until ctx ends, then shuts the queues down and waits for the
// workers to finish their current item. It returns nil when ctx ends, and an
// error only when it could not start.
func (c *Controller) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	if c.recorder == nil {
		events := record.NewBroadcaster(record.WithContext(ctx))
		events.StartStructuredLogging(3)
		events.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: c.client.CoreV1().Events("")})
		defer events.Shutdown()
		c.recorder = events.NewRecorder(scheme.Scheme, corev1.EventSource{Component: EventComponent})
	}
	var informers sync.WaitGroup
	defer informers.Wait() // after ctx ended: the informers stop with it
	for _, inf := range []cache.SharedIndexInformer{c.vaInformer, c.pvInformer, c.csiNodeInformer} {
		informers.Go(func() { inf.RunWithContext(ctx) })
	}

	pvWorkers := max(1, c.cfg.Workers/4)
	logger.Info("Starting the attach controller", "driver", c.cfg.DriverName, "finalizer", c.finalizer,
		"attachWorkers", c.cfg.Workers, "detachWorkers", c.cfg.Workers, "pvWorkers", pvWorkers)
	if !cache.WaitForNamedCacheSyncWithContext(ctx, c.vaInformer.HasSynced, c.pvInformer.HasSynced, c.csiNodeInformer.HasSynced) {
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
		wg.Go(func() {
			// The first pass waits one period: at start every object is
			// queued anyway.
			t := c.clock.NewTicker(c.cfg.ReconcileSync)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C():
					c.reconcile(ctx)
				}
			}
		})
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
	c.attachQ.q.ShutDown()
	c.detachQ.q.ShutDown()
	c.pvQ.q.ShutDown()
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

// processNextVA takes one VolumeAttachment off q and syncs it. It is the
// only place that calls Done, Forget and the rate-limited re-adds of the VA
// queues. It returns false when the worker should stop.
func (c *Controller) processNextVA(ctx context.Context, q *queue) bool {
	// While the driver is away, wait here with the items still queued (their
	// backoff untouched, their age visible in the metrics) rather than fail
	// each of them.
	if err := c.csi.WaitReady(ctx); err != nil {
		return false
	}
	key, quit := q.q.Get()
	if quit {
		return false
	}
	defer q.q.Done(key)
	// Idle workers sit in Get, past the check above, while the driver is
	// ready; one of them gets the first item queued after the driver went
	// away. Wait here too, holding the item.
	if err := c.csi.WaitReady(ctx); err != nil {
		q.q.Add(key) // back in the queue unless the queue is shutting down
		return false
	}
	if !c.locks.tryLock(key, q.q) {
		// The other VA queue's worker has it; it is queued here again
		// when that worker is done.
		return true
	}
	c.pending.start(key)
	err := c.syncVA(ctx, key)
	c.locks.unlock(key)
	c.pending.finish(key, err == nil)
	c.handleErr(ctx, q, key, err)
	return true
}

func (c *Controller) processNextPV(ctx context.Context) bool {
	key, quit := c.pvQ.q.Get()
	if quit {
		return false
	}
	defer c.pvQ.q.Done(key)
	err := c.syncPV(ctx, key)
	c.handleErr(ctx, c.pvQ, key, err)
	return true
}

// handleErr forgets key's backoff after a success, and after a failure
// queues it again after its backoff, or after at least finalRetryFloor when
// the error is final. It returns the delay (zero after a success).
func (c *Controller) handleErr(ctx context.Context, q *queue, key string, err error) time.Duration {
	if err == nil {
		q.q.Forget(key)
		return 0
	}
	final := isFinal(err)
	delay := q.rl.When(key)
	if final {
		delay = max(delay, c.finalRetryFloor)
	}
	q.q.AddAfter(key, delay)
	klog.FromContext(ctx).Error(err, "Sync failed, will retry", "queue", q.name, "key", key,
		"final", final, "retryAfter", delay, "failures", q.rl.NumRequeues(key))
	return delay
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

// newInformer is a shared informer over one resource, with streaming lists
// where the client supports them, and the cache transform.
func newInformer(client KubeClient, example runtime.Object, resync time.Duration, indexers cache.Indexers,
	list cache.ListWithContextFunc, watchFunc cache.WatchFuncWithContext) cache.SharedIndexInformer {
	lw := cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{ListWithContextFunc: list, WatchFuncWithContext: watchFunc}, client)
	inf := cache.NewSharedIndexInformerWithOptions(lw, example, cache.SharedIndexInformerOptions{
		ResyncPeriod: resync,
		Indexers:     indexers,
	})
	// Only fails once the informer runs.
	_ = inf.SetTransform(stripForCache)
	return inf
}
