package kube

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// ClaimQueueConfig is what NewClaimQueue needs: the claim controller's
// shared configuration, its names, and its own sync and update filter.
type ClaimQueueConfig struct {
	ClaimConfig
	// Controller names the controller in logs and errors ("resize").
	Controller string
	// Name is the queue's name in the workqueue metrics.
	Name string
	// EventComponent is the source of the Events of the broadcaster Run
	// starts when ClaimConfig.Recorder is nil.
	EventComponent string
	// Metrics name the controller's own metrics (ClaimQueue.Metrics).
	Metrics ClaimMetricNames
	// Ready waits for the driver before a claim is synced.
	Ready func(context.Context) error
	// Sync is the controller's sync of one claim key (namespace/name).
	Sync func(ctx context.Context, key string) error
	// Wants tells whether an update of a claim by someone else may need a
	// sync. Resyncs and the controller's own writes coming back never ask.
	Wants func(old, pvc *corev1.PersistentVolumeClaim) bool
	// Forget, when set, drops what the controller remembers of a deleted
	// claim, beyond Writes.
	Forget func(key string, pvc *corev1.PersistentVolumeClaim)
	// Writes is the record of the controller's own writes, when the
	// controller keeps it itself; nil: a new one.
	Writes *Writes[string]
}

// ClaimQueue is the work loop that the controllers of
// PersistentVolumeClaims (the resizer's resize and modify controllers)
// share: one queue of claim keys, the claim and volume caches, the record
// of the controller's own writes (Writes, which tells the echo of its own
// write from someone else's update), the event handlers and the workers.
// The controller gives it its sync and its update filter, and reads and
// writes claims and volumes through it (ClaimAndVolume, PatchClaimStatus,
// PatchVolume, or its own patches recorded in the Writes it gave), so that
// every write is recorded where the handlers look.
type ClaimQueue struct {
	// Queue holds the claim keys; its name is the controller's in the
	// workqueue metrics.
	Queue *Queue[string]
	// Writes is the controller's own writes of claims (by ClaimKey) and
	// volumes (by VolumeKey).
	Writes *Writes[string]
	// Recorder records the controller's Events on claims.
	Recorder record.EventRecorder
	// Metrics are the controller's own metrics.
	Metrics *ClaimMetrics
	// Clock is the controller's clock: ClaimConfig.Clock, or the real one.
	Clock clock.PassiveClock

	// PVCInformer and PVInformer are the shared claim and volume
	// (PVResize) informers; PVCs and PVs list their caches.
	PVCInformer cache.SharedIndexInformer
	PVInformer  cache.SharedIndexInformer
	PVCs        corelisters.PersistentVolumeClaimLister
	PVs         corelisters.PersistentVolumeLister

	cfg ClaimQueueConfig
	api *APIHealth
}

// keptWrites bounds how many of its own writes of one object a claim
// controller recognises: one sync writes a claim up to twice before the
// watch delivers the first.
const keptWrites = 4

// NewClaimQueue builds the work loop over cfg.Informers and registers its
// metrics on cfg.Registerer. It adds no event handlers: Run does, so that
// a replica waiting for its Lease keeps a warm cache and an empty queue.
func NewClaimQueue(cfg ClaimQueueConfig) (*ClaimQueue, error) {
	m, err := NewClaimMetrics(cfg.Registerer, cfg.Metrics)
	if err != nil {
		return nil, fmt.Errorf("%s controller metrics: %w", cfg.Controller, err)
	}
	q := &ClaimQueue{
		Queue:       NewQueue[string](cfg.Name, cfg.RetryIntervalStart, cfg.RetryIntervalMax),
		Writes:      cfg.Writes,
		Recorder:    cfg.Recorder,
		Metrics:     m,
		PVCInformer: cfg.Informers.PersistentVolumeClaims(),
		PVInformer:  cfg.Informers.PersistentVolumes(PVResize),
		cfg:         cfg,
		api:         cfg.Informers.APIHealth(),
		Clock:       cfg.Clock,
	}
	if q.Clock == nil {
		q.Clock = clock.RealClock{}
	}
	if q.Writes == nil {
		q.Writes = NewWrites[string](keptWrites)
	}
	q.PVCs = corelisters.NewPersistentVolumeClaimLister(q.PVCInformer.GetIndexer())
	q.PVs = corelisters.NewPersistentVolumeLister(q.PVInformer.GetIndexer())
	return q, nil
}

// ClaimKey is the queue key of a claim, namespace/name.
func ClaimKey(pvc *corev1.PersistentVolumeClaim) string { return pvc.Namespace + "/" + pvc.Name }

// VolumeKey is the key of the PersistentVolume name in a ClaimQueue's
// Writes, apart from every claim key.
func VolumeKey(name string) string { return "pv/" + name }

// Run records Events (through its own broadcaster unless a Recorder was
// given), adds the claim and volume handlers and those more adds (nil:
// none), waits for their caches, calls started (nil: none) and runs
// ClaimConfig.Workers workers until ctx ends; then it shuts the queue
// down, waits for the workers to finish their current claim and removes
// the handlers. It returns nil when ctx ends, and an error only when it
// could not start.
func (q *ClaimQueue) Run(ctx context.Context, more func(*Handlers) error, started func(klog.Logger)) error {
	logger := klog.FromContext(ctx)
	defer q.Queue.ShutDown()
	if q.Recorder == nil {
		var stop func()
		q.Recorder, stop = StartRecorder(ctx, q.cfg.Client.CoreV1(), q.cfg.EventComponent)
		defer stop()
	}
	// Added only now, when this replica starts acting: the shared
	// informers run on a standby replica too, and adding a handler to a
	// running informer replays its cache.
	hs, err := q.addHandlers(more)
	if err != nil {
		hs.Remove(logger)
		return fmt.Errorf("%s controller: event handlers: %w", q.cfg.Controller, err)
	}
	defer hs.Remove(logger)
	synced := append([]cache.InformerSynced{q.PVCInformer.HasSynced, q.PVInformer.HasSynced}, hs.Synced()...)
	if !cache.WaitForNamedCacheSyncWithContext(ctx, synced...) {
		return nil // ctx ended
	}
	if started != nil {
		started(logger)
	}
	var wg sync.WaitGroup
	for range q.cfg.Workers {
		wg.Go(func() { wait.UntilWithContext(ctx, q.worker, time.Second) })
	}
	logger.Info("Controller started", "controller", q.cfg.Controller)
	<-ctx.Done()
	logger.Info("Stopping the controller", "controller", q.cfg.Controller)
	q.Queue.ShutDown()
	wg.Wait()
	logger.Info("Controller stopped", "controller", q.cfg.Controller)
	return nil
}

// addHandlers adds the claim handlers (with the claim resync: a claim
// changed again while a sync ran may have been judged on the state before
// it) and the volume handlers, then more's.
func (q *ClaimQueue) addHandlers(more func(*Handlers) error) (*Handlers, error) {
	hs := &Handlers{}
	err := hs.Add(q.PVCInformer, cache.ResourceEventHandlerFuncs{
		AddFunc:    q.ClaimAdded,
		UpdateFunc: q.ClaimUpdated,
		DeleteFunc: q.ClaimDeleted,
	}, q.cfg.Resync)
	if err == nil {
		err = hs.Add(q.PVInformer, cache.ResourceEventHandlerFuncs{
			AddFunc:    q.VolumeAdded,
			DeleteFunc: q.VolumeDeleted,
		}, 0)
	}
	if err == nil && more != nil {
		err = more(hs)
	}
	return hs, err
}

func (q *ClaimQueue) worker(ctx context.Context) {
	for q.ProcessNext(ctx) {
	}
}

// ProcessNext takes one claim off the queue and syncs it (Sync), through
// Queue.ProcessNext, the only place that calls Done and forgets or re-adds
// a claim. It returns false when the worker should stop. While the driver
// or the API server is away the claims wait in the queue rather than fail
// each: no driver call whose outcome could not be recorded.
func (q *ClaimQueue) ProcessNext(ctx context.Context) bool {
	return q.Queue.ProcessNext(ctx, q.api.Gate(q.cfg.Ready), Observing(q.api, q.Sync), IsFinal)
}

// Sync runs the controller's sync of key. An update event of the claim
// that arrived meanwhile and was not one of the sync's own writes queues
// the claim once more when the sync ends.
func (q *ClaimQueue) Sync(ctx context.Context, key string) error {
	q.Writes.Begin(key)
	err := q.cfg.Sync(ctx, key)
	if q.Writes.End(key) {
		q.Queue.Q.Add(key)
	}
	return err
}

// ClaimAdded is the claim informer's add handler: it queues the claim.
func (q *ClaimQueue) ClaimAdded(obj any) {
	if pvc, ok := obj.(*corev1.PersistentVolumeClaim); ok {
		q.Queue.Q.Add(ClaimKey(pvc))
	}
}

// ClaimUpdated is the claim informer's update handler. A resync (the same
// resourceVersion) queues the claim; the controller's own write coming
// back does not, which would cut its backoff short; any other update
// queues it when the controller's Wants says so. An update of a claim
// being synced is held until the sync ends: it may be the sync's own
// write, whose resourceVersion the sync does not know yet.
func (q *ClaimQueue) ClaimUpdated(oldObj, newObj any) {
	old, ok1 := oldObj.(*corev1.PersistentVolumeClaim)
	pvc, ok2 := newObj.(*corev1.PersistentVolumeClaim)
	if !ok1 || !ok2 {
		return
	}
	key := ClaimKey(pvc)
	if old.ResourceVersion != pvc.ResourceVersion {
		if q.Writes.Own(key, pvc.ResourceVersion) || !q.cfg.Wants(old, pvc) || q.Writes.Hold(key, pvc.ResourceVersion) {
			return
		}
	}
	q.Queue.Q.Add(key)
}

// ClaimDeleted is the claim informer's delete handler: it forgets the
// claim and queues it, so that its sync finds it gone and forgets its
// backoff.
func (q *ClaimQueue) ClaimDeleted(obj any) {
	pvc, ok := Tombstoned(obj).(*corev1.PersistentVolumeClaim)
	if !ok {
		return
	}
	key := ClaimKey(pvc)
	q.Writes.Forget(key)
	if q.cfg.Forget != nil {
		q.cfg.Forget(key, pvc)
	}
	q.Queue.Q.Add(key)
}

// VolumeAdded is the volume informer's add handler: it queues the claim of
// a new volume of the driver, since a claim whose sync found its volume
// missing from the cache waits for it.
func (q *ClaimQueue) VolumeAdded(obj any) {
	pv, ok := obj.(*corev1.PersistentVolume)
	if !ok || pv.Spec.CSI == nil || pv.Spec.CSI.Driver != q.cfg.DriverName || pv.Spec.ClaimRef == nil {
		return
	}
	q.Queue.Q.Add(pv.Spec.ClaimRef.Namespace + "/" + pv.Spec.ClaimRef.Name)
}

// VolumeDeleted is the volume informer's delete handler: it forgets the
// controller's writes of the volume.
func (q *ClaimQueue) VolumeDeleted(obj any) {
	if pv, ok := Tombstoned(obj).(*corev1.PersistentVolume); ok {
		q.Writes.Forget(VolumeKey(pv.Name))
	}
}
