package kube

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/klog/v2/ktesting"
)

func TestIsUnreachable(t *testing.T) {
	refused := &url.Error{Op: "Get", URL: "https://127.0.0.1:6443", Err: &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}}
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{name: "nil", err: nil, want: false},
		{name: "connection refused", err: refused, want: true},
		{name: "wrapped connection refused", err: fmt.Errorf("patch: %w", refused), want: true},
		{name: "connection reset", err: errors.New("read tcp: connection reset by peer"), want: true},
		{name: "API status", err: apierrors.NewNotFound(schema.GroupResource{Resource: "volumeattachments"}, "va1"), want: false},
		{name: "conflict", err: apierrors.NewConflict(schema.GroupResource{Resource: "volumeattachments"}, "va1", errors.New("x")), want: false},
		{name: "gRPC error of a driver", err: fmt.Errorf("publish: %w", status.Error(codes.Unavailable, "connection refused")), want: false},
		{name: "caller's context ended", err: fmt.Errorf("get: %w", context.Canceled), want: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := IsUnreachable(tc.err); got != tc.want {
				t.Errorf("IsUnreachable(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}

// TestAPIHealth: an unreachable request marks the server down; workers wait
// in WaitUp; the probe notices the return, WaitUp returns and the recovery
// funcs run.
func TestAPIHealth(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	var back atomic.Bool
	h := NewAPIHealth(nil, func(context.Context) error {
		if back.Load() {
			return nil
		}
		return errors.New("connection refused")
	}, 10*time.Millisecond)
	recovered := make(chan struct{}, 1)
	h.OnRecovered(func() { recovered <- struct{}{} })
	go h.Run(ctx)

	if err := h.WaitUp(ctx); err != nil || !h.Up() {
		t.Fatalf("a new APIHealth is not up: %v", err)
	}
	h.Observe(apierrors.NewNotFound(schema.GroupResource{Resource: "x"}, "y"))
	if !h.Up() {
		t.Fatal("an API error marked the server down")
	}
	h.Observe(&url.Error{Op: "Get", URL: "https://x", Err: syscall.ECONNREFUSED})
	if h.Up() || h.Healthy() == nil {
		t.Fatal("a refused connection did not mark the server down")
	}
	waited := make(chan error, 1)
	go func() { waited <- h.WaitUp(ctx) }()
	select {
	case err := <-waited:
		t.Fatalf("WaitUp returned (%v) while the server is down", err)
	case <-time.After(50 * time.Millisecond): // several probes fail meanwhile
	}
	back.Store(true)
	select {
	case err := <-waited:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		t.Fatal("WaitUp did not return after the server came back")
	}
	select {
	case <-recovered:
	case <-time.After(time.Minute):
		t.Fatal("the recovery func did not run")
	}
	var nilHealth *APIHealth
	if !nilHealth.Up() || nilHealth.WaitUp(ctx) != nil {
		t.Error("a nil APIHealth is not always up")
	}
}

// TestQueueResetBackoff: keys whose last sync failed are queued at once
// and their backoff forgotten; a success takes a key off the list.
func TestQueueResetBackoff(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	q := NewQueue[string]("test", time.Hour, 2*time.Hour)
	t.Cleanup(q.ShutDown)
	boom := errors.New("boom")
	for _, k := range []string{"a", "b", "c"} {
		q.Handle(ctx, k, boom, false)
	}
	q.Handle(ctx, "c", nil, false)
	if got := q.Failing(); got != 2 {
		t.Fatalf("Failing = %d, want 2", got)
	}
	if q.Q.Len() != 0 {
		t.Fatalf("queue length %d before the reset, want 0 (all wait an hour)", q.Q.Len())
	}
	if got := q.ResetBackoff(); got != 2 {
		t.Fatalf("ResetBackoff = %d, want 2", got)
	}
	if q.Q.Len() != 2 || q.Failures("a") != 0 || q.Failures("b") != 0 {
		t.Errorf("after the reset: length %d, failures a=%d b=%d; want 2, 0, 0", q.Q.Len(), q.Failures("a"), q.Failures("b"))
	}
	q.Drop("a")
	if got := q.Failing(); got != 1 {
		t.Errorf("Failing after Drop = %d, want 1", got)
	}
}

func TestStillLeading(t *testing.T) {
	ctx := context.Background()
	if err := StillLeading(ctx); err != nil {
		t.Errorf("without a check: %v", err)
	}
	lost := fmt.Errorf("%w: renewed long ago", ErrNotLeading)
	if err := StillLeading(WithLeaderCheck(ctx, func() error { return lost })); !errors.Is(err, ErrNotLeading) {
		t.Errorf("with a failing check: %v", err)
	}
	cctx, cancel := context.WithCancel(WithLeaderCheck(ctx, func() error { return nil }))
	cancel()
	if err := StillLeading(cctx); !errors.Is(err, context.Canceled) {
		t.Errorf("after the context ended: %v", err)
	}
}

// TestGateAndObserving: Observing marks the server down on an unanswered
// request only; Gate runs its first wait and then blocks while the server
// is down.
func TestGateAndObserving(t *testing.T) {
	h := NewAPIHealth(nil, func(context.Context) error { return errors.New("still down") }, time.Hour)
	unreachable := &url.Error{Op: "Get", URL: "https://127.0.0.1:6443", Err: syscall.ECONNREFUSED}
	sync := Observing(h, func(_ context.Context, err error) error { return err })
	_ = sync(context.Background(), apierrors.NewNotFound(schema.GroupResource{Resource: "pods"}, "x"))
	if !h.Up() {
		t.Fatal("an API error marked the server down")
	}
	_ = sync(context.Background(), unreachable)
	if h.Up() {
		t.Fatal("an unanswered request did not mark the server down")
	}
	firstRan := false
	gate := h.Gate(func(context.Context) error { firstRan = true; return nil })
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := gate(ctx); !errors.Is(err, context.DeadlineExceeded) || !firstRan {
		t.Fatalf("gate while down: %v (first ran: %v), want to wait until the deadline", err, firstRan)
	}
	h.Observe(nil)
	if err := h.Gate(nil)(context.Background()); err != nil {
		t.Fatalf("gate while up: %v", err)
	}
	stop := errors.New("driver away")
	if err := h.Gate(func(context.Context) error { return stop })(context.Background()); !errors.Is(err, stop) {
		t.Fatalf("gate with a failing first wait: %v", err)
	}
}
