package heartbeat

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// ObserverConfig is what NewObserver needs.
type ObserverConfig struct {
	// Client talks to the API server.
	Client Client
	// Namespace and DriverName select the Leases watched: those of
	// DriverName's nodes (Selector) in Namespace.
	Namespace, DriverName string
	// FencingPeriod is how long a node's Lease must stay unchanged, as
	// seen here, before the node is stale (zero: DefaultFencingPeriod). A
	// Lease that states a longer one (spec.leaseDurationSeconds, its node's
	// promise) gets its own.
	FencingPeriod time.Duration
	// ProbeInterval is how often the API server is probed (a List of at
	// most one Lease) and staleness is judged (zero: DefaultRenewInterval);
	// ProbeTimeout bounds each probe (zero: half the interval) and must be
	// shorter than the interval.
	ProbeInterval, ProbeTimeout time.Duration
	// Clock measures every period. Optional: nil is the real clock; tests
	// step a fake one. ProbeTimeout is real time either way.
	Clock clock.WithTicker
	// OnChange, if set, is told of every node that turns stale, is back
	// (its stale Lease changed) or is gone (its Lease deleted). It is
	// called from one goroutine, in order, and must not block: queue the
	// node and return.
	OnChange func(ctx context.Context, ev Event)
}

func (c ObserverConfig) withDefaults() ObserverConfig {
	if c.FencingPeriod == 0 {
		c.FencingPeriod = DefaultFencingPeriod
	}
	if c.ProbeInterval == 0 {
		c.ProbeInterval = DefaultRenewInterval
	}
	if c.ProbeTimeout == 0 {
		c.ProbeTimeout = c.ProbeInterval / 2
	}
	if c.Clock == nil {
		c.Clock = clock.RealClock{}
	}
	return c
}

// Validate reports the first field of c (with the defaults applied) that
// cannot work.
func (c ObserverConfig) Validate() error {
	c = c.withDefaults()
	if err := validateLeases(c.Client, c.Namespace, c.DriverName); err != nil {
		return err
	}
	switch {
	case c.FencingPeriod < 0 || c.ProbeInterval < 0 || c.ProbeTimeout < 0:
		return errors.New("the durations must not be negative")
	case c.ProbeTimeout >= c.ProbeInterval:
		return fmt.Errorf("the probe timeout %s is not shorter than the probe interval %s", c.ProbeTimeout, c.ProbeInterval)
	case c.FencingPeriod < 2*c.ProbeInterval:
		return fmt.Errorf("the fencing period %s is shorter than two probe intervals (%s)", c.FencingPeriod, 2*c.ProbeInterval)
	}
	return nil
}

// EventType says what happened to a node.
type EventType string

const (
	// NodeStale: the node's Lease has not changed for its fencing period.
	NodeStale EventType = "Stale"
	// NodeBack: a stale node's Lease changed again.
	NodeBack EventType = "Back"
	// NodeGone: the node's Lease was deleted; the node is no longer
	// tracked (and so never stale).
	NodeGone EventType = "Gone"
)

// Event is what OnChange is told.
type Event struct {
	Type EventType
	Node NodeState
}

// NodeState is what the Observer knows of one node.
type NodeState struct {
	// NodeID is the Lease's holderIdentity.
	NodeID string
	// Lease is the Lease's name.
	Lease string
	// Incarnation is when the node plugin that renews the Lease started
	// (IncarnationAnnotation; zero if missing).
	Incarnation time.Time
	// LastChange is when the countdown to staleness started, on the
	// Observer's clock: the moment it last saw the Lease change, or when
	// observation became healthy after that, if later.
	LastChange time.Time
	// FencingPeriod is the node's: the longer of the Observer's and the
	// Lease's.
	FencingPeriod time.Duration
	// Stale says whether the node is stale; StaleFor is how long since it
	// turned stale (zero unless Stale).
	Stale    bool
	StaleFor time.Duration
	// FencedVolumes is how many fenced volumes the node plugin said it
	// still holds at its last renewal (FencedVolumesAnnotation; -1 if it
	// did not say).
	FencedVolumes int
}

// Observer watches the heartbeat Leases of one driver in one namespace and
// tells which nodes are stale. Build it with NewObserver, run it with Run
// (in the leader-elected part of the sidecar); Stale, Fresh and Node
// answer from memory.
//
// A node is stale when the Observer has not seen its Lease change
// (resourceVersion or renewTime; any write counts, erring towards not
// fencing) for its fencing period, measured on the Observer's clock from
// the moment the change was seen. Staleness is judged only while
// observation is healthy: the informer has synced, its watch is open, and
// the last probe of the API server succeeded. A failed list, watch or
// probe (or the informer's watch-error handler) stops the judging; once
// all work again, every node that is not stale starts its countdown
// afresh from that moment, so an outage longer than the fencing period
// never makes a live node stale (its renewals failed too). A watch that
// just ended (the API server ends them every few minutes) stops the
// judging until the next watch is open, without a new countdown: the next
// watch resumes where the last one stopped and delivers every change in
// between. A stale node stays stale through an outage: only a change seen
// makes it back. A deleted Lease's node is forgotten. Watch and probe
// errors are logged once per outage.
type Observer struct {
	cfg      ObserverConfig
	selector string
	kick     chan struct{}

	mu       sync.Mutex
	nodes    map[string]*tracked // by Lease name
	events   []Event             // for OnChange, in order
	synced   bool                // the handler has seen the informer's initial list
	watchGen uint64              // counts watches opened
	watching bool                // the watch watchGen is open
	probeOK  bool                // the last probe succeeded
	healthy  bool                // judging; false as soon as anything breaks
	reset    bool                // a failure since healthy: restart every countdown
	since    time.Time           // healthy since (the countdowns' floor)
	brokeAt  time.Time           // when healthy last became false
	problem  error               // why observation is not healthy (nil: a watch just ended)
	judged   time.Time           // the clock at the last judging (tests wait for it)
}

// tracked is one node's Lease as last seen.
type tracked struct {
	nodeID      string
	incarnation time.Time
	rv          string
	renewTime   time.Time
	period      time.Duration
	lastChange  time.Time
	stale       bool
	staleSince  time.Time
	fenced      int
}

// NewObserver builds an Observer; it does not touch the API server.
func NewObserver(cfg ObserverConfig) (*Observer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("heartbeat observer: %w", err)
	}
	cfg = cfg.withDefaults()
	return &Observer{
		cfg:      cfg,
		selector: Selector(cfg.DriverName).String(),
		kick:     make(chan struct{}, 1),
		nodes:    map[string]*tracked{},
		reset:    true,
	}, nil
}

// Synced reports whether the Observer has seen the Leases as they were
// when it started. Before, nothing is stale.
func (o *Observer) Synced() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.synced
}

// Healthy returns nil while observation is healthy (staleness is being
// judged), else why not.
func (o *Observer) Healthy() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	switch {
	case o.healthy:
		return nil
	case !o.synced:
		return errors.New("the heartbeat Leases have not been listed yet")
	case o.problem != nil:
		return fmt.Errorf("heartbeat observation is interrupted since %s: %w", o.brokeAt.Format(time.RFC3339), o.problem)
	}
	return errors.New("the heartbeat watch is being reopened")
}

// Stale returns the stale nodes, by node ID.
func (o *Observer) Stale() []NodeState {
	o.mu.Lock()
	defer o.mu.Unlock()
	now := o.cfg.Clock.Now()
	var out []NodeState
	for name, n := range o.nodes {
		if n.stale {
			out = append(out, o.stateLocked(name, n, now))
		}
	}
	slices.SortFunc(out, func(a, b NodeState) int { return strings.Compare(a.NodeID, b.NodeID) })
	return out
}

// Fresh reports whether nodeID's Lease is tracked and not stale. It is
// false for a node without a Lease and before the first sync: false means
// "not known to be renewing", not "stale".
func (o *Observer) Fresh(nodeID string) bool {
	s, ok := o.Node(nodeID)
	return ok && !s.Stale && o.Synced()
}

// Node returns what the Observer knows of nodeID, and whether its Lease
// is tracked.
func (o *Observer) Node(nodeID string) (NodeState, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for name, n := range o.nodes {
		if n.nodeID == nodeID {
			return o.stateLocked(name, n, o.cfg.Clock.Now()), true
		}
	}
	return NodeState{}, false
}

func (o *Observer) stateLocked(name string, n *tracked, now time.Time) NodeState {
	s := NodeState{NodeID: n.nodeID, Lease: name, Incarnation: n.incarnation, LastChange: n.lastChange, FencingPeriod: n.period, Stale: n.stale, FencedVolumes: n.fenced}
	if !n.stale && o.since.After(s.LastChange) {
		s.LastChange = o.since
	}
	if n.stale {
		s.StaleFor = now.Sub(n.staleSince)
	}
	return s
}

// Run watches the Leases until ctx ends, then returns nil. Nothing it
// meets makes it return early: failures are logged, retried, and stop the
// judging until they are over.
func (o *Observer) Run(ctx context.Context) error {
	logger := klog.LoggerWithValues(klog.FromContext(ctx), "namespace", o.cfg.Namespace, "driver", o.cfg.DriverName)
	ctx = klog.NewContext(ctx, logger)
	logger.Info("Starting to observe the heartbeats", "fencingPeriod", o.cfg.FencingPeriod, "probeInterval", o.cfg.ProbeInterval)
	leases := o.cfg.Client.CoordinationV1().Leases(o.cfg.Namespace)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			opts.LabelSelector = o.selector
			l, err := leases.List(ctx, opts)
			if err != nil {
				o.broken(ctx, "list", err)
			}
			return l, err
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			opts.LabelSelector = o.selector
			w, err := leases.Watch(ctx, opts)
			if err != nil {
				o.broken(ctx, "watch", err)
				return nil, err
			}
			return o.watchOpened(ctx, w), nil
		},
	}
	inf := cache.NewSharedIndexInformerWithOptions(cache.ToListWatcherWithWatchListSemantics(lw, o.cfg.Client),
		&coordinationv1.Lease{}, cache.SharedIndexInformerOptions{})
	if err := inf.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
		o.broken(ctx, "watch", err)
		cache.DefaultWatchErrorHandler(ctx, r, err)
	}); err != nil {
		return fmt.Errorf("heartbeat observer: %w", err)
	}
	reg, err := inf.AddEventHandlerWithOptions(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { o.seen(ctx, obj) },
		UpdateFunc: func(_, obj any) { o.seen(ctx, obj) },
		DeleteFunc: func(obj any) { o.deleted(ctx, obj) },
	}, cache.HandlerOptions{Logger: &logger})
	if err != nil {
		return fmt.Errorf("heartbeat observer: %w", err)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { inf.RunWithContext(ctx) })

	tick := o.cfg.Clock.NewTicker(o.cfg.ProbeInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			logger.Info("Stopped observing the heartbeats")
			return nil
		case <-o.kick:
		case <-tick.C():
			o.probe(ctx)
			o.judge(ctx, reg.HasSynced())
		}
		o.deliver(ctx)
	}
}

// probe lists at most one Lease, to learn that the API server (and etcd
// behind it: no resourceVersion means a quorum read) still answers: a
// watch on a connection that went silent may not fail for a long time.
func (o *Observer) probe(ctx context.Context) {
	pctx, cancel := context.WithTimeout(ctx, o.cfg.ProbeTimeout)
	defer cancel()
	_, err := o.cfg.Client.CoordinationV1().Leases(o.cfg.Namespace).List(pctx, metav1.ListOptions{LabelSelector: o.selector, Limit: 1})
	if err != nil {
		if ctx.Err() == nil {
			o.broken(ctx, "probe", err)
		}
		return
	}
	o.mu.Lock()
	o.probeOK = true
	o.mu.Unlock()
}

// broken stops the judging after a failed list, watch or probe, and makes
// every countdown start afresh once observation works again.
func (o *Observer) broken(ctx context.Context, what string, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if what == "probe" {
		o.probeOK = false
	} else {
		o.watching = false
	}
	o.reset = true
	first := o.healthy || o.problem == nil
	o.problem = fmt.Errorf("%s: %w", what, err)
	if o.healthy {
		o.healthy, o.brokeAt = false, o.cfg.Clock.Now()
	}
	if first {
		klog.FromContext(ctx).Error(err, "Heartbeat observation interrupted; no node turns stale until it works again, and then every countdown starts afresh", "failed", what)
	}
}

// watchOpened records an open watch and returns w, which records its end.
func (o *Observer) watchOpened(ctx context.Context, w watch.Interface) watch.Interface {
	o.mu.Lock()
	o.watchGen++
	gen := o.watchGen
	o.watching = true
	o.mu.Unlock()
	return newEndWatch(w, func() { o.watchEnded(ctx, gen) })
}

// watchEnded stops the judging until the next watch is open. That watch
// resumes where this one stopped, so no change is lost and no countdown
// starts afresh.
func (o *Observer) watchEnded(ctx context.Context, gen uint64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if gen != o.watchGen || !o.watching {
		return
	}
	o.watching = false
	if o.healthy {
		o.healthy, o.brokeAt, o.problem = false, o.cfg.Clock.Now(), nil
	}
	klog.FromContext(ctx).V(4).Info("Heartbeat watch ended; judging paused until it is open again")
}

// judge decides, on each probe tick, whether observation is healthy and
// which nodes turned stale.
func (o *Observer) judge(ctx context.Context, synced bool) {
	logger := klog.FromContext(ctx)
	o.mu.Lock()
	defer o.mu.Unlock()
	now := o.cfg.Clock.Now()
	o.judged = now
	if synced && !o.synced {
		o.synced = true
		logger.Info("Listed the heartbeat Leases", "nodes", len(o.nodes))
	}
	ok := o.synced && o.watching && o.probeOK
	if !ok {
		o.healthy = false
		return
	}
	if !o.healthy {
		o.healthy = true
		switch {
		case o.reset && o.brokeAt.IsZero():
			logger.Info("Heartbeat observation is healthy; every node's countdown starts now", "nodes", len(o.nodes))
		case o.reset:
			logger.Info("Heartbeat observation is healthy again; every node's countdown starts now", "interruptedFor", now.Sub(o.brokeAt), "nodes", len(o.nodes))
		default:
			logger.V(4).Info("Heartbeat watch open again")
		}
		if o.reset {
			o.since, o.reset = now, false
		}
		o.problem = nil
	}
	for name, n := range o.nodes {
		if n.stale {
			continue
		}
		start := n.lastChange
		if o.since.After(start) {
			start = o.since
		}
		if now.Sub(start) < n.period {
			continue
		}
		n.stale, n.staleSince, n.lastChange = true, start.Add(n.period), start
		s := o.stateLocked(name, n, now)
		logger.Info("Node's heartbeat is stale: its Lease did not change for the fencing period", "node", n.nodeID, "lease", klog.KRef(o.cfg.Namespace, name),
			"lastChange", s.LastChange, "fencingPeriod", n.period, "incarnation", n.incarnation)
		o.events = append(o.events, Event{Type: NodeStale, Node: s})
	}
}

// seen records a Lease from the informer.
func (o *Observer) seen(ctx context.Context, obj any) {
	l, ok := obj.(*coordinationv1.Lease)
	if !ok {
		return
	}
	logger := klog.FromContext(ctx)
	holder := holderOf(l)
	if holder == "" {
		// Not a renewed heartbeat: whose would it be?
		o.forget(ctx, l.Name)
		return
	}
	period := max(o.cfg.FencingPeriod, periodOf(l))
	o.mu.Lock()
	defer o.mu.Unlock()
	now := o.cfg.Clock.Now()
	n := o.nodes[l.Name]
	if n == nil {
		n = &tracked{nodeID: holder, lastChange: now}
		o.nodes[l.Name] = n
		logger.V(2).Info("Tracking a node's heartbeat", "node", holder, "lease", klog.KObj(l), "fencingPeriod", period)
	} else if n.rv != l.ResourceVersion || !n.renewTime.Equal(renewTimeOf(l)) || n.nodeID != holder {
		n.lastChange = now
		if n.stale {
			n.stale, n.staleSince = false, time.Time{}
			logger.Info("Node is back: its stale heartbeat Lease changed", "node", holder, "lease", klog.KObj(l), "incarnation", incarnationOf(l))
			o.events = append(o.events, Event{Type: NodeBack, Node: o.stateLocked(l.Name, n, now)})
			o.kickLocked()
		}
	}
	if inc := incarnationOf(l); !inc.Equal(n.incarnation) {
		if !n.incarnation.IsZero() {
			logger.Info("Node plugin restarted: its heartbeat Lease has a new incarnation", "node", holder, "lease", klog.KObj(l), "previousIncarnation", n.incarnation, "incarnation", inc)
		}
		n.incarnation = inc
	}
	if n.nodeID != holder {
		logger.Info("Heartbeat Lease has a new holder", "lease", klog.KObj(l), "previousHolder", n.nodeID, "node", holder)
		n.nodeID = holder
	}
	n.rv, n.renewTime, n.period, n.fenced = l.ResourceVersion, renewTimeOf(l), period, fencedOf(l)
}

// deleted forgets a deleted Lease's node.
func (o *Observer) deleted(ctx context.Context, obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	if l, ok := obj.(*coordinationv1.Lease); ok {
		o.forget(ctx, l.Name)
	}
}

func (o *Observer) forget(ctx context.Context, name string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := o.nodes[name]
	if n == nil {
		return
	}
	s := o.stateLocked(name, n, o.cfg.Clock.Now())
	delete(o.nodes, name)
	klog.FromContext(ctx).Info("Node's heartbeat Lease is gone; the node is no longer tracked", "node", n.nodeID, "lease", klog.KRef(o.cfg.Namespace, name), "wasStale", n.stale)
	o.events = append(o.events, Event{Type: NodeGone, Node: s})
	o.kickLocked()
}

func (o *Observer) kickLocked() {
	select {
	case o.kick <- struct{}{}:
	default:
	}
}

// deliver hands the queued events to OnChange, in order.
func (o *Observer) deliver(ctx context.Context) {
	o.mu.Lock()
	evs := o.events
	o.events = nil
	o.mu.Unlock()
	if o.cfg.OnChange == nil {
		return
	}
	for _, ev := range evs {
		o.cfg.OnChange(ctx, ev)
	}
}

// endWatch passes a watch's events on and calls ended once, before its
// channel closes or when it is stopped, whichever comes first: so the end
// is recorded before the reflector can open the next watch.
type endWatch struct {
	w     watch.Interface
	ch    chan watch.Event
	stop  chan struct{}
	once  sync.Once
	ended func()
}

func newEndWatch(w watch.Interface, ended func()) *endWatch {
	e := &endWatch{w: w, ch: make(chan watch.Event), stop: make(chan struct{}), ended: ended}
	go e.pass()
	return e
}

func (e *endWatch) pass() {
	defer close(e.ch)
	defer e.end()
	for ev := range e.w.ResultChan() {
		select {
		case e.ch <- ev:
		case <-e.stop:
			return
		}
	}
}

func (e *endWatch) end() { e.once.Do(func() { e.ended(); close(e.stop) }) }

// Stop implements watch.Interface.
func (e *endWatch) Stop() {
	e.end()
	e.w.Stop()
}

// ResultChan implements watch.Interface.
func (e *endWatch) ResultChan() <-chan watch.Event { return e.ch }
