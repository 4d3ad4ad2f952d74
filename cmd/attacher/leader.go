package main

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/uuid"
	coordinationv1 "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"

	"github.com/loopvol/loopvol/internal/kube"
)

// leaderHealthTimeout is how long past a missed lease renewal
// /healthz/leader-election still reports healthy (upstream's value).
const leaderHealthTimeout = 20 * time.Second

// leaderConfig is one replica's part in the election of the Lease
// namespace/name.
type leaderConfig struct {
	leases        coordinationv1.LeasesGetter
	namespace     string
	name          string
	identity      string
	leaseDuration time.Duration
	renewDeadline time.Duration
	retryPeriod   time.Duration
	labels        map[string]string              // put on the Lease while this replica holds it
	health        *leaderelection.HealthzAdaptor // may be nil
}

// newLeaderConfig makes the election config of this process from the flags:
// the Lease in --leader-election-namespace, else $POD_NAMESPACE, else
// "default"; an identity that is the host name plus a random suffix, so two
// replicas on one host (as in tests) are told apart; and its own client, so
// a busy controller's rate limit never delays a renewal.
func newLeaderConfig(cfg *config, rc *rest.Config, name string, health *leaderelection.HealthzAdaptor) (leaderConfig, error) {
	lec := rest.CopyConfig(rc)
	lec.RateLimiter = nil // its own limiter, from QPS and Burst
	leases, err := coordinationv1.NewForConfig(lec)
	if err != nil {
		return leaderConfig{}, fmt.Errorf("create the leader-election client: %w", err)
	}
	host, err := os.Hostname()
	if err != nil {
		return leaderConfig{}, fmt.Errorf("leader-election identity: %w", err)
	}
	ns := cfg.leaderElectionNamespace
	if ns == "" {
		ns = os.Getenv("POD_NAMESPACE")
	}
	if ns == "" {
		ns = metav1.NamespaceDefault
	}
	return leaderConfig{
		leases:        leases,
		namespace:     ns,
		name:          name,
		identity:      host + "_" + string(uuid.NewUUID()),
		leaseDuration: cfg.leaderElectionLeaseDuration,
		renewDeadline: cfg.leaderElectionRenewDeadline,
		retryPeriod:   cfg.leaderElectionRetryPeriod,
		labels:        cfg.compat.leaderElectionLabels,
		health:        health,
	}, nil
}

// renewClock is a Lease lock that remembers when this replica last took
// or renewed the Lease: the moment before a write of the Lease that
// succeeded. Another replica can take the Lease over only a lease duration
// after it saw that write, which was after this moment, so until this
// moment plus the lease duration nobody else leads.
type renewClock struct {
	resourcelock.Interface
	mu   sync.Mutex
	last time.Time
}

func (r *renewClock) Create(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	return r.track(ler, func() error { return r.Interface.Create(ctx, ler) })
}

func (r *renewClock) Update(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	return r.track(ler, func() error { return r.Interface.Update(ctx, ler) })
}

func (r *renewClock) track(ler resourcelock.LeaderElectionRecord, write func() error) error {
	start := time.Now()
	err := write()
	if err == nil && ler.HolderIdentity == r.Identity() {
		r.mu.Lock()
		r.last = start
		r.mu.Unlock()
	}
	return err
}

// lastRenew is the moment before the last successful take or renewal (zero
// if none).
func (r *renewClock) lastRenew() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last
}

// leaderCheck returns the check of kube.WithLeaderCheck: an error once the
// last renewal is a lease duration old.
func (r *renewClock) leaderCheck(leaseDuration time.Duration, lease string) func() error {
	return func() error {
		if age := time.Since(r.lastRenew()); age >= leaseDuration {
			return fmt.Errorf("%w: Lease %s last renewed %s ago, lease duration %s", kube.ErrNotLeading, lease, age.Round(time.Millisecond), leaseDuration)
		}
		return nil
	}
}

// watchLease cancels stop as soon as check fails, so that the controllers
// stop the moment the Lease may be someone else's: client-go's elector
// gives up only after the renew deadline of failed renewals counted from
// when it runs again, and a process paused past the lease duration (SIGSTOP,
// a frozen VM) would otherwise wake up and act for that long beside the new
// leader. The controllers also call kube.StillLeading right before each
// action that cannot be undone, since on waking their goroutines may run
// before this one.
func watchLease(ctx context.Context, r *renewClock, leaseDuration time.Duration, check func() error, stop context.CancelCauseFunc) {
	logger := klog.FromContext(ctx)
	for {
		if err := check(); err != nil {
			logger.Error(err, "Stopping the controllers: the Lease was not renewed within the lease duration, so another replica may lead now")
			stop(err)
			return
		}
		t := time.NewTimer(time.Until(r.lastRenew().Add(leaseDuration)))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// runWithLeaderElection runs run while this process holds the Lease
// lockName. On a signal (ctx ends) the controllers stop first and the Lease
// is released after, so another replica takes over at once without a moment
// with two leaders. Losing the Lease is an error: the process exits and
// starts again from a clean state, as the upstream sidecars do. The Lease
// counts as lost as soon as its last renewal is a lease duration old (see
// watchLease), and the controllers' context carries that check for
// kube.StillLeading.
func runWithLeaderElection(ctx context.Context, le leaderConfig, run func(context.Context) error) error {
	logger := klog.FromContext(ctx)
	ns, lockName, id := le.namespace, le.name, le.identity
	lock := &renewClock{Interface: &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: ns, Name: lockName},
		Client:     le.leases,
		LockConfig: resourcelock.ResourceLockConfig{Identity: id},
		Labels:     le.labels,
	}}

	// leCtx is the election's; it ends after the controllers have stopped.
	leCtx, leCancel := context.WithCancel(context.WithoutCancel(ctx))
	defer leCancel()
	var (
		leading atomic.Bool
		runErr  error
		ran     = make(chan struct{})
	)
	elector, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		Name:            lockName,
		LeaseDuration:   le.leaseDuration,
		RenewDeadline:   le.renewDeadline,
		RetryPeriod:     le.retryPeriod,
		ReleaseOnCancel: true,
		WatchDog:        le.health,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(lctx context.Context) {
				defer close(ran)
				leading.Store(true)
				logger.Info("Became the leader; starting the controllers", "lease", klog.KRef(ns, lockName), "identity", id)
				// Stop on a signal, when the Lease is lost, or as soon as
				// it may be.
				rctx, rcancel := context.WithCancelCause(klog.NewContext(lctx, logger))
				check := lock.leaderCheck(le.leaseDuration, ns+"/"+lockName)
				stop := context.AfterFunc(ctx, func() { rcancel(context.Canceled) })
				var watch sync.WaitGroup
				watch.Go(func() { watchLease(rctx, lock, le.leaseDuration, check, rcancel) })
				runErr = run(kube.WithLeaderCheck(rctx, check))
				stop()
				rcancel(context.Canceled)
				watch.Wait()
				leCancel() // release the Lease only now
			},
			OnStoppedLeading: func() {
				logger.Info("Stopped leading", "lease", klog.KRef(ns, lockName), "identity", id)
			},
			OnNewLeader: func(leader string) {
				logger.Info("Leader elected", "lease", klog.KRef(ns, lockName), "leader", leader, "self", leader == id)
			},
		},
	})
	if err != nil {
		return fmt.Errorf("leader election: %w", err)
	}
	// A signal while still waiting for the Lease ends the election at once.
	stopWaiting := context.AfterFunc(ctx, func() {
		if !leading.Load() {
			leCancel()
		}
	})
	defer stopWaiting()

	logger.Info("Waiting to become the leader", "lease", klog.KRef(ns, lockName), "identity", id)
	elector.Run(leCtx)
	if leading.Load() {
		<-ran
	}
	switch {
	case runErr != nil:
		return runErr
	case ctx.Err() != nil:
		return nil
	case leading.Load():
		return fmt.Errorf("lost the leader-election Lease %s/%s", ns, lockName)
	}
	return nil
}
