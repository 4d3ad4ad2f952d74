package e2e

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/loopvol/loopvol/pkg/heartbeat"
)

// The heartbeat test's periods: short, so that the test takes seconds.
const (
	hbRenewInterval  = 200 * time.Millisecond
	hbFencingPeriod  = 2 * time.Second
	hbSelfFenceAfter = time.Second
	// hbOutage is how long kube-apiserver stays away: longer than the
	// fencing period, so that a countdown that did not restart would
	// make the node stale.
	hbOutage = 3 * hbFencingPeriod
)

// hbLog records what the callbacks were told, with when.
type hbLog struct {
	mu      sync.Mutex
	entries []hbEntry
}

type hbEntry struct {
	what string // "lost", "regained", or an Event type and node
	at   time.Time
}

func (l *hbLog) add(what string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.entries = append(l.entries, hbEntry{what: what, at: time.Now()})
}

// since returns what was recorded at or after t, in order.
func (l *hbLog) since(t time.Time) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, e := range l.entries {
		if !e.at.Before(t) {
			out = append(out, e.what)
		}
	}
	return out
}

// first returns when what was first recorded at or after t.
func (l *hbLog) first(what string, t time.Time) (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range l.entries {
		if e.what == what && !e.at.Before(t) {
			return e.at, true
		}
	}
	return time.Time{}, false
}

// TestHeartbeat runs a Renewer and an Observer on the real API server:
// the node is fresh while it renews; stale about a fencing period after
// its Renewer stopped; back once it renews again (with a new
// incarnation); and through a kube-apiserver outage three fencing periods
// long the Renewer loses its heartbeat and regains it while the Observer
// never calls the node stale.
func TestHeartbeat(t *testing.T) {
	env := cluster.Env(t)
	ns := env.Namespace(t)
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.Verbosity(2)))
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logger))
	// Cleanups run last first: the goroutines are told to stop, then
	// waited for.
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait)
	t.Cleanup(cancel)
	rc := rest.CopyConfig(env.Config)
	rc.QPS, rc.Burst = 100, 200
	// The Renewer and the Observer have clients of their own, as they
	// would in two processes.
	renewerClient, err := heartbeat.NewClient(rc)
	if err != nil {
		t.Fatal(err)
	}
	observerClient, err := heartbeat.NewClient(rc)
	if err != nil {
		t.Fatal(err)
	}
	node := "e2e-hb-" + shortID()
	name := heartbeat.LeaseName(driverName, node)
	t.Cleanup(func() {
		err := env.Client.CoordinationV1().Leases(ns).Delete(context.Background(), name, metav1.DeleteOptions{})
		if err != nil {
			t.Logf("delete the heartbeat Lease %s/%s: %v", ns, name, err)
		}
	})

	var log hbLog
	obs, err := heartbeat.NewObserver(heartbeat.ObserverConfig{
		Client: observerClient, Namespace: ns, DriverName: driverName,
		FencingPeriod: hbFencingPeriod, ProbeInterval: hbRenewInterval,
		OnChange: func(_ context.Context, ev heartbeat.Event) { log.add(string(ev.Type) + " " + ev.Node.NodeID) },
	})
	if err != nil {
		t.Fatal(err)
	}
	wg.Go(func() {
		if err := obs.Run(ctx); err != nil {
			t.Errorf("Observer: %v", err)
		}
	})

	// startRenewer starts a node plugin's Renewer; stop ends it.
	startRenewer := func() (r *heartbeat.Renewer, incarnation time.Time, stop func()) {
		incarnation = time.Now()
		r, err := heartbeat.NewRenewer(heartbeat.RenewerConfig{
			Client: renewerClient, Namespace: ns, DriverName: driverName, NodeID: node, Incarnation: incarnation,
			RenewInterval: hbRenewInterval, FencingPeriod: hbFencingPeriod, SelfFenceAfter: hbSelfFenceAfter,
			OnLost:     func(context.Context) { log.add("lost") },
			OnRegained: func(context.Context) { log.add("regained") },
		})
		if err != nil {
			t.Fatal(err)
		}
		rctx, rcancel := context.WithCancel(ctx)
		done := make(chan struct{})
		wg.Go(func() {
			defer close(done)
			if err := r.Run(rctx); err != nil {
				t.Errorf("Renewer: %v", err)
			}
		})
		return r, incarnation, func() { rcancel(); <-done }
	}
	waitFor := func(what string, limit time.Duration, cond func() bool) time.Duration {
		t.Helper()
		start := time.Now()
		err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, limit, true, func(context.Context) (bool, error) { return cond(), nil })
		if err != nil {
			t.Fatalf("%s: not within %s", what, limit)
		}
		return time.Since(start)
	}
	isStale := func() bool {
		return slices.ContainsFunc(obs.Stale(), func(s heartbeat.NodeState) bool { return s.NodeID == node })
	}

	// Fresh while renewing.
	_, inc1, stop := startRenewer()
	took := waitFor("the node fresh", shortWait, func() bool { return obs.Healthy() == nil && obs.Fresh(node) })
	t.Logf("Observer healthy and the node fresh %s after the start", took.Round(time.Millisecond))
	if s, _ := obs.Node(node); !s.Incarnation.Equal(inc1.Truncate(0)) {
		t.Errorf("the Observer's incarnation %s, want the Renewer's %s", s.Incarnation, inc1)
	}
	watched := time.Now()
	for time.Since(watched) < 3*hbFencingPeriod {
		if !obs.Fresh(node) {
			t.Fatalf("the node was not fresh %s into renewing", time.Since(watched).Round(time.Millisecond))
		}
		time.Sleep(50 * time.Millisecond)
	}

	// Stopped: stale after about the fencing period.
	stop()
	stopped := time.Now()
	took = waitFor("the node stale after its Renewer stopped", shortWait, isStale)
	t.Logf("Node stale %s after its Renewer stopped (fencing period %s)", took.Round(time.Millisecond), hbFencingPeriod)
	if got := log.since(stopped); !slices.Equal(got, []string{"Stale " + node}) {
		t.Errorf("after the stop: %v, want [Stale %s]", got, node)
	}

	// Restarted: back, with the new incarnation.
	restarted := time.Now()
	r, inc2, stop := startRenewer()
	t.Cleanup(stop)
	took = waitFor("the node back", shortWait, func() bool { return obs.Fresh(node) })
	t.Logf("Node back %s after its Renewer restarted", took.Round(time.Millisecond))
	if got := log.since(restarted); !slices.Equal(got, []string{"Back " + node}) {
		t.Errorf("after the restart: %v, want [Back %s]", got, node)
	}
	if s, _ := obs.Node(node); !s.Incarnation.Equal(inc2.Truncate(0)) {
		t.Errorf("the Observer's incarnation after the restart %s, want the new one %s", s.Incarnation, inc2)
	}
	waitFor("the Renewer renewing", shortWait, func() bool { return !r.LastRenewed().IsZero() && !r.Lost() })

	// kube-apiserver away for three fencing periods.
	outageStart := time.Now()
	restart, err := env.KillAPIServer()
	if err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	took = waitFor("OnLost while the API server is away", hbOutage, func() bool { return r.Lost() })
	t.Logf("Renewer lost its heartbeat %s after kube-apiserver was killed (self-fence after %s)", took.Round(time.Millisecond), hbSelfFenceAfter)
	for time.Since(killed) < hbOutage {
		if isStale() {
			t.Errorf("the node is stale %s into the outage", time.Since(killed).Round(time.Millisecond))
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The new kube-apiserver serves Leases before its /readyz passes
	// (when restart returns): the outage ends when it starts.
	restarting := time.Now()
	if err := restart(); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	t.Logf("kube-apiserver was away %s (ready %s after its restart began)", back.Sub(killed).Round(time.Millisecond), back.Sub(restarting).Round(time.Millisecond))
	took = waitFor("OnRegained after the API server returned", longWait, func() bool { return !r.Lost() })
	if at, ok := log.first("regained", outageStart); ok {
		t.Logf("Renewer regained its heartbeat %s after kube-apiserver's restart began", at.Sub(restarting).Round(time.Millisecond))
	}
	took = waitFor("the Observer healthy again", longWait, func() bool { return obs.Healthy() == nil })
	t.Logf("Observer healthy again %s after kube-apiserver served again", took.Round(time.Millisecond))
	// Watched for three more fencing periods: a countdown that had not
	// restarted at the return would have ended by now.
	for since := time.Now(); time.Since(since) < 3*hbFencingPeriod; time.Sleep(50 * time.Millisecond) {
		if isStale() {
			t.Fatalf("the renewing node is stale %s after kube-apiserver returned", time.Since(back).Round(time.Millisecond))
		}
	}
	if !obs.Fresh(node) {
		t.Error("the renewing node is not fresh after the outage")
	}
	got := log.since(outageStart)
	if !slices.Equal(got, []string{"lost", "regained"}) {
		t.Errorf("through the outage: %v, want [lost regained] and nothing of the Observer", got)
	}
	if at, ok := log.first("lost", outageStart); !ok || at.After(restarting) {
		t.Errorf("OnLost at %v, want it while the API server was away (until %v)", at, restarting)
	}
	if at, ok := log.first("regained", outageStart); !ok || at.Before(restarting) {
		t.Errorf("OnRegained at %v, want it after the API server was started again (%v)", at, restarting)
	}
}
