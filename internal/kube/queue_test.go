package kube

import (
	"context"
	"errors"
	"testing"
	"time"

	"k8s.io/klog/v2/ktesting"
)

func TestQueueHandle(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	q := NewQueue[string]("test", time.Second, 5*time.Minute)
	defer q.ShutDown()
	var got []time.Duration
	for range 3 {
		got = append(got, q.Handle(ctx, "a", errors.New("transient"), false))
	}
	got = append(got, q.Handle(ctx, "a", errors.New("final"), true))
	got = append(got, q.Handle(ctx, "a", nil, false))
	got = append(got, q.Handle(ctx, "a", errors.New("final"), true))
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 32 * time.Second, 0, 32 * time.Second}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("delays = %v, want %v (doubling, the final-error floor, success forgets)", got, want)
		}
	}
}

// TestQueueProcessNext: an item waits while the driver is not ready, a
// failed sync is queued again with backoff, and a shut-down queue or an
// ended context stops the worker.
func TestQueueProcessNext(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	q := NewQueue[string]("test", time.Hour, time.Hour)
	ready := func(context.Context) error { return nil }
	var synced []string
	fail := errors.New("boom")
	sync := func(_ context.Context, key string) error {
		synced = append(synced, key)
		return fail
	}
	q.Q.Add("a")
	if !q.ProcessNext(ctx, ready, sync, func(error) bool { return false }) {
		t.Fatal("ProcessNext stopped with an item queued")
	}
	if len(synced) != 1 || q.Failures("a") != 1 || q.Q.Len() != 0 {
		t.Errorf("after a failed sync: synced %v, failures %d, queued %d; want one sync, one failure, nothing queued before the backoff", synced, q.Failures("a"), q.Q.Len())
	}

	// The driver goes away while a worker holds an item: the item goes
	// back to the queue, unsynced.
	q.Q.Add("b")
	cctx, cancel := context.WithCancel(ctx)
	calls := 0
	notReady := func(ctx context.Context) error {
		calls++
		if calls == 2 {
			cancel()
			return ctx.Err()
		}
		return nil
	}
	if q.ProcessNext(cctx, notReady, sync, func(error) bool { return false }) {
		t.Error("ProcessNext went on after its context ended")
	}
	if len(synced) != 1 || q.Q.Len() != 1 {
		t.Errorf("item held when the driver went away: synced %v, queued %d; want it back in the queue", synced, q.Q.Len())
	}
	q.ShutDown()
	for q.ProcessNext(ctx, ready, func(context.Context, string) error { return nil }, func(error) bool { return false }) {
	}
}

// TestQueueProcessNextBusy: a sync that found its key held by another
// worker (ErrBusy) leaves the key's backoff and the queue alone.
func TestQueueProcessNextBusy(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	q := NewQueue[string]("test", time.Hour, time.Hour)
	t.Cleanup(q.ShutDown)
	ready := func(context.Context) error { return nil }
	q.Handle(ctx, "a", errors.New("boom"), false) // one failure, waiting an hour
	q.Q.Add("a")
	busy := func(context.Context, string) error { return ErrBusy }
	if !q.ProcessNext(ctx, ready, busy, func(error) bool { return false }) {
		t.Fatal("ProcessNext stopped")
	}
	if q.Failures("a") != 1 || q.Failing() != 1 || q.Q.Len() != 0 {
		t.Errorf("after a busy sync: failures %d, failing %d, queued %d; want 1, 1, 0", q.Failures("a"), q.Failing(), q.Q.Len())
	}
}
