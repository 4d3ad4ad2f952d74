package heartbeat

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2/ktesting"
	testingclock "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/loopvol/loopvol/internal/kube/kubetest"
)

const testNode = "node-a"

var testIncarnation = testNow.Add(-time.Minute)

// renewerFixture is a Renewer on a fake API server whose Lease calls fail
// while failing is set, with a fake clock and counted callbacks.
type renewerFixture struct {
	t        *testing.T
	ctx      context.Context
	client   *fake.Clientset
	clk      *testingclock.FakeClock
	r        *Renewer
	failing  atomic.Bool
	calls    atomic.Int32 // Lease requests made
	lost     atomic.Int32
	regained atomic.Int32
}

func testRenewerConfig() RenewerConfig {
	return RenewerConfig{
		Namespace: testNS, DriverName: testDriver, NodeID: testNode, Incarnation: testIncarnation,
		RenewInterval: time.Second, FencingPeriod: 6 * time.Second, SelfFenceAfter: 3 * time.Second,
	}
}

func newRenewerFixture(t *testing.T, cfg RenewerConfig, objs ...runtime.Object) *renewerFixture {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	f := &renewerFixture{t: t, ctx: ctx, client: fake.NewClientset(objs...), clk: testingclock.NewFakeClock(testNow)}
	kubetest.Serve(f.client, kubetest.Options{})
	f.client.PrependReactor("*", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		f.calls.Add(1)
		if f.failing.Load() {
			return true, nil, errors.New("connection refused")
		}
		return false, nil, nil
	})
	cfg.Client, cfg.Clock = f.client, f.clk
	cfg.OnLost = func(context.Context) { f.lost.Add(1) }
	cfg.OnRegained = func(context.Context) { f.regained.Add(1) }
	r, err := NewRenewer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	f.r = r
	return f
}

// run runs the Renewer until the test ends.
func (f *renewerFixture) run() {
	ctx, cancel := context.WithCancel(f.ctx)
	done := make(chan error, 1)
	go func() { done <- f.r.Run(ctx) }()
	// The first renewal starts once the ticker and the deadline are set:
	// the test's steps count from there.
	eventually(f.t, "the first renewal", func() bool { return f.r.done.Load() > 0 })
	f.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			f.t.Error(err)
		}
	})
}

func (f *renewerFixture) lease() *coordinationv1.Lease {
	f.t.Helper()
	l, err := f.client.Tracker().Get(coordinationv1.SchemeGroupVersion.WithResource("leases"), testNS, LeaseName(testDriver, testNode))
	if err != nil {
		return nil
	}
	return l.(*coordinationv1.Lease)
}

// renewedAt reports whether the Lease's renewTime is at.
func (f *renewerFixture) renewedAt(at time.Time) func() bool {
	return func() bool {
		l := f.lease()
		return l != nil && l.Spec.RenewTime != nil && l.Spec.RenewTime.Time.Equal(at)
	}
}

// step moves the clock by d and waits until the renewal that the tick
// started has made its requests.
func (f *renewerFixture) step(d time.Duration) {
	f.t.Helper()
	before := f.r.done.Load()
	f.clk.Step(d)
	eventually(f.t, "a renewal after the tick at "+f.clk.Now().Format(time.TimeOnly), func() bool { return f.r.done.Load() > before })
}

func TestRenewerRenewsAtTheInterval(t *testing.T) {
	f := newRenewerFixture(t, testRenewerConfig())
	f.run()
	eventually(t, "the Lease created", f.renewedAt(testNow))

	l := f.lease()
	at := metav1.NewMicroTime(testNow)
	want := coordinationv1.LeaseSpec{
		HolderIdentity:       ptr.To(testNode),
		LeaseDurationSeconds: ptr.To(int32(6)),
		AcquireTime:          &at,
		RenewTime:            &at,
		LeaseTransitions:     ptr.To(int32(0)),
	}
	if diff := cmp.Diff(want, l.Spec); diff != "" {
		t.Errorf("Lease spec (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]string{ComponentLabel: ComponentHeartbeat, DriverLabel: testDriver}, l.Labels); diff != "" {
		t.Errorf("labels (-want +got):\n%s", diff)
	}
	if got, want := l.Annotations[IncarnationAnnotation], testIncarnation.Format(time.RFC3339Nano); got != want {
		t.Errorf("incarnation = %q, want %q", got, want)
	}
	if !Selector(testDriver).Matches(labels.Set(l.Labels)) {
		t.Error("the Observer's selector does not match the Lease")
	}

	// No renewal before the interval, one at each tick.
	updates := func() int {
		n := 0
		for _, a := range f.client.Actions() {
			if a.Matches("update", "leases") {
				n++
			}
		}
		return n
	}
	f.clk.Step(999 * time.Millisecond)
	time.Sleep(20 * time.Millisecond)
	if n := updates(); n != 0 {
		t.Errorf("%d renewals before the interval was over", n)
	}
	for i := 1; i <= 3; i++ {
		f.step(time.Millisecond)
		eventually(t, "renewed on the tick", f.renewedAt(f.clk.Now()))
		if n := updates(); n != i {
			t.Errorf("after %d ticks: %d renewals", i, n)
		}
		f.clk.Step(999 * time.Millisecond)
	}
	eventually(t, "LastRenewed at the last tick", func() bool { return f.r.LastRenewed().Equal(testNow.Add(3 * time.Second)) })
	if f.r.Lost() || f.lost.Load() != 0 {
		t.Error("lost while renewing")
	}
	if l := f.lease(); *l.Spec.LeaseTransitions != 0 || !l.Spec.AcquireTime.Time.Equal(testNow) {
		t.Errorf("renewals moved acquireTime or leaseTransitions: %+v", l.Spec)
	}
}

// TestRenewerLostOnceThenRegainedOnce: renewals fail from the first tick
// on; OnLost is called once when SelfFenceAfter has passed since the last
// success (not before), OnRegained once at the next success.
func TestRenewerLostOnceThenRegainedOnce(t *testing.T) {
	f := newRenewerFixture(t, testRenewerConfig())
	f.run()
	eventually(t, "the Lease created", f.renewedAt(testNow))
	f.failing.Store(true)

	for i := 1; i <= 2; i++ {
		f.step(time.Second)
		if f.r.Lost() || f.lost.Load() != 0 {
			t.Fatalf("lost %ds after the last renewal, before the self-fence period (3s)", i)
		}
	}
	f.clk.Step(999 * time.Millisecond) // no tick, no deadline yet
	time.Sleep(20 * time.Millisecond)
	if f.lost.Load() != 0 {
		t.Fatal("lost before the self-fence period was over")
	}
	f.step(time.Millisecond) // 3s: the deadline and a tick
	eventually(t, "OnLost called", func() bool { return f.lost.Load() == 1 })
	if !f.r.Lost() || f.r.Healthy() == nil {
		t.Error("Lost() or Healthy() do not say so")
	}
	for range 5 {
		f.step(time.Second)
	}
	if n := f.lost.Load(); n != 1 || f.regained.Load() != 0 {
		t.Errorf("OnLost called %d times, OnRegained %d, while failing; want 1, 0", n, f.regained.Load())
	}

	f.failing.Store(false)
	f.step(time.Second)
	eventually(t, "OnRegained called", func() bool { return f.regained.Load() == 1 })
	eventually(t, "renewed", f.renewedAt(f.clk.Now()))
	if f.r.Lost() || f.r.Healthy() != nil {
		t.Error("still lost after a renewal")
	}
	for range 3 {
		f.step(time.Second)
	}
	if f.lost.Load() != 1 || f.regained.Load() != 1 {
		t.Errorf("OnLost %d, OnRegained %d times in all; want 1 each", f.lost.Load(), f.regained.Load())
	}
}

// TestRenewerNeverReachedLoses: a node plugin that never reaches the API
// server counts from its start.
func TestRenewerNeverReachedLoses(t *testing.T) {
	f := newRenewerFixture(t, testRenewerConfig())
	f.failing.Store(true)
	f.run()
	for range 3 {
		f.step(time.Second)
	}
	eventually(t, "OnLost called 3s after the start", func() bool { return f.lost.Load() == 1 })
	if !f.r.LastRenewed().IsZero() {
		t.Errorf("LastRenewed = %s without any renewal", f.r.LastRenewed())
	}
}

// TestRenewerLeavesAnotherHoldersLease: a Lease of the same name held by
// another node is never overwritten; the renewals fail and the node loses
// its heartbeat.
func TestRenewerLeavesAnotherHoldersLease(t *testing.T) {
	theirs := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: LeaseName(testDriver, testNode), Namespace: testNS, ResourceVersion: "5"},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To("node-b"), RenewTime: &metav1.MicroTime{Time: testNow.Add(-time.Hour)}},
	}
	f := newRenewerFixture(t, testRenewerConfig(), theirs)
	f.run()
	for range 3 {
		f.step(time.Second)
	}
	eventually(t, "OnLost called", func() bool { return f.lost.Load() == 1 })
	if err := f.r.Healthy(); !errors.Is(err, ErrHeldByOther) || !strings.Contains(err.Error(), `"node-b"`) {
		t.Errorf("Healthy() = %v, want ErrHeldByOther naming node-b", err)
	}
	if diff := cmp.Diff(theirs.Spec, f.lease().Spec); diff != "" {
		t.Errorf("the other node's Lease changed (-before +after):\n%s", diff)
	}
}

// TestRenewerTakesOverItsEarlierIncarnation: a restarted node plugin (same
// node ID) renews the Lease of its earlier run and writes its incarnation.
func TestRenewerTakesOverItsEarlierIncarnation(t *testing.T) {
	old := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{
			Name: LeaseName(testDriver, testNode), Namespace: testNS, ResourceVersion: "5",
			Labels:      map[string]string{ComponentLabel: ComponentHeartbeat, DriverLabel: testDriver, "other": "kept"},
			Annotations: map[string]string{IncarnationAnnotation: testIncarnation.Add(-time.Hour).Format(time.RFC3339Nano)},
		},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(testNode), LeaseTransitions: ptr.To(int32(2)),
			AcquireTime: &metav1.MicroTime{Time: testNow.Add(-time.Hour)}, RenewTime: &metav1.MicroTime{Time: testNow.Add(-time.Hour)}},
	}
	f := newRenewerFixture(t, testRenewerConfig(), old)
	f.run()
	eventually(t, "renewed", f.renewedAt(testNow))
	l := f.lease()
	if got := l.Annotations[IncarnationAnnotation]; got != testIncarnation.Format(time.RFC3339Nano) {
		t.Errorf("incarnation = %q, want this run's", got)
	}
	if *l.Spec.LeaseTransitions != 3 || !l.Spec.AcquireTime.Time.Equal(testNow) || l.Labels["other"] != "kept" {
		t.Errorf("after the takeover: transitions %d, acquired %s, labels %v; want 3, now, the other label kept", *l.Spec.LeaseTransitions, l.Spec.AcquireTime, l.Labels)
	}
	f.step(time.Second)
	eventually(t, "renewed again", f.renewedAt(f.clk.Now()))
	if l := f.lease(); *l.Spec.LeaseTransitions != 3 {
		t.Errorf("a plain renewal counted as a transition: %d", *l.Spec.LeaseTransitions)
	}
	if f.lost.Load() != 0 {
		t.Error("lost")
	}
}

func TestRenewerConfigValidate(t *testing.T) {
	ok := testRenewerConfig()
	ok.Client = fake.NewClientset()
	if err := ok.Validate(); err != nil {
		t.Fatalf("the test config: %v", err)
	}
	defaults := RenewerConfig{Client: ok.Client, Namespace: testNS, DriverName: testDriver, NodeID: testNode, Incarnation: testIncarnation}
	if err := defaults.Validate(); err != nil {
		t.Errorf("the defaults: %v", err)
	}
	for _, tc := range []struct {
		name   string
		change func(*RenewerConfig)
		want   string
	}{
		{name: "no client", change: func(c *RenewerConfig) { c.Client = nil }, want: "client"},
		{name: "bad namespace", change: func(c *RenewerConfig) { c.Namespace = "Kube_System" }, want: "namespace"},
		{name: "bad driver", change: func(c *RenewerConfig) { c.DriverName = strings.Repeat("d", 64) }, want: "driver name"},
		{name: "no node ID", change: func(c *RenewerConfig) { c.NodeID = "" }, want: "node ID"},
		{name: "no incarnation", change: func(c *RenewerConfig) { c.Incarnation = time.Time{} }, want: "incarnation"},
		{name: "timeout not shorter than the interval", change: func(c *RenewerConfig) { c.RenewTimeout = time.Second }, want: "renew timeout"},
		{name: "self-fence within two intervals", change: func(c *RenewerConfig) { c.SelfFenceAfter = 1500 * time.Millisecond }, want: "two renew intervals"},
		// 3 s + 1 s + 1.2 s (a fifth of 6 s) fits; 4 s does not.
		{name: "self-fence too close to the fencing period", change: func(c *RenewerConfig) { c.SelfFenceAfter = 4 * time.Second }, want: "exceeds the fencing period"},
		{name: "margin too large", change: func(c *RenewerConfig) { c.SelfFenceMargin = 2100 * time.Millisecond }, want: "exceeds the fencing period"},
		{name: "negative", change: func(c *RenewerConfig) { c.RenewInterval = -time.Second }, want: "negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := ok
			tc.change(&c)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Validate() = %v, want an error about %q", err, tc.want)
			}
		})
	}
}

// TestRenewerWritesFencedVolumes: each renewal writes the count the node
// gives into the Lease; a count it cannot tell leaves the last one.
func TestRenewerWritesFencedVolumes(t *testing.T) {
	var count atomic.Int64
	count.Store(2)
	cfg := testRenewerConfig()
	cfg.FencedVolumes = func(context.Context) int { return int(count.Load()) }
	f := newRenewerFixture(t, cfg)
	f.run()
	eventually(t, "the Lease created", f.renewedAt(testNow))
	fencedIs := func(want string) {
		t.Helper()
		if got, ok := f.lease().Annotations[FencedVolumesAnnotation]; !ok || got != want {
			t.Errorf("%s = %q (set: %v), want %q", FencedVolumesAnnotation, got, ok, want)
		}
	}
	fencedIs("2")
	count.Store(0)
	f.step(time.Second)
	fencedIs("0")
	count.Store(-1)
	f.step(time.Second)
	eventually(t, "renewed on the tick", f.renewedAt(f.clk.Now()))
	fencedIs("0")
	if got := fencedOf(f.lease()); got != 0 {
		t.Errorf("fencedOf = %d, want 0", got)
	}
}
