package kube

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/loopvol/loopvol/pkg/csiclient"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
)

// Queue is one named, rate-limited work queue. Its name is what the
// workqueue metrics report. The controller's worker loop owns it: Handle,
// which ProcessNext calls, is the one place that ends a sync by forgetting
// the item's backoff or queuing it again (ResetBackoff forgets the backoff
// of every failing item at once, after an outage).
type Queue[T comparable] struct {
	// Name is the queue's name in the workqueue metrics and the logs.
	Name string
	// Q is the queue itself: event handlers Add to it, workers Get and Done.
	Q  workqueue.TypedRateLimitingInterface[T]
	rl workqueue.TypedRateLimiter[T]
	// finalFloor is the shortest wait after a final error.
	finalFloor time.Duration

	mu      sync.Mutex
	failing map[T]struct{} // keys whose last sync failed
}

// NewQueue makes a queue whose items back off exponentially from start to
// max after each failure. A final error (one that fails the same way until
// something changes) waits at least 32 × start, at most max: it stays off
// the hot path, and a change of the object queues it earlier anyway.
func NewQueue[T comparable](name string, start, max time.Duration) *Queue[T] {
	rl := workqueue.NewTypedItemExponentialFailureRateLimiter[T](start, max)
	return &Queue[T]{
		Name:       name,
		rl:         rl,
		Q:          workqueue.NewTypedRateLimitingQueueWithConfig(rl, workqueue.TypedRateLimitingQueueConfig[T]{Name: name}),
		finalFloor: min(32*start, max),
		failing:    map[T]struct{}{},
	}
}

// Handle ends one sync of key: it forgets key's backoff after a success,
// and after a failure queues key again after its backoff, or after at least
// the final-error floor when final. It returns the delay (zero after a
// success). It does not call Done.
func (q *Queue[T]) Handle(ctx context.Context, key T, err error, final bool) time.Duration {
	q.mu.Lock()
	if err == nil {
		delete(q.failing, key)
	} else {
		q.failing[key] = struct{}{}
	}
	q.mu.Unlock()
	if err == nil {
		q.Q.Forget(key)
		return 0
	}
	delay := q.rl.When(key)
	if final {
		delay = max(delay, q.finalFloor)
	}
	q.Q.AddAfter(key, delay)
	klog.FromContext(ctx).Error(err, "Sync failed, will retry", "queue", q.Name, "key", key,
		"final", final, "retryAfter", delay, "failures", q.rl.NumRequeues(key))
	return delay
}

// ResetBackoff forgets the backoff of every key whose last sync failed and
// queues it at once: what failed because the API server or the driver was
// away is retried as soon as they are back, not after each key's
// exponential delay. It returns how many keys it queued. (A key still
// waiting out its delay is synced once more when that ends; syncs are
// idempotent.)
func (q *Queue[T]) ResetBackoff() int {
	q.mu.Lock()
	keys := make([]T, 0, len(q.failing))
	for k := range q.failing {
		keys = append(keys, k)
	}
	q.mu.Unlock()
	for _, k := range keys {
		q.Q.Forget(k)
		q.Q.Add(k)
	}
	return len(keys)
}

// Drop forgets that key failed (its object is gone). An AddAfter still
// pending for it runs anyway; the sync of a gone object succeeds.
func (q *Queue[T]) Drop(key T) {
	q.mu.Lock()
	defer q.mu.Unlock()
	delete(q.failing, key)
}

// Failing is how many keys failed at their last sync.
func (q *Queue[T]) Failing() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.failing)
}

// Failures is how many times key has failed since its last success.
func (q *Queue[T]) Failures(key T) int { return q.rl.NumRequeues(key) }

// ShutDown stops the queue; workers in Get return.
func (q *Queue[T]) ShutDown() { q.Q.ShutDown() }

// ProcessNext is one step of a worker loop: it waits until ready (the CSI
// driver is reachable) with the items still queued, takes one item, waits
// for ready again while holding it (an idle worker sits in Get while the
// driver goes away), syncs it and hands the result to Handle, with final
// telling which errors are final (a sync that returns ErrBusy was not
// run, and is handed to nothing). It is the only place that calls Done. It
// returns false when the worker should stop (ctx ended or the queue shut
// down).
func (q *Queue[T]) ProcessNext(ctx context.Context, ready func(context.Context) error, sync func(context.Context, T) error, final func(error) bool) bool {
	if err := ready(ctx); err != nil {
		return false
	}
	key, quit := q.Q.Get()
	if quit {
		return false
	}
	defer q.Q.Done(key)
	if err := ready(ctx); err != nil {
		q.Q.Add(key) // back in the queue unless it is shutting down
		return false
	}
	err := sync(ctx, key)
	if errors.Is(err, ErrBusy) {
		return true // not synced: whoever holds key queues it again
	}
	q.Handle(ctx, key, err, err != nil && final(err))
	return true
}

// ErrBusy is what a sync passed to ProcessNext returns when it did not
// sync the key because another worker holds it (an object that sits in
// two queues, such as a VolumeAttachment deleted while it is attached),
// and that worker queues the key here again when it is done. ProcessNext
// then neither forgets the key's backoff nor queues it: nothing was tried.
var ErrBusy = errors.New("another worker holds the key")

// ValidateBackoff reports why start and max cannot drive NewQueue's
// backoff, or nil: the controllers' Config.Validate all check it alike.
func ValidateBackoff(start, max time.Duration) error {
	switch {
	case start <= 0:
		return fmt.Errorf("the initial retry interval must be positive, not %s", start)
	case max < start:
		return fmt.Errorf("the maximum retry interval %s is shorter than the initial one %s", max, start)
	}
	return nil
}

// permanentError marks an error that no retry fixes until the object
// changes (a bad spec, an object being deleted, a volume the driver cannot
// handle at all): it is retried slowly, like a final gRPC error.
type permanentError struct{ error }

func (e permanentError) Unwrap() error { return e.error }

// Permanent marks err as one no retry fixes until something changes.
func Permanent(err error) error { return permanentError{err} }

// IsFinal reports whether a sync error should not be retried hot: marked
// Permanent, or a final gRPC outcome of the driver (csiclient.IsFinal).
func IsFinal(err error) bool {
	var p permanentError
	return errors.As(err, &p) || csiclient.IsFinal(err)
}
