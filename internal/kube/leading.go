package kube

import (
	"context"
	"errors"
)

// ErrNotLeading is the error of StillLeading once this replica can no
// longer be sure that it holds its Lease.
var ErrNotLeading = errors.New("this replica may no longer hold its leader-election Lease")

type leaderCheckKey struct{}

// WithLeaderCheck returns a copy of ctx that carries check: it returns nil
// while the replica is sure it still leads, else an error wrapping
// ErrNotLeading. Leader election puts it into the context of the
// controllers it runs.
func WithLeaderCheck(ctx context.Context, check func() error) context.Context {
	return context.WithValue(ctx, leaderCheckKey{}, check)
}

// StillLeading returns ctx's error when ctx has ended, else the error of the
// leader check of ctx (nil without one: no leader election). Controllers
// call it right before every action that cannot be undone (a driver call,
// a status write): a replica that was paused past its Lease wakes with
// timers that have fired but whose goroutines may not have run yet, so the
// end of ctx alone comes too late.
func StillLeading(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if check, ok := ctx.Value(leaderCheckKey{}).(func() error); ok {
		return check()
	}
	return nil
}
