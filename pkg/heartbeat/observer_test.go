package heartbeat

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2/ktesting"
	testingclock "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/loopvol/loopvol/internal/kube/kubetest"
)

const fencingPeriod = 10 * time.Second

// observerFixture is an Observer on a fake API server that can be made
// unreachable (down: every Lease request fails, the open watches end) or
// only refuse the probe (probeDown), with a fake clock.
type observerFixture struct {
	t         *testing.T
	ctx       context.Context
	client    *fake.Clientset
	clk       *testingclock.FakeClock
	o         *Observer
	down      atomic.Bool
	probeDown atomic.Bool
	listHeld  atomic.Bool // the informer's list fails (the probe's does not)

	mu      sync.Mutex
	watches []watch.Interface
	events  []Event
}

func lease(node string, renew time.Time) *coordinationv1.Lease {
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{
			Name: LeaseName(testDriver, node), Namespace: testNS,
			Labels:      map[string]string{ComponentLabel: ComponentHeartbeat, DriverLabel: testDriver},
			Annotations: map[string]string{IncarnationAnnotation: testIncarnation.Format(time.RFC3339Nano)},
		},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(node), LeaseDurationSeconds: ptr.To(int32(2)), RenewTime: &metav1.MicroTime{Time: renew}},
	}
}

func newObserverFixture(t *testing.T, objs ...runtime.Object) *observerFixture {
	t.Helper()
	f := buildObserverFixture(t, objs...)
	f.start()
	return f
}

// buildObserverFixture is newObserverFixture without starting the Observer.
func buildObserverFixture(t *testing.T, objs ...runtime.Object) *observerFixture {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	f := &observerFixture{t: t, ctx: ctx, client: fake.NewClientset(objs...), clk: testingclock.NewFakeClock(testNow)}
	kubetest.Serve(f.client, kubetest.Options{})
	refused := errors.New("connection refused")
	f.client.PrependReactor("list", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		probe := a.(k8stesting.ListActionImpl).ListOptions.Limit == 1
		if f.down.Load() || probe && f.probeDown.Load() || !probe && f.listHeld.Load() {
			return true, nil, refused
		}
		return false, nil, nil
	})
	f.client.PrependWatchReactor("leases", func(a k8stesting.Action) (bool, watch.Interface, error) {
		if f.down.Load() {
			return true, nil, refused
		}
		w, err := f.client.Tracker().Watch(a.GetResource(), a.GetNamespace(), a.(k8stesting.WatchActionImpl).ListOptions)
		f.mu.Lock()
		f.watches = append(f.watches, w)
		f.mu.Unlock()
		return true, w, err
	})
	o, err := NewObserver(ObserverConfig{
		Client: f.client, Namespace: testNS, DriverName: testDriver,
		FencingPeriod: fencingPeriod, ProbeInterval: time.Second, Clock: f.clk,
		OnChange: func(_ context.Context, ev Event) {
			f.mu.Lock()
			defer f.mu.Unlock()
			f.events = append(f.events, ev)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	f.o = o
	return f
}

// start runs the Observer until the test ends.
func (f *observerFixture) start() {
	rctx, cancel := context.WithCancel(f.ctx)
	done := make(chan error, 1)
	go func() { done <- f.o.Run(rctx) }()
	f.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			f.t.Error(err)
		}
	})
	eventually(f.t, "the probe ticker", f.clk.HasWaiters)
}

// step moves the clock by d and waits until the Observer has judged at
// the new time.
func (f *observerFixture) step(d time.Duration) {
	f.t.Helper()
	f.clk.Step(d)
	now := f.clk.Now()
	eventually(f.t, "judged at "+now.Format(time.TimeOnly), func() bool {
		f.o.mu.Lock()
		defer f.o.mu.Unlock()
		return f.o.judged.Equal(now)
	})
}

// sync steps until the Observer has synced and judges.
func (f *observerFixture) sync() {
	f.t.Helper()
	eventually(f.t, "synced and healthy", func() bool {
		f.step(time.Second)
		return f.o.Healthy() == nil
	})
}

// renew writes a renewal of node's Lease, as its Renewer would.
func (f *observerFixture) renew(node string) {
	f.t.Helper()
	l := lease(node, f.clk.Now())
	if _, err := f.client.CoordinationV1().Leases(testNS).Update(f.ctx, l, metav1.UpdateOptions{}); err != nil {
		f.t.Fatal(err)
	}
	// The watch delivers it; wait until the Observer saw it.
	eventually(f.t, "the renewal of "+node+" seen", func() bool {
		s, ok := f.o.Node(node)
		return ok && !s.LastChange.Before(f.clk.Now())
	})
}

func (f *observerFixture) takeEvents() []Event {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := f.events
	f.events = nil
	return out
}

// waitEvents takes the events OnChange was told, waiting until there are
// as many as want: the Observer delivers them from a goroutine of its own,
// after it judged, so they may come a moment after Stale says so.
func (f *observerFixture) waitEvents(t *testing.T, want []string) []string {
	t.Helper()
	var got []string
	for deadline := time.Now().Add(10 * time.Second); len(got) < len(want) && time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		got = append(got, eventSummary(f.takeEvents())...)
	}
	return got
}

func staleIDs(states []NodeState) []string {
	var ids []string
	for _, s := range states {
		ids = append(ids, s.NodeID)
	}
	return ids
}

func eventSummary(evs []Event) []string {
	var out []string
	for _, ev := range evs {
		out = append(out, string(ev.Type)+" "+ev.Node.NodeID)
	}
	return out
}

// TestObserverStaleAfterTheFencingPeriod: node-a renews, node-b does not;
// node-b is stale once it has not been seen to change for the fencing
// period counted from the sync (not from its old renewTime), node-a never.
// Then node-b renews (back) and node-a's Lease is deleted (gone).
func TestObserverStaleAfterTheFencingPeriod(t *testing.T) {
	// Both Leases were last renewed an hour ago, by the holders' clocks.
	f := newObserverFixture(t, lease("node-a", testNow.Add(-time.Hour)), lease("node-b", testNow.Add(-time.Hour)))
	f.sync()
	synced := f.clk.Now()
	if f.o.Stale() != nil || !f.o.Fresh("node-a") || !f.o.Fresh("node-b") {
		t.Fatalf("right after the sync: stale %v; want none (an old renewTime says nothing)", staleIDs(f.o.Stale()))
	}
	for f.clk.Since(synced) < fencingPeriod-time.Second {
		f.step(time.Second)
		f.renew("node-a")
		if s := f.o.Stale(); s != nil {
			t.Fatalf("%s after the sync: stale %v, want none", f.clk.Since(synced), staleIDs(s))
		}
	}
	f.step(time.Second)
	eventually(t, "the stale event", func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return len(f.events) > 0
	})
	if got := staleIDs(f.o.Stale()); !slices.Equal(got, []string{"node-b"}) {
		t.Fatalf("%s after the sync: stale %v, want [node-b]", f.clk.Since(synced), got)
	}
	if want, got := []string{"Stale node-b"}, f.waitEvents(t, []string{"Stale node-b"}); !slices.Equal(got, want) {
		t.Errorf("events %v, want %v", got, want)
	}
	f.renew("node-a")
	f.step(2 * time.Second)
	s := f.o.Stale()
	if len(s) != 1 || s[0].StaleFor != 2*time.Second || !s[0].LastChange.Equal(synced) || !s[0].Incarnation.Equal(testIncarnation) || s[0].FencingPeriod != fencingPeriod {
		t.Errorf("stale node-b: %+v; want stale for 2s, last change at the sync, its incarnation, the fencing period", s)
	}
	if f.o.Fresh("node-b") || !f.o.Fresh("node-a") {
		t.Error("Fresh wrong")
	}

	// node-b renews: back at once, without waiting for a tick.
	f.renew("node-b")
	eventually(t, "the back event", func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return len(f.events) > 0
	})
	if want, got := []string{"Back node-b"}, f.waitEvents(t, []string{"Back node-b"}); !slices.Equal(got, want) {
		t.Errorf("events %v, want %v", got, want)
	}
	if f.o.Stale() != nil || !f.o.Fresh("node-b") {
		t.Errorf("after node-b renewed: stale %v", staleIDs(f.o.Stale()))
	}

	// node-a's Lease is deleted: forgotten, never stale.
	if err := f.client.CoordinationV1().Leases(testNS).Delete(f.ctx, LeaseName(testDriver, "node-a"), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "node-a forgotten", func() bool { _, ok := f.o.Node("node-a"); return !ok })
	for range 12 {
		f.step(time.Second)
		f.renew("node-b")
	}
	if f.o.Stale() != nil || f.o.Fresh("node-a") {
		t.Errorf("after node-a's Lease was deleted: stale %v, fresh %v", staleIDs(f.o.Stale()), f.o.Fresh("node-a"))
	}
	if want, got := []string{"Gone node-a"}, f.waitEvents(t, []string{"Gone node-a"}); !slices.Equal(got, want) {
		t.Errorf("events %v, want %v", got, want)
	}
}

// TestObserverNothingStaleBeforeTheSync: while the informer cannot list,
// nothing is stale however long it takes; the countdown starts at the
// sync.
func TestObserverNothingStaleBeforeTheSync(t *testing.T) {
	f := buildObserverFixture(t, lease("node-a", testNow))
	f.listHeld.Store(true)
	f.start()
	for range 3 * int(fencingPeriod/time.Second) {
		f.step(time.Second)
	}
	if f.o.Stale() != nil || f.o.Fresh("node-a") || f.o.Healthy() == nil {
		t.Fatalf("before the sync: stale %v, fresh %v, healthy %v; want none, false, an error", staleIDs(f.o.Stale()), f.o.Fresh("node-a"), f.o.Healthy())
	}
	f.listHeld.Store(false)
	f.sync()
	synced := f.clk.Now()
	for f.clk.Since(synced) < fencingPeriod-time.Second {
		f.step(time.Second)
	}
	if f.o.Stale() != nil {
		t.Fatalf("%s after the sync: stale %v", f.clk.Since(synced), staleIDs(f.o.Stale()))
	}
	f.step(time.Second)
	if got := staleIDs(f.o.Stale()); !slices.Equal(got, []string{"node-a"}) {
		t.Errorf("a fencing period after the sync: stale %v, want [node-a]", got)
	}
}

// TestObserverOutageRestartsTheCountdown: the API server is away for
// three fencing periods (lists, watches and probes fail; the open watch
// ends). Nobody is stale meanwhile, nor when it is back: every countdown
// starts when observation works again, and a node that does not renew
// after that is stale a fencing period later; one that renews never is.
func TestObserverOutageRestartsTheCountdown(t *testing.T) {
	f := newObserverFixture(t, lease("node-a", testNow), lease("node-b", testNow))
	f.sync()
	f.step(time.Second)
	f.renew("node-a")
	f.renew("node-b")

	f.down.Store(true)
	f.mu.Lock()
	for _, w := range f.watches {
		w.Stop()
	}
	f.mu.Unlock()
	eventually(t, "the outage noticed", func() bool {
		f.step(time.Second)
		return f.o.Healthy() != nil
	})
	for range 3 * int(fencingPeriod/time.Second) {
		f.step(time.Second)
		if s := f.o.Stale(); s != nil {
			t.Fatalf("during the outage: stale %v", staleIDs(s))
		}
	}
	f.down.Store(false)
	// The informer reopens its watch after its own (real-time) backoff.
	f.sync()
	back := f.clk.Now()
	t.Logf("observation healthy again at %s", back.Sub(testNow))
	for f.clk.Since(back) < fencingPeriod-time.Second {
		f.step(time.Second)
		f.renew("node-a")
		if s := f.o.Stale(); s != nil {
			t.Fatalf("%s after the outage: stale %v, want none", f.clk.Since(back), staleIDs(s))
		}
	}
	f.step(time.Second)
	if got := staleIDs(f.o.Stale()); !slices.Equal(got, []string{"node-b"}) {
		t.Errorf("a fencing period after the outage: stale %v, want [node-b] (it never renewed)", got)
	}
	if want, got := []string{"Stale node-b"}, f.waitEvents(t, []string{"Stale node-b"}); !slices.Equal(got, want) {
		t.Errorf("events %v, want %v", got, want)
	}
}

// TestObserverFailedProbeRestartsTheCountdown: with the watch open, one
// failed probe is enough to stop the judging and restart the countdowns.
func TestObserverFailedProbeRestartsTheCountdown(t *testing.T) {
	f := newObserverFixture(t, lease("node-a", testNow))
	f.sync()
	synced := f.clk.Now()
	for f.clk.Since(synced) < fencingPeriod-time.Second {
		f.step(time.Second)
	}
	f.probeDown.Store(true)
	f.step(time.Second) // a fencing period after the sync, but the probe failed
	if f.o.Stale() != nil || f.o.Healthy() == nil {
		t.Fatalf("with the probe failing: stale %v, healthy %v", staleIDs(f.o.Stale()), f.o.Healthy())
	}
	f.probeDown.Store(false)
	f.step(time.Second)
	back := f.clk.Now()
	for f.clk.Since(back) < fencingPeriod-time.Second {
		f.step(time.Second)
		if s := f.o.Stale(); s != nil {
			t.Fatalf("%s after the failed probe: stale %v", f.clk.Since(back), staleIDs(s))
		}
	}
	f.step(time.Second)
	if got := staleIDs(f.o.Stale()); !slices.Equal(got, []string{"node-a"}) {
		t.Errorf("a fencing period after the probe worked again: stale %v, want [node-a]", got)
	}
}

// TestObserverUsesTheLeasesLongerPeriod: a Lease that states a longer
// fencing period than the Observer's gets it.
func TestObserverUsesTheLeasesLongerPeriod(t *testing.T) {
	long := lease("node-a", testNow)
	long.Spec.LeaseDurationSeconds = ptr.To(int32(15))
	f := newObserverFixture(t, long)
	f.sync()
	synced := f.clk.Now()
	for f.clk.Since(synced) < 15*time.Second-time.Second {
		f.step(time.Second)
	}
	if f.o.Stale() != nil {
		t.Fatalf("stale after %s, before the Lease's 15s", f.clk.Since(synced))
	}
	f.step(time.Second)
	if got := staleIDs(f.o.Stale()); !slices.Equal(got, []string{"node-a"}) {
		t.Errorf("after the Lease's 15s: stale %v", got)
	}
}

// TestObserverReadsFencedVolumes: the node's state has the count its
// Lease states, -1 when it states none or nonsense.
func TestObserverReadsFencedVolumes(t *testing.T) {
	l := lease("node-a", testNow)
	f := newObserverFixture(t, l)
	f.sync()
	for _, tc := range []struct {
		value string
		want  int
	}{{"", -1}, {"3", 3}, {"0", 0}, {"-2", -1}, {"many", -1}} {
		l := lease("node-a", f.clk.Now())
		if tc.value != "" {
			l.Annotations[FencedVolumesAnnotation] = tc.value
		}
		if _, err := f.client.CoordinationV1().Leases(testNS).Update(f.ctx, l, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, "the Lease with "+tc.value+" seen", func() bool {
			s, ok := f.o.Node("node-a")
			return ok && s.FencedVolumes == tc.want
		})
	}
}
