package leasewatch

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordinationv1 "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"

	"github.com/loopvol/loopvol/internal/kube"
)

// Config is one replica's part in the election of the Lease
// Namespace/Name.
type Config struct {
	// Leases is the client of the Lease. Give the election a client of its
	// own, so that a busy controller's rate limit never delays a renewal.
	Leases coordinationv1.LeasesGetter
	// Namespace and Name name the Lease.
	Namespace, Name string
	// Identity tells this replica from the others: unique among them
	// (the host name and a random suffix, so two replicas on one host are
	// told apart).
	Identity string
	// LeaseDuration is how long the other replicas wait after the
	// leader's last renewal before they take the Lease over; RenewDeadline
	// how long the leader keeps trying to renew before it gives up;
	// RetryPeriod the pause between two attempts. client-go's
	// leaderelection.NewLeaderElector checks them.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// Labels are put on the Lease while this replica holds it.
	Labels map[string]string
	// Health, if not nil, watches the renewals for a health check
	// (Health.Add).
	Health *leaderelection.HealthzAdaptor
}

// Run runs run while this process holds the Lease cfg.Namespace/cfg.Name,
// waiting for it first (if ctx ends before, Run returns nil and run never
// runs); it returns once run has returned. On the end of ctx
// (a signal) run's context ends first and the Lease is released after run
// returned, so another replica takes over at once without a moment with two
// leaders; Run then returns run's error, or nil. Losing the Lease is an
// error, so that the caller exits and starts again from a clean state, as
// the upstream sidecars do. The Lease counts as lost as soon as its last
// renewal is a lease duration old (watchLease), and run's context carries
// that check for kube.StillLeading.
func Run(ctx context.Context, cfg Config, run func(context.Context) error) error {
	logger := klog.FromContext(ctx)
	ns, lockName, id := cfg.Namespace, cfg.Name, cfg.Identity
	lock := &renewClock{Interface: &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: ns, Name: lockName},
		Client:     cfg.Leases,
		LockConfig: resourcelock.ResourceLockConfig{Identity: id},
		Labels:     cfg.Labels,
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
		LeaseDuration:   cfg.LeaseDuration,
		RenewDeadline:   cfg.RenewDeadline,
		RetryPeriod:     cfg.RetryPeriod,
		ReleaseOnCancel: true,
		WatchDog:        cfg.Health,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(lctx context.Context) {
				defer close(ran)
				leading.Store(true)
				logger.Info("Became the leader; starting the controllers", "lease", klog.KRef(ns, lockName), "identity", id)
				// Stop on a signal, when the Lease is lost, or as soon as
				// it may be.
				rctx, rcancel := context.WithCancelCause(klog.NewContext(lctx, logger))
				check := lock.leaderCheck(cfg.LeaseDuration, ns+"/"+lockName)
				stop := context.AfterFunc(ctx, func() { rcancel(context.Canceled) })
				var watch sync.WaitGroup
				watch.Go(func() { watchLease(rctx, lock, cfg.LeaseDuration, check, rcancel) })
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
