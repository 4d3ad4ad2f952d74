package attach

import (
	"sync"
	"time"

	"k8s.io/utils/clock"

	"github.com/loopvol/loopvol/internal/kube"
)

// operation is what a pending VolumeAttachment waits for.
type operation string

const (
	opAttach operation = "attach"
	opDetach operation = "detach"
)

// pendingTracker knows which VolumeAttachments wait for work and since when:
// from the event that queued them until a sync of them succeeds, through
// queueing, backoff and processing. It feeds the queue depth and oldest-item
// age metrics (a backlog is visible even while items sit in backoff) and
// lets the reconcile leave alone what is still being worked on.
type pendingTracker struct {
	clock clock.PassiveClock
	mu    sync.Mutex
	items map[string]*pendingItem
}

type pendingItem struct {
	op      operation
	since   time.Time
	running bool
	again   time.Time // queued again while running; zero if not
}

func newPendingTracker(clk clock.PassiveClock) *pendingTracker {
	return &pendingTracker{clock: clk, items: map[string]*pendingItem{}}
}

// add records that key was queued for op.
func (p *pendingTracker) add(key string, op operation) {
	now := p.clock.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	it, ok := p.items[key]
	switch {
	case !ok:
		p.items[key] = &pendingItem{op: op, since: now}
	case it.op != op:
		// The attach it waited for is no longer wanted: it waits for a
		// detach now.
		it.op, it.since = op, now
		if it.running {
			it.again = now
		}
	case it.running && it.again.IsZero():
		it.again = now
	}
}

// start records that a worker began syncing key.
func (p *pendingTracker) start(key string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if it, ok := p.items[key]; ok {
		it.running, it.again = true, time.Time{}
	}
}

// finish records the end of a sync of key. After a success key is no longer
// pending, unless it was queued again meanwhile.
func (p *pendingTracker) finish(key string, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	it, found := p.items[key]
	if !found {
		return
	}
	switch {
	case !ok:
		it.running, it.again = false, time.Time{}
	case !it.again.IsZero():
		it.since, it.running, it.again = it.again, false, time.Time{}
	default:
		delete(p.items, key)
	}
}

func (p *pendingTracker) drop(key string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.items, key)
}

func (p *pendingTracker) has(key string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.items[key]
	return ok
}

// stats returns how many items wait for op and the age of the oldest.
func (p *pendingTracker) stats(op operation) (int, time.Duration) {
	now := p.clock.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	var oldest time.Duration
	for _, it := range p.items {
		if it.op != op {
			continue
		}
		n++
		oldest = max(oldest, now.Sub(it.since))
	}
	return n, oldest
}

// size is how many VolumeAttachments the tracker holds.
func (p *pendingTracker) size() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.items)
}

// vaState is what the controller remembers per VolumeAttachment between
// syncs: its own writes (to spot a stale cache, and to know when it last
// wrote), a reconcile's request to sync again, the per-call timeout of a
// volume whose last driver call timed out, and the version its event
// handlers last received.
//
// Every entry belongs to an object that exists: the delete event drops the
// object's entries, and a write recorded after that event (the patch that
// removed the last finalizer returns after the informer already saw the
// object go) is dropped again at once by the caller (see
// Controller.forgetIfGone), so no order of events leaves one behind.
type vaState struct {
	// written are the controller's own writes; only the last one of each
	// object matters here.
	written *kube.Writes[string]

	mu      sync.Mutex
	force   map[string]string        // key → resourceVersion the reconcile judged
	timeout map[string]time.Duration // key → timeout of its next driver call
	// delivered is, per key, the resourceVersion the event handlers last
	// received: the informer's cache holds an object before its handlers
	// run, and under load they run well after.
	delivered map[string]string
}

func newVAState() *vaState {
	return &vaState{written: kube.NewWrites[string](1), force: map[string]string{}, timeout: map[string]time.Duration{},
		delivered: map[string]string{}}
}

// deliver records that the event handlers received key at resourceVersion
// rv (drop forgets it with the rest).
func (s *vaState) deliver(key, rv string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.delivered[key] = rv
}

// isDelivered says whether the event handlers received key at
// resourceVersion rv.
func (s *vaState) isDelivered(key, rv string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.delivered[key] == rv
}

// setForce records that the reconcile found key (at resourceVersion rv)
// disagreeing with the driver.
func (s *vaState) setForce(key, rv string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.force[key] = rv
}

// forced returns the resourceVersion a reconcile judged key at, if it asked
// for a sync.
func (s *vaState) forced(key string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rv, ok := s.force[key]
	return rv, ok
}

func (s *vaState) clearForce(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.force, key)
}

// callTimeout returns the timeout of key's next driver call: def, or
// longer after a call of key timed out.
func (s *vaState) callTimeout(key string, def time.Duration) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	if d, ok := s.timeout[key]; ok {
		return d
	}
	return def
}

// setCallTimeout records the timeout of key's next driver call; def (the
// --timeout) forgets it.
func (s *vaState) setCallTimeout(key string, d, def time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if d <= def {
		delete(s.timeout, key)
		return
	}
	s.timeout[key] = d
}

func (s *vaState) drop(key string) {
	s.written.Forget(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.force, key)
	delete(s.timeout, key)
	delete(s.delivered, key)
}

// sizes returns how many VolumeAttachments each map holds.
func (s *vaState) sizes() (written, force, timeout int) {
	written = s.written.Len()
	s.mu.Lock()
	defer s.mu.Unlock()
	return written, len(s.force), len(s.timeout)
}
