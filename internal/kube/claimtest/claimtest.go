// Package claimtest is the unit-test fixture of the claim controllers
// (pkg/resize and pkg/modify, both built on kube.ClaimQueue): builders of
// claims and the volumes bound to them, a fake API server (kubetest.Serve)
// whose writes a replayed watch delivers to the queue's caches and claim
// handlers, and a worker run by hand, so that each test syncs one claim at
// a time, deterministically. What is a controller's own (its driver fake,
// its other caches) stays in its package.
package claimtest

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/loopvol/loopvol/internal/kube"
	"github.com/loopvol/loopvol/internal/kube/kubetest"
)

var (
	claimsGVR  = corev1.SchemeGroupVersion.WithResource("persistentvolumeclaims")
	volumesGVR = corev1.SchemeGroupVersion.WithResource("persistentvolumes")
)

// Fixture is a claim controller's queue over a fake clientset whose
// caches are filled by hand. Build it with New, give the controller its
// ClaimConfig, then hand it the controller's queue with Use.
type Fixture struct {
	*kubetest.Env
	// Errs are what each sync of Next and Drain returned, in order.
	Errs []error
	// Eager: each write is delivered to the caches and the handlers while
	// the write call is still running, as a watch faster than the answer.
	Eager bool
	// Replay, when set, is called by Observe after the claims and volumes
	// were replayed: the controller's other caches.
	Replay func()

	q      *kube.ClaimQueue
	objs   []runtime.Object
	writes []runtime.Object // the writes not yet delivered to the caches
}

// New returns a fixture whose fake API server holds objs and whose clock
// says Now.
func New(t *testing.T, objs []runtime.Object) *Fixture {
	t.Helper()
	f := &Fixture{Env: kubetest.NewEnv(t, Now, objs...), objs: objs}
	kubetest.Serve(f.Client, kubetest.Options{Written: func(o runtime.Object) {
		f.writes = append(f.writes, o)
		if f.Eager {
			f.Observe()
		}
	}})
	return f
}

// ClaimConfig is the configuration the fixture's controller gets: the
// fake clientset, fresh informers over it (started by nobody: the fixture
// fills their caches), the fixture's Recorder, Registry and Clock, one
// worker and a backoff from one second to five minutes.
func (f *Fixture) ClaimConfig() kube.ClaimConfig {
	return kube.ClaimConfig{
		DriverName:         Driver,
		Client:             f.Client,
		Informers:          kube.NewInformers(f.Client, 0),
		Recorder:           f.Recorder,
		Workers:            1,
		RetryIntervalStart: time.Second,
		RetryIntervalMax:   5 * time.Minute,
		Registerer:         f.Registry,
		Clock:              f.Clock,
	}
}

// Build applies opts to cfg and builds the controller under test with
// newController; an error fails the test.
func Build[C, Config any](t testing.TB, cfg Config, opts []func(*Config), newController func(Config) (C, error)) C {
	t.Helper()
	for _, o := range opts {
		o(&cfg)
	}
	c, err := newController(cfg)
	if err != nil {
		t.Fatalf("build the controller: %v", err)
	}
	return c
}

// Use makes q, the queue of the controller under test, the fixture's: the
// claims and volumes New was given go into its caches (without calling
// the handlers), the requests made so far are forgotten, and the queue is
// shut down when the test ends.
func (f *Fixture) Use(q *kube.ClaimQueue) {
	f.T.Helper()
	f.q = q
	f.T.Cleanup(q.Queue.ShutDown)
	for _, o := range f.objs {
		f.Cache(o)
	}
	f.Client.ClearActions()
}

// Cache puts a claim or a volume into its cache, as a watch event would,
// without calling the handlers, and reports whether obj was one.
func (f *Fixture) Cache(obj runtime.Object) bool {
	f.T.Helper()
	var err error
	switch o := obj.(type) {
	case *corev1.PersistentVolumeClaim:
		err = f.q.PVCInformer.GetIndexer().Add(o.DeepCopy())
	case *corev1.PersistentVolume:
		out, _ := kube.StripPV(o.DeepCopy(), kube.PVResize)
		err = f.q.PVInformer.GetIndexer().Add(out)
	default:
		return false
	}
	if err != nil {
		f.T.Fatalf("cache %T: %v", obj, err)
	}
	return true
}

// QueueAll queues every cached claim, as the handlers do at start.
func (f *Fixture) QueueAll() {
	for _, o := range f.q.PVCInformer.GetIndexer().List() {
		f.q.ClaimAdded(o)
	}
}

// Observe plays the watch: first each object the controller's writes
// produced, in order, one event each (a watch delivers every version);
// then every claim and volume that still differs between the fake API
// server and the cache (changed by the test), then Replay. The claim
// handlers are called as an informer calls them.
func (f *Fixture) Observe() {
	f.T.Helper()
	writes := f.writes
	f.writes = nil
	pvcs, pvs := f.q.PVCInformer.GetIndexer(), f.q.PVInformer.GetIndexer()
	for _, o := range writes {
		switch o := o.(type) {
		case *corev1.PersistentVolumeClaim:
			old, exists, _ := pvcs.Get(o)
			_ = pvcs.Update(o)
			if exists {
				f.q.ClaimUpdated(old, o)
			}
		case *corev1.PersistentVolume:
			out, _ := kube.StripPV(o, kube.PVResize)
			_ = pvs.Update(out)
		}
	}
	claims, err := f.Client.Tracker().List(claimsGVR, corev1.SchemeGroupVersion.WithKind("PersistentVolumeClaim"), "")
	if err != nil {
		f.T.Fatal(err)
	}
	for _, o := range claims.(*corev1.PersistentVolumeClaimList).Items {
		pvc := o.DeepCopy()
		old, exists, _ := pvcs.Get(pvc)
		switch {
		case !exists:
			_ = pvcs.Add(pvc)
			f.q.ClaimAdded(pvc)
		case !equality.Semantic.DeepEqual(old, pvc):
			_ = pvcs.Update(pvc)
			f.q.ClaimUpdated(old, pvc)
		}
	}
	volumes, err := f.Client.Tracker().List(volumesGVR, corev1.SchemeGroupVersion.WithKind("PersistentVolume"), "")
	if err != nil {
		f.T.Fatal(err)
	}
	for _, o := range volumes.(*corev1.PersistentVolumeList).Items {
		out, _ := kube.StripPV(o.DeepCopy(), kube.PVResize)
		_ = pvs.Update(out)
	}
	if f.Replay != nil {
		f.Replay()
	}
}

// Next runs one step of a worker on the queue's next claim, as
// kube.ClaimQueue.ProcessNext does (the sync, then the queue's Done and
// backoff), without waiting for the driver, and returns the sync's error.
// The queue must not be empty.
func (f *Fixture) Next() error {
	f.T.Helper()
	var err error
	ready := func(ctx context.Context) error { return ctx.Err() }
	f.q.Queue.ProcessNext(f.Ctx, ready, func(ctx context.Context, key string) error {
		err = f.q.Sync(ctx, key)
		return err
	}, kube.IsFinal)
	f.Errs = append(f.Errs, err)
	return err
}

// Drain runs the worker until the queue is empty (claims waiting out a
// backoff are not run), observing the API server after each sync.
func (f *Fixture) Drain() {
	f.T.Helper()
	for range 100 {
		if f.q.Queue.Q.Len() == 0 {
			return
		}
		f.Next()
		f.Observe()
	}
	f.T.Fatal("the queue never drained")
}

// Resync queues every claim, as a resync period does, and drains.
func (f *Fixture) Resync() {
	f.QueueAll()
	f.Drain()
}

// PVC is the claim name of Namespace as the fake API server holds it.
func (f *Fixture) PVC(name string) *corev1.PersistentVolumeClaim {
	f.T.Helper()
	return kubetest.Get[*corev1.PersistentVolumeClaim](f.T, f.Client, claimsGVR, Namespace, name)
}

// PV is the volume name as the fake API server holds it.
func (f *Fixture) PV(name string) *corev1.PersistentVolume {
	f.T.Helper()
	return kubetest.Get[*corev1.PersistentVolume](f.T, f.Client, volumesGVR, "", name)
}

// SetClaim changes a claim in the fake API server, as a user would, and
// plays the watch.
func (f *Fixture) SetClaim(name string, change func(*corev1.PersistentVolumeClaim)) {
	f.T.Helper()
	pvc := f.PVC(name).DeepCopy()
	change(pvc)
	pvc.ResourceVersion += "0" // a new version, as the API server's
	if err := f.Client.Tracker().Update(claimsGVR, pvc, Namespace); err != nil {
		f.T.Fatal(err)
	}
	f.Observe()
}

// Actions returns the requests made to the API server since the last call,
// with every resourceVersion precondition as "RV" (their values are the
// fake's).
func (f *Fixture) Actions() []kubetest.Action {
	return kubetest.Recorder{MaskResourceVersions: true}.Take(f.Client)
}

// Events returns the Events recorded since the last call.
func (f *Fixture) Events() []string { return kubetest.Events(f.Recorder) }
