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

// Calls is the list of calls a fake (of a CSI driver) was made, safe for
// the controller's workers and the test at once.
type Calls[T any] struct {
	mu    sync.Mutex
	calls []T
}

// Add records one call.
func (c *Calls[T]) Add(call T) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls = append(c.calls, call)
}

// Take returns the calls recorded since the last Take and forgets them.
func (c *Calls[T]) Take() []T {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.calls
	c.calls = nil
	return out
}

// Count is how many of the calls recorded since the last Take match.
func (c *Calls[T]) Count(match func(T) bool) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, call := range c.calls {
		if match(call) {
			n++
		}
	}
	return n
}

// Driver is what every CSI driver fake of the controller tests shares: it
// is always ready (WaitReady returns at once unless ctx ended) and offers
// the capabilities it was made with. A fake embeds it and adds the calls
// its controller makes.
type Driver struct {
	mu   sync.Mutex
	caps csiclient.Capabilities
}

// NewDriver returns a Driver offering caps.
func NewDriver(caps csiclient.Capabilities) *Driver { return &Driver{caps: caps} }

// WaitReady returns ctx's error: the fake driver is always there.
func (d *Driver) WaitReady(ctx context.Context) error { return ctx.Err() }

// Capabilities returns the capabilities the driver offers.
func (d *Driver) Capabilities() csiclient.Capabilities {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.caps
}

// SetCapabilities changes what the driver offers from now on.
func (d *Driver) SetCapabilities(caps csiclient.Capabilities) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.caps = caps
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
