package resize

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/loopvol/loopvol/internal/kube"
)

// claimQueue is the work loop the resize and the modify controllers share:
// claims by key, a sync per claim that waits for the driver and the API
// server, and the record of the controller's own writes that tells an
// update event of someone else's (which queues the claim once more) from
// the echo of its own.
type claimQueue struct {
	queue *kube.Queue[string]
	api   *kube.APIHealth
	state *claimState
	// ready waits for the driver; syncKey is the controller's sync of one
	// claim; wants tells whether an update of a claim may need a sync of
	// this controller.
	ready   func(context.Context) error
	syncKey func(context.Context, string) error
	wants   func(old, pvc *corev1.PersistentVolumeClaim) bool
}

func newClaimQueue(name string, inf *kube.Informers, retryStart, retryMax time.Duration, ready func(context.Context) error) claimQueue {
	return claimQueue{
		queue: kube.NewQueue[string](name, retryStart, retryMax),
		api:   inf.APIHealth(),
		state: newClaimState(),
		ready: ready,
	}
}

func (q *claimQueue) worker(ctx context.Context) {
	for q.processNext(ctx) {
	}
}

// processNext takes one claim off the queue and syncs it. It is the only
// place that calls Done and, through Queue.Handle, forgets or re-adds a
// claim. It returns false when the worker should stop. While the driver or
// the API server is away the claims wait in the queue rather than fail
// each: no driver call whose outcome could not be recorded.
func (q *claimQueue) processNext(ctx context.Context) bool {
	return q.queue.ProcessNext(ctx, q.api.Gate(q.ready), kube.Observing(q.api, q.trackedSync), isFinal)
}

// trackedSync syncs key; an update event that arrived during the sync and
// was not the sync's own write queues it once more.
func (q *claimQueue) trackedSync(ctx context.Context, key string) error {
	q.state.begin(key)
	err := q.syncKey(ctx, key)
	if q.state.end(key) {
		q.queue.Q.Add(key)
	}
	return err
}

// syncOne syncs key and ends the sync as a worker does: Queue.Handle
// forgets its backoff or queues it again.
func (q *claimQueue) syncOne(ctx context.Context, key string) error {
	err := q.trackedSync(ctx, key)
	q.queue.Handle(ctx, key, err, err != nil && isFinal(err))
	return err
}

func (q *claimQueue) claimAdded(obj any) {
	if pvc, ok := obj.(*corev1.PersistentVolumeClaim); ok {
		q.queue.Q.Add(claimKey(pvc))
	}
}

func (q *claimQueue) claimUpdated(oldObj, newObj any) {
	old, ok1 := oldObj.(*corev1.PersistentVolumeClaim)
	pvc, ok2 := newObj.(*corev1.PersistentVolumeClaim)
	if !ok1 || !ok2 || !q.wants(old, pvc) {
		return
	}
	key := claimKey(pvc)
	if old.ResourceVersion != pvc.ResourceVersion && q.state.deferEvent(key, pvc.ResourceVersion) {
		// Decided when the sync ends: it may be the sync's own write,
		// whose resourceVersion it does not know yet.
		return
	}
	q.queue.Q.Add(key)
}
