package heartbeat

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
)

// ErrHeldByOther is the error of a renewal that found the Lease held by
// another node, or labelled for another driver.
var ErrHeldByOther = errors.New("the heartbeat Lease is held by another node")

// RenewerConfig is what NewRenewer needs.
type RenewerConfig struct {
	// Client talks to the API server. Give the Renewer a client of its
	// own, so that another user's rate limit never delays a renewal.
	Client Client
	// Namespace is where the Lease lives; DriverName and NodeID name it
	// (LeaseName) and are written into it (DriverLabel, holderIdentity).
	Namespace, DriverName, NodeID string
	// Incarnation is when this node plugin started; it goes into
	// IncarnationAnnotation.
	Incarnation time.Time
	// RenewInterval is the time between two renewals (zero:
	// DefaultRenewInterval). RenewTimeout bounds each renewal (zero: half
	// the interval) and must be shorter than the interval.
	RenewInterval, RenewTimeout time.Duration
	// FencingPeriod is how long the Lease may go unrenewed before the
	// node may be fenced (zero: DefaultFencingPeriod). It is written into
	// spec.leaseDurationSeconds, rounded up to whole seconds.
	FencingPeriod time.Duration
	// SelfFenceAfter is how long after the start of the last successful
	// renewal (or of Run) OnLost is called (zero: DefaultSelfFenceAfter).
	// SelfFenceMargin is how long OnLost may take to stop the node's I/O,
	// with the slack for this process being descheduled (zero: a fifth of
	// FencingPeriod). Validate requires SelfFenceAfter + RenewInterval +
	// SelfFenceMargin <= FencingPeriod; see the package doc for why.
	SelfFenceAfter, SelfFenceMargin time.Duration
	// Clock measures every interval and deadline. Optional: nil is the
	// real clock; tests step a fake one. RenewTimeout is real time either
	// way (it bounds a network call).
	Clock clock.WithTicker
	// OnLost is called once when no renewal has succeeded for
	// SelfFenceAfter: the node must stop the I/O of its shared-pool
	// volumes before FencingPeriod is over. OnRegained is called once when
	// a renewal succeeds after that. Both are optional, are called one at a
	// time in order (never at once, never from the renewal loop, so a slow
	// callback never delays a renewal), with Run's context.
	OnLost, OnRegained func(ctx context.Context)
	// FencedVolumes, optional, counts the fenced volumes the node still
	// holds; each renewal writes it into FencedVolumesAnnotation, so that
	// the fencing controller knows when a node that was fenced is clean.
	// It is called before each renewal and must be quick; a negative
	// count (it could not tell) leaves the annotation as it was.
	FencedVolumes func(ctx context.Context) int
}

func (c RenewerConfig) withDefaults() RenewerConfig {
	if c.RenewInterval == 0 {
		c.RenewInterval = DefaultRenewInterval
	}
	if c.RenewTimeout == 0 {
		c.RenewTimeout = c.RenewInterval / 2
	}
	if c.FencingPeriod == 0 {
		c.FencingPeriod = DefaultFencingPeriod
	}
	if c.SelfFenceAfter == 0 {
		c.SelfFenceAfter = DefaultSelfFenceAfter
	}
	if c.SelfFenceMargin == 0 {
		c.SelfFenceMargin = c.FencingPeriod / 5
	}
	if c.Clock == nil {
		c.Clock = clock.RealClock{}
	}
	return c
}

// Validate reports the first field of c (with the defaults applied) that
// cannot work.
func (c RenewerConfig) Validate() error {
	c = c.withDefaults()
	if err := validateLeases(c.Client, c.Namespace, c.DriverName); err != nil {
		return err
	}
	switch {
	case c.NodeID == "":
		return errors.New("the node ID is empty")
	case c.Incarnation.IsZero():
		return errors.New("the incarnation (when this node plugin started) is not set")
	case c.RenewInterval < 0 || c.RenewTimeout < 0 || c.FencingPeriod < 0 || c.SelfFenceAfter < 0 || c.SelfFenceMargin < 0:
		return errors.New("the durations must not be negative")
	case c.RenewTimeout >= c.RenewInterval:
		return fmt.Errorf("the renew timeout %s is not shorter than the renew interval %s", c.RenewTimeout, c.RenewInterval)
	case c.SelfFenceAfter < 2*c.RenewInterval:
		return fmt.Errorf("self-fence after %s is shorter than two renew intervals (%s): one failed renewal would stop the node's I/O", c.SelfFenceAfter, 2*c.RenewInterval)
	case c.SelfFenceAfter+c.RenewInterval+c.SelfFenceMargin > c.FencingPeriod:
		return fmt.Errorf("self-fence after %s + renew interval %s + margin %s exceeds the fencing period %s: a live node could be fenced before it stopped its I/O",
			c.SelfFenceAfter, c.RenewInterval, c.SelfFenceMargin, c.FencingPeriod)
	}
	return nil
}

// Renewer keeps one node's heartbeat Lease renewed, and tells the node
// when it has lost it. Build it with NewRenewer, run it with Run; Lost,
// LastRenewed and Healthy are for metrics and /healthz.
//
// A renewal reads the Lease once (then updates the copy it wrote last,
// with its resourceVersion as precondition), creates it when it is
// missing, and writes holderIdentity (the node ID), renewTime,
// leaseDurationSeconds, the labels and the incarnation. A Lease held by
// another node (holderIdentity set and different, or DriverLabel naming
// another driver) is never overwritten: that renewal fails with
// ErrHeldByOther, is logged, and counts as failed, so a node whose name
// collides loses its heartbeat and fences itself rather than hiding
// another node's death. A Lease whose holder is this node ID but whose
// incarnation differs is an earlier run of this node plugin: it is taken
// over (acquireTime and leaseTransitions mark it). A Lease without a
// holder is taken too. When Run ends the Lease is left as it is: it goes
// stale after the fencing period, which is the truth if the node plugin
// does not come back.
type Renewer struct {
	cfg  RenewerConfig
	name string

	running atomic.Bool
	// done counts the renewals whose outcome the loop has handled (tests
	// wait for it).
	done atomic.Int64
	// cur is the Lease as last read or written, nil to read it again.
	// Only the renewal in flight uses it, and renewals run one at a time.
	cur *coordinationv1.Lease

	mu          sync.Mutex
	lastRenewed time.Time // when the last successful renewal began
	lost        bool
	lastErr     error
}

// NewRenewer builds a Renewer; it does not touch the API server.
func NewRenewer(cfg RenewerConfig) (*Renewer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("heartbeat renewer: %w", err)
	}
	cfg = cfg.withDefaults()
	return &Renewer{cfg: cfg, name: LeaseName(cfg.DriverName, cfg.NodeID)}, nil
}

// LeaseName is the name of the Lease the Renewer renews.
func (r *Renewer) LeaseName() string { return r.name }

// LastRenewed is when the last successful renewal began, on the
// Renewer's clock (zero before the first).
func (r *Renewer) LastRenewed() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lastRenewed
}

// Lost reports whether the heartbeat is lost: no renewal has succeeded for
// SelfFenceAfter. It changes before the callbacks run.
func (r *Renewer) Lost() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lost
}

// Healthy returns nil unless the heartbeat is lost, else since when and
// the last renewal's error.
func (r *Renewer) Healthy() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.lost {
		return nil
	}
	return fmt.Errorf("the heartbeat Lease %s/%s has not been renewed since %s: %w", r.cfg.Namespace, r.name, r.lastRenewed.Format(time.RFC3339), r.lastErr)
}

// renewal is the outcome of one renewal, begun at began.
type renewal struct {
	began time.Time
	err   error
}

// Run renews the Lease until ctx ends, then waits for the renewal and the
// callback in flight and returns nil. It fails at once only when it is
// already running. Failed renewals are logged and retried on the next
// tick; a lost heartbeat is reported to OnLost, never returned.
func (r *Renewer) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return errors.New("heartbeat renewer: already running")
	}
	defer r.running.Store(false)
	cfg := r.cfg
	logger := klog.LoggerWithValues(klog.FromContext(ctx), "lease", klog.KRef(cfg.Namespace, r.name), "node", cfg.NodeID)
	ctx = klog.NewContext(ctx, logger)
	logger.Info("Starting the heartbeat", "renewInterval", cfg.RenewInterval, "selfFenceAfter", cfg.SelfFenceAfter,
		"fencingPeriod", cfg.FencingPeriod, "incarnation", cfg.Incarnation.Format(time.RFC3339Nano))

	// Run's start counts as the last success: a node plugin that cannot
	// reach the API server at all self-fences SelfFenceAfter after it
	// started, as it would after a renewal.
	r.mu.Lock()
	since := cfg.Clock.Now()
	r.lost = false
	r.mu.Unlock()

	n := newNotifier()
	var wg sync.WaitGroup
	wg.Go(func() { n.run(ctx) })
	defer wg.Wait()

	tick := cfg.Clock.NewTicker(cfg.RenewInterval)
	defer tick.Stop()
	deadline := cfg.Clock.NewTimer(cfg.SelfFenceAfter)
	defer deadline.Stop()
	results := make(chan renewal, 1)
	inFlight := true
	go r.attempt(ctx, results)
	failures := 0
	for {
		select {
		case <-ctx.Done():
			if inFlight {
				<-results // its context ends with ctx
			}
			logger.Info("Stopped the heartbeat; the Lease is left to go stale", "lastRenewed", r.LastRenewed())
			return nil
		case <-tick.C():
			if inFlight {
				// Only a fake clock stepped faster than the timeout
				// gets here.
				continue
			}
			inFlight = true
			go r.attempt(ctx, results)
		case res := <-results:
			inFlight = false
			if res.err != nil {
				if ctx.Err() != nil {
					r.done.Add(1)
					continue
				}
				failures++
				r.mu.Lock()
				r.lastErr = res.err
				r.mu.Unlock()
				if failures == 1 {
					logger.Error(res.err, "Heartbeat renewal failed; retrying every renew interval", "lastRenewed", since)
				} else {
					logger.V(4).Info("Heartbeat renewal failed again", "failures", failures, "err", res.err.Error())
				}
				r.done.Add(1)
				continue
			}
			r.mu.Lock()
			wasLost := r.lost
			since, r.lastRenewed, r.lost, r.lastErr = res.began, res.began, false, nil
			r.mu.Unlock()
			if failures > 0 && !wasLost {
				logger.V(2).Info("Heartbeat renewed again", "failures", failures)
			}
			failures = 0
			if wasLost {
				logger.Info("Regained the heartbeat", "renewed", res.began)
				n.add(cfg.OnRegained)
			}
			// A timer that fires at a stale deadline just re-arms.
			deadline.Reset(cfg.SelfFenceAfter - cfg.Clock.Since(since))
			r.done.Add(1)
		case <-deadline.C():
			unrenewed := cfg.Clock.Since(since)
			if unrenewed < cfg.SelfFenceAfter {
				deadline.Reset(cfg.SelfFenceAfter - unrenewed)
				continue
			}
			r.mu.Lock()
			wasLost := r.lost
			r.lost = true
			lastErr := r.lastErr
			r.mu.Unlock()
			if !wasLost {
				logger.Error(lastErr, "Lost the heartbeat: no renewal succeeded within the self-fence period; the node must stop its shared-pool I/O",
					"lastRenewed", since, "unrenewedFor", unrenewed, "selfFenceAfter", cfg.SelfFenceAfter)
				n.add(cfg.OnLost)
			}
		}
	}
}

// attempt runs one renewal under RenewTimeout and sends its outcome.
func (r *Renewer) attempt(ctx context.Context, out chan<- renewal) {
	began := r.cfg.Clock.Now()
	actx, cancel := context.WithTimeout(ctx, r.cfg.RenewTimeout)
	defer cancel()
	fenced := -1
	if r.cfg.FencedVolumes != nil {
		fenced = r.cfg.FencedVolumes(actx)
	}
	out <- renewal{began: began, err: r.renew(actx, began, fenced)}
}

// renew writes the Lease once, with fenced (if not negative) in its
// fenced-volumes annotation: an update of the copy written last, or a read
// (and a create when it is missing) first. A conflict or a Lease gone
// since makes it read and try once more.
func (r *Renewer) renew(ctx context.Context, now time.Time, fenced int) error {
	leases := r.cfg.Client.CoordinationV1().Leases(r.cfg.Namespace)
	logger := klog.FromContext(ctx)
	for try := 0; ; try++ {
		again := try == 0
		if r.cur == nil {
			cur, err := leases.Get(ctx, r.name, metav1.GetOptions{})
			switch {
			case apierrors.IsNotFound(err):
				out, err := leases.Create(ctx, r.newLease(now, fenced), metav1.CreateOptions{})
				if apierrors.IsAlreadyExists(err) && again {
					continue
				}
				if err != nil {
					return fmt.Errorf("create the heartbeat Lease: %w", err)
				}
				logger.Info("Created the heartbeat Lease")
				r.cur = out
				return nil
			case err != nil:
				return fmt.Errorf("read the heartbeat Lease: %w", err)
			}
			if err := r.check(cur); err != nil {
				return err
			}
			r.cur = cur
		}
		next, takeover := r.renewed(r.cur, now, fenced)
		out, err := leases.Update(ctx, next, metav1.UpdateOptions{})
		if err != nil {
			r.cur = nil
			if (apierrors.IsConflict(err) || apierrors.IsNotFound(err)) && again {
				continue
			}
			return fmt.Errorf("renew the heartbeat Lease: %w", err)
		}
		if takeover {
			logger.Info("Took the heartbeat Lease over from an earlier run of this node plugin",
				"previousHolder", holderOf(r.cur), "previousIncarnation", r.cur.Annotations[IncarnationAnnotation])
		}
		r.cur = out
		return nil
	}
}

// check returns ErrHeldByOther unless the Lease is this node's or nobody's.
func (r *Renewer) check(l *coordinationv1.Lease) error {
	if h := holderOf(l); h != "" && h != r.cfg.NodeID {
		return fmt.Errorf("%w: %s/%s is held by %q, not %q; not overwriting it", ErrHeldByOther, l.Namespace, l.Name, h, r.cfg.NodeID)
	}
	if d, ok := l.Labels[DriverLabel]; ok && d != r.cfg.DriverName {
		return fmt.Errorf("%w: %s/%s belongs to driver %q, not %q; not overwriting it", ErrHeldByOther, l.Namespace, l.Name, d, r.cfg.DriverName)
	}
	return nil
}

func (r *Renewer) incarnation() string { return r.cfg.Incarnation.UTC().Format(time.RFC3339Nano) }

// newLease is the Lease as created by this node plugin at now, holding
// fenced fenced volumes (negative: not said).
func (r *Renewer) newLease(now time.Time, fenced int) *coordinationv1.Lease {
	t := metav1.NewMicroTime(now)
	l := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{
			Name:        r.name,
			Namespace:   r.cfg.Namespace,
			Labels:      leaseLabels(r.cfg.DriverName),
			Annotations: map[string]string{IncarnationAnnotation: r.incarnation()},
		},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity:       ptr.To(r.cfg.NodeID),
			LeaseDurationSeconds: ptr.To(leaseSeconds(r.cfg.FencingPeriod)),
			AcquireTime:          &t,
			RenewTime:            &t,
			LeaseTransitions:     ptr.To(int32(0)),
		},
	}
	if fenced >= 0 {
		l.Annotations[FencedVolumesAnnotation] = strconv.Itoa(fenced)
	}
	return l
}

// renewed is cur renewed at now, holding fenced fenced volumes (negative:
// as it said), and whether that takes it over from another incarnation
// (or from no holder). Labels and annotations of others are kept.
func (r *Renewer) renewed(cur *coordinationv1.Lease, now time.Time, fenced int) (*coordinationv1.Lease, bool) {
	l := cur.DeepCopy()
	t := metav1.NewMicroTime(now)
	l.Labels = maps.Clone(l.Labels)
	if l.Labels == nil {
		l.Labels = map[string]string{}
	}
	maps.Copy(l.Labels, leaseLabels(r.cfg.DriverName))
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	takeover := holderOf(l) != r.cfg.NodeID || l.Annotations[IncarnationAnnotation] != r.incarnation()
	if fenced >= 0 {
		l.Annotations[FencedVolumesAnnotation] = strconv.Itoa(fenced)
	}
	if takeover {
		l.Annotations[IncarnationAnnotation] = r.incarnation()
		l.Spec.AcquireTime = &t
		l.Spec.LeaseTransitions = ptr.To(ptr.Deref(l.Spec.LeaseTransitions, 0) + 1)
	}
	l.Spec.HolderIdentity = ptr.To(r.cfg.NodeID)
	l.Spec.LeaseDurationSeconds = ptr.To(leaseSeconds(r.cfg.FencingPeriod))
	l.Spec.RenewTime = &t
	return l, takeover
}

// notifier calls callbacks one at a time, in the order they were added,
// away from the loop that adds them.
type notifier struct {
	mu      sync.Mutex
	pending []func(context.Context)
	kick    chan struct{}
}

func newNotifier() *notifier { return &notifier{kick: make(chan struct{}, 1)} }

// add queues f (nil: nothing).
func (n *notifier) add(f func(context.Context)) {
	if f == nil {
		return
	}
	n.mu.Lock()
	n.pending = append(n.pending, f)
	n.mu.Unlock()
	select {
	case n.kick <- struct{}{}:
	default:
	}
}

// run calls the queued callbacks until ctx ends; what is still queued then
// is dropped (the process is stopping).
func (n *notifier) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-n.kick:
		}
		for ctx.Err() == nil {
			n.mu.Lock()
			if len(n.pending) == 0 {
				n.mu.Unlock()
				break
			}
			f := n.pending[0]
			n.pending = n.pending[1:]
			n.mu.Unlock()
			f(ctx)
		}
	}
}
