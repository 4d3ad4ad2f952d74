package kubetest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2/ktesting"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/loopvol/loopvol/pkg/csiclient"
)

// Env is what every controller fixture starts from; a fixture embeds it
// and adds its controller, its driver fake and how it replays the watch.
type Env struct {
	T *testing.T
	// Ctx carries the test's logger (ktesting), so log lines land in the
	// test's output.
	Ctx context.Context
	// Client is a fake clientset holding the objects NewEnv was given.
	Client *fake.Clientset
	// Recorder takes the controller's Events (Events reads them).
	Recorder *record.FakeRecorder
	// Registry takes the controller's metrics.
	Registry *prometheus.Registry
	// Clock is the controller's clock, at the time NewEnv was given.
	Clock *testingclock.FakeClock
}

// NewEnv returns an Env whose fake API server holds objs and whose clock
// says now.
func NewEnv(t *testing.T, now time.Time, objs ...runtime.Object) *Env {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	return &Env{
		T:        t,
		Ctx:      ctx,
		Client:   fake.NewClientset(objs...),
		Recorder: record.NewFakeRecorder(100),
		Registry: prometheus.NewRegistry(),
		Clock:    testingclock.NewFakeClock(now),
	}
}

// FakeDriver is what every CSI driver fake of the controller tests
// shares: it is always ready (WaitReady returns at once unless ctx ended),
// offers Caps, and keeps the calls made to it, of type C (the
// controller's call in short form). A controller's fake embeds it, adds
// its own RPCs, and appends each call to Calls with the mutex held.
type FakeDriver[C any] struct {
	sync.Mutex
	// Caps are the driver's capabilities; a test may change them.
	Caps csiclient.Capabilities
	// Calls are the calls made since the last TakeCalls.
	Calls []C
}

// WaitReady returns ctx's error: the fake driver is always there.
func (d *FakeDriver[C]) WaitReady(ctx context.Context) error { return ctx.Err() }

// Capabilities returns Caps.
func (d *FakeDriver[C]) Capabilities() csiclient.Capabilities {
	d.Lock()
	defer d.Unlock()
	return d.Caps
}

// TakeCalls returns the calls made since the last TakeCalls, and forgets
// them.
func (d *FakeDriver[C]) TakeCalls() []C {
	d.Lock()
	defer d.Unlock()
	out := d.Calls
	d.Calls = nil
	return out
}

// Cache puts a copy of obj into idx, as an informer's initial list would,
// without calling a handler. A nil idx (the fixture caches no such
// object) leaves obj out.
func Cache(t testing.TB, idx cache.Indexer, obj runtime.Object) {
	t.Helper()
	if idx == nil {
		return
	}
	if err := idx.Add(obj.DeepCopyObject()); err != nil {
		t.Fatalf("cache %T: %v", obj, err)
	}
}
