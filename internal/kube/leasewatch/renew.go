package leasewatch

import (
	"context"
	"fmt"
	"sync"
	"time"

	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"

	"github.com/loopvol/loopvol/internal/kube"
)

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
