package capacity

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/wait"
	corelisters "k8s.io/client-go/listers/core/v1"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/loopvol/loopvol/internal/kube"
	"github.com/loopvol/loopvol/pkg/csiclient"
)

// DefaultRefreshDelay is Config.RefreshDelay when it is zero.
const DefaultRefreshDelay = 200 * time.Millisecond

// CSI is the part of a driver connection the controller uses;
// *csiclient.Client implements it.
type CSI interface {
	// WaitReady blocks until the driver is connected and ready, or ctx ends
	// (then it returns ctx's error).
	WaitReady(ctx context.Context) error
	// Capabilities returns the driver's current capabilities.
	Capabilities() csiclient.Capabilities
	// GetCapacity asks the driver for the capacity of a class in a
	// segment. Errors keep their gRPC status.
	GetCapacity(ctx context.Context, req *csi.GetCapacityRequest) (*csi.GetCapacityResponse, error)
	// NodeGetInfo asks the node service for the node's ID and topology;
	// only Config.NodeName needs it.
	NodeGetInfo(ctx context.Context) (*csi.NodeGetInfoResponse, error)
}

// OwnerFunc returns the owner to put on every object, nil for none. It is
// called once, when Run starts.
type OwnerFunc func(ctx context.Context) (*metav1.OwnerReference, error)

// Config is what New needs.
type Config struct {
	// DriverName is the CSI driver's name: the provisioner of the
	// StorageClasses and the driver of the PersistentVolumes handled.
	DriverName string
	// Client writes the CSIStorageCapacity objects. It should have a rate
	// limit of its own (upstream's --kube-api-capacity-qps), so that a
	// burst of capacity writes never delays other controllers' requests.
	Client kube.Client
	// Informers are the process's shared informers; the caller starts
	// them. Their client does the lists and watches.
	Informers *kube.Informers
	// CSI is the driver connection.
	CSI CSI
	// Namespace holds the objects (upstream: $NAMESPACE).
	Namespace string
	// NodeName, when set, makes this the controller of one node
	// (--node-deployment): its only segment is the node's own
	// NodeGetInfo accessible topology, and its objects are labelled
	// ManagedByID(NodeName).
	NodeName string
	// Owner returns the owner of the objects. Optional: nil for none.
	Owner OwnerFunc
	// PollInterval is how often every object is checked against the
	// driver even when nothing in Kubernetes changed, for capacity that
	// changes behind Kubernetes' back.
	PollInterval time.Duration
	// ImmediateBinding also publishes for classes with Immediate volume
	// binding; otherwise only WaitForFirstConsumer classes, the only ones
	// the scheduler reads capacity for.
	ImmediateBinding bool
	// Workers is the number of concurrent syncs (GetCapacity and write).
	Workers int
	// RetryIntervalStart and RetryIntervalMax bound the exponential
	// backoff of an item after a failure.
	RetryIntervalStart time.Duration
	RetryIntervalMax   time.Duration
	// RefreshDelay is the shortest interval between two refreshes of one
	// object caused by PersistentVolume events: the first event of a burst
	// refreshes at once, later ones are folded into one refresh at the end
	// of the interval. Zero means DefaultRefreshDelay.
	RefreshDelay time.Duration
	// Registerer receives the controller's metrics. Optional.
	Registerer prometheus.Registerer
}

// Validate reports the first field of c that cannot work.
func (c Config) Validate() error {
	if err := kube.ValidateController(c.DriverName, c.Client, c.Informers, c.CSI, c.Workers, c.RetryIntervalStart, c.RetryIntervalMax); err != nil {
		return err
	}
	switch {
	case c.Namespace == "":
		return errors.New("no namespace for the CSIStorageCapacity objects")
	case c.PollInterval <= 0:
		return fmt.Errorf("the poll interval must be positive, not %s", c.PollInterval)
	case c.RefreshDelay < 0:
		return fmt.Errorf("the refresh delay must not be negative, not %s", c.RefreshDelay)
	}
	return nil
}

// workItem is one object the controller may manage: a StorageClass and a
// topology segment (its key).
type workItem struct {
	class   string
	segment string
}

// String is how logs show an item: "<class>@<segment key>".
func (w workItem) String() string { return w.class + "@" + w.segment }

// Controller keeps one CSIStorageCapacity object per (StorageClass of the
// driver, topology segment) up to date. Build it with New, start it with
// Run.
type Controller struct {
	cfg       Config
	managedBy string
	client    kube.Client
	csi       CSI
	clock     clock.WithTicker

	scInformer      cache.SharedIndexInformer
	pvInformer      cache.SharedIndexInformer
	csiNodeInformer cache.SharedIndexInformer // nil with NodeName
	nodeInformer    cache.SharedIndexInformer // nil with NodeName
	objInformer     cache.SharedIndexInformer
	scLister        storagelisters.StorageClassLister
	csiNodeLister   storagelisters.CSINodeLister
	nodeLister      corelisters.NodeLister
	objects         cache.Indexer

	q    *kube.Queue[workItem]
	api  *kube.APIHealth
	topo *topology

	// Set by Run before any handler or worker runs, constant after.
	owner           *metav1.OwnerReference
	topologyCapable bool

	// writes are the controller's own writes of each item's object.
	writes *kube.Writes[workItem]

	mu    sync.Mutex
	items map[workItem]*itemState
	// started is when Run began acting (zero on a standby replica, which
	// checks nothing), guarded by mu.
	started time.Time
}

// New builds a controller over the shared informers of cfg: StorageClasses,
// PersistentVolumes, the controller's own CSIStorageCapacity objects and,
// for a central controller, CSINodes and Nodes.
func New(cfg Config) (*Controller, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("capacity controller: %w", err)
	}
	if cfg.RefreshDelay == 0 {
		cfg.RefreshDelay = DefaultRefreshDelay
	}
	c := &Controller{
		cfg:       cfg,
		managedBy: ManagedByID(cfg.NodeName),
		client:    cfg.Client,
		csi:       cfg.CSI,
		clock:     clock.RealClock{},
		q:         kube.NewQueue[workItem](QueueName, cfg.RetryIntervalStart, cfg.RetryIntervalMax),
		api:       cfg.Informers.APIHealth(),
		topo:      newTopology(),
		writes:    kube.NewWrites[workItem](1),
		items:     map[workItem]*itemState{},
	}
	inf := cfg.Informers
	c.scInformer = inf.StorageClasses()
	c.scLister = storagelisters.NewStorageClassLister(c.scInformer.GetIndexer())
	c.pvInformer = inf.PersistentVolumes(kube.PVCapacity)
	if cfg.NodeName == "" {
		c.csiNodeInformer = inf.CSINodes()
		c.nodeInformer = inf.Nodes()
		c.csiNodeLister = storagelisters.NewCSINodeLister(c.csiNodeInformer.GetIndexer())
		c.nodeLister = corelisters.NewNodeLister(c.nodeInformer.GetIndexer())
	}
	c.objInformer = inf.CSIStorageCapacities(cfg.Namespace, c.Selector())
	if err := c.objInformer.AddIndexers(cache.Indexers{indexByItem: indexItem}); err != nil {
		return nil, fmt.Errorf("capacity controller: CSIStorageCapacity index: %w", err)
	}
	c.objects = c.objInformer.GetIndexer()
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(collector{c}); err != nil {
			return nil, fmt.Errorf("capacity controller metrics: %w", err)
		}
	}
	return c, nil
}

// Selector selects the objects this controller manages: the driver's and
// this instance's labels.
func (c *Controller) Selector() labels.Selector {
	return labels.SelectorFromSet(labels.Set{DriverNameLabel: c.cfg.DriverName, ManagedByLabel: c.managedBy})
}

// Run resolves the owner and (with NodeName) the node's segment, adds the
// event handlers, waits for the caches, queues every object it should
// manage or delete, and runs the workers and the poll until ctx ends. It
// returns nil when ctx ends, an error when it cannot start: the driver
// lacks GET_CAPACITY, or the owner cannot be found.
func (c *Controller) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	defer c.q.ShutDown()
	if err := c.prepare(ctx); err != nil || ctx.Err() != nil {
		return err
	}

	// The handlers are added only now, when this replica starts acting:
	// a standby replica's informers keep a warm cache but queue nothing.
	handlers, err := c.addEventHandlers(ctx)
	if err != nil {
		return fmt.Errorf("capacity controller: event handlers: %w", err)
	}
	defer handlers.Remove(logger)
	logger.Info("Starting the capacity controller", "namespace", c.cfg.Namespace, "managedBy", c.managedBy,
		"workers", c.cfg.Workers, "pollInterval", c.cfg.PollInterval, "immediateBinding", c.cfg.ImmediateBinding,
		"topology", c.topologyCapable)
	synced := []cache.InformerSynced{c.scInformer.HasSynced, c.pvInformer.HasSynced, c.objInformer.HasSynced}
	if c.csiNodeInformer != nil {
		synced = append(synced, c.csiNodeInformer.HasSynced, c.nodeInformer.HasSynced)
	}
	synced = append(synced, handlers.Synced()...)
	if !cache.WaitForNamedCacheSyncWithContext(ctx, synced...) {
		return nil // ctx ended
	}
	if c.csiNodeInformer != nil {
		c.resyncTopology(ctx)
	}
	c.mu.Lock()
	c.started = c.clock.Now()
	c.mu.Unlock()
	c.enqueueAll()
	logger.V(2).Info("Capacity controller knows its segments and classes", "segments", len(c.topo.keys()), "storageClasses", len(c.wantedClasses()))

	var wg sync.WaitGroup
	for range c.cfg.Workers {
		wg.Go(func() { wait.UntilWithContext(ctx, c.worker, time.Second) })
	}
	wg.Go(func() {
		kube.Every(ctx, c.clock, c.cfg.PollInterval, func() {
			logger.V(4).Info("Polling every CSIStorageCapacity")
			c.enqueueAll()
		})
	})
	logger.Info("Capacity controller started")
	<-ctx.Done()
	logger.Info("Stopping the capacity controller")
	c.q.ShutDown()
	wg.Wait()
	logger.Info("Capacity controller stopped")
	return nil
}

// prepare learns what the handlers and workers need and never changes:
// the driver's capabilities, the owner and, with NodeName, the node's
// segment. It returns nil early when ctx ends.
func (c *Controller) prepare(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	if err := c.csi.WaitReady(ctx); err != nil {
		return nil // ctx ended
	}
	caps := c.csi.Capabilities()
	if !caps.GetCapacity {
		return errors.New("capacity controller: the CSI driver does not offer GET_CAPACITY")
	}
	c.topologyCapable = caps.Topology
	if c.cfg.Owner != nil {
		owner, err := c.cfg.Owner(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("capacity controller: the owner of the CSIStorageCapacity objects: %w", err)
		}
		c.owner = owner
		if owner != nil {
			logger.Info("CSIStorageCapacity objects get an owner", "apiVersion", owner.APIVersion, "kind", owner.Kind, "name", owner.Name, "uid", owner.UID)
		}
	}
	if c.cfg.NodeName != "" {
		key, ok := c.nodeOwnSegment(ctx)
		if !ok {
			return nil // ctx ended
		}
		c.topo.setNode(c.cfg.NodeName, key, true)
		logger.Info("Publishing capacity for the node's own topology segment", "node", c.cfg.NodeName, "segment", key)
	}
	return nil
}

// nodeOwnSegment asks the node service for the node's topology, retrying
// until it answers or ctx ends (false).
func (c *Controller) nodeOwnSegment(ctx context.Context) (string, bool) {
	logger := klog.FromContext(ctx)
	delay := c.cfg.RetryIntervalStart
	for {
		rsp, err := c.csi.NodeGetInfo(ctx)
		if err == nil {
			if !c.topologyCapable {
				return "", true
			}
			return segmentKey(rsp.GetAccessibleTopology().GetSegments()), true
		}
		logger.Error(err, "Could not learn the node's topology segment, will retry", "retryAfter", delay)
		select {
		case <-ctx.Done():
			return "", false
		case <-c.clock.After(delay):
		}
		delay = min(2*delay, c.cfg.RetryIntervalMax)
	}
}

// worker processes items until the queue shuts down.
func (c *Controller) worker(ctx context.Context) {
	for c.processNextItem(ctx) {
	}
}

// processNextItem takes one item off the queue and syncs it (through
// kube.Queue.ProcessNext, the only place that calls Done and that ends a
// sync with Forget or a re-add after a backoff): while the driver is away it waits with the items
// still queued. Final gRPC errors of GetCapacity wait longer. It returns
// false when the worker should stop.
func (c *Controller) processNextItem(ctx context.Context) bool {
	// Nothing is asked of the driver while the API server is away: the
	// answer could not be published.
	return c.q.ProcessNext(ctx, c.api.Gate(c.csi.WaitReady), kube.Observing(c.api, c.sync), csiclient.IsFinal)
}

// classWanted tells whether objects are published for sc.
func (c *Controller) classWanted(sc *storagev1.StorageClass) bool {
	if sc.Provisioner != c.cfg.DriverName {
		return false
	}
	// As upstream: a class without a binding mode counts as delayed.
	immediate := sc.VolumeBindingMode != nil && *sc.VolumeBindingMode == storagev1.VolumeBindingImmediate
	return c.cfg.ImmediateBinding || !immediate
}

// wantedClasses returns the names of the classes objects are published
// for, sorted.
func (c *Controller) wantedClasses() []string {
	scs, err := c.scLister.List(labels.Everything())
	if err != nil {
		return nil // a cache list does not fail
	}
	var names []string
	for _, sc := range scs {
		if c.classWanted(sc) {
			names = append(names, sc.Name)
		}
	}
	slices.Sort(names)
	return names
}

// wanted returns the class of it and true when it should have an object.
func (c *Controller) wanted(it workItem) (*storagev1.StorageClass, bool) {
	if !c.topo.has(it.segment) {
		return nil, false
	}
	sc, err := c.scLister.Get(it.class)
	if err != nil || !c.classWanted(sc) {
		return nil, false
	}
	return sc, true
}

// enqueueAll queues every item that should have an object and every item
// that has one, in order (by class, then segment).
func (c *Controller) enqueueAll() {
	items := map[workItem]bool{}
	segs := c.topo.keys()
	for _, class := range c.wantedClasses() {
		for _, seg := range segs {
			items[workItem{class: class, segment: seg}] = true
		}
	}
	for _, obj := range c.objects.List() {
		if o, ok := obj.(*storagev1.CSIStorageCapacity); ok {
			items[itemOf(o)] = true
		}
	}
	for _, it := range slices.SortedFunc(maps.Keys(items), compareItems) {
		c.q.Q.Add(it)
	}
}

func compareItems(a, b workItem) int {
	return cmp.Or(cmp.Compare(a.class, b.class), cmp.Compare(a.segment, b.segment))
}

// refresh queues it after a PersistentVolume event: at once when it was
// not synced within the refresh delay, else at the end of it. The delaying
// queue keeps one wait per item, so a burst of events costs one sync per
// delay, not one per event.
func (c *Controller) refresh(it workItem) {
	c.mu.Lock()
	var last time.Time
	if st := c.items[it]; st != nil {
		last = st.lastSync
	}
	c.mu.Unlock()
	if wait := last.Add(c.cfg.RefreshDelay).Sub(c.clock.Now()); wait > 0 {
		c.q.Q.AddAfter(it, wait)
		return
	}
	c.q.Q.Add(it)
}
