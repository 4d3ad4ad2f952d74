package leasewatch

import (
	"context"
	"errors"
	"testing"
	"time"

	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2/ktesting"

	"github.com/loopvol/loopvol/internal/kube"
)

// fakeLock is a Lease lock whose writes fail while fail is set.
type fakeLock struct {
	resourcelock.Interface // nil: only the methods below are called
	id                     string
	fail                   bool
}

func (f *fakeLock) Identity() string { return f.id }
func (f *fakeLock) Create(context.Context, resourcelock.LeaderElectionRecord) error {
	return f.err()
}
func (f *fakeLock) Update(context.Context, resourcelock.LeaderElectionRecord) error {
	return f.err()
}
func (f *fakeLock) err() error {
	if f.fail {
		return errors.New("the API server is away")
	}
	return nil
}

// TestRenewClock: only this replica's successful writes count as renewals.
func TestRenewClock(t *testing.T) {
	ctx := context.Background()
	inner := &fakeLock{id: "me"}
	r := &renewClock{Interface: inner}
	if !r.lastRenew().IsZero() {
		t.Fatal("renewed before any write")
	}
	before := time.Now()
	if err := r.Create(ctx, resourcelock.LeaderElectionRecord{HolderIdentity: "me"}); err != nil {
		t.Fatal(err)
	}
	first := r.lastRenew()
	if first.Before(before) {
		t.Fatalf("lastRenew %v is before the write began %v", first, before)
	}
	inner.fail = true
	_ = r.Update(ctx, resourcelock.LeaderElectionRecord{HolderIdentity: "me"})
	inner.fail = false
	_ = r.Update(ctx, resourcelock.LeaderElectionRecord{HolderIdentity: ""}) // a release
	if got := r.lastRenew(); !got.Equal(first) {
		t.Errorf("a failed renewal or a release moved lastRenew from %v to %v", first, got)
	}
	check := r.leaderCheck(time.Hour, "ns/lease")
	if err := check(); err != nil {
		t.Errorf("check right after a renewal: %v", err)
	}
	if err := r.leaderCheck(0, "ns/lease")(); !errors.Is(err, kube.ErrNotLeading) {
		t.Errorf("check past the lease duration = %v, want ErrNotLeading", err)
	}
}

// TestWatchLeaseStopsWithoutRenewal: the controllers' context ends once the
// last renewal is a lease duration old, although nobody told the elector.
func TestWatchLeaseStopsWithoutRenewal(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	r := &renewClock{Interface: &fakeLock{id: "me"}}
	if err := r.Update(ctx, resourcelock.LeaderElectionRecord{HolderIdentity: "me"}); err != nil {
		t.Fatal(err)
	}
	const lease = 300 * time.Millisecond
	check := r.leaderCheck(lease, "ns/lease")
	rctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	done := make(chan struct{})
	go func() {
		defer close(done)
		watchLease(rctx, r, lease, check, cancel)
	}()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("watchLease did not stop the controllers")
	}
	if err := context.Cause(rctx); !errors.Is(err, kube.ErrNotLeading) {
		t.Errorf("cause %v, want ErrNotLeading", err)
	}
	if since := time.Since(r.lastRenew()); since < lease {
		t.Errorf("stopped %s after the renewal, before the lease duration %s", since, lease)
	}
	if err := kube.StillLeading(kube.WithLeaderCheck(context.Background(), check)); !errors.Is(err, kube.ErrNotLeading) {
		t.Errorf("StillLeading = %v, want ErrNotLeading", err)
	}
}
