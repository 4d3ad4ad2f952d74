package cluster

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestHostLockWaitsForTheHolder: a second lockHost waits while the first
// holds the lock, says once who holds it, gives up when its context ends,
// and gets the lock once the first releases it.
func TestHostLockWaitsForTheHolder(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lock")
	var said []string
	say := func(f string, args ...any) { said = append(said, fmt.Sprintf(f, args...)) }
	first, err := lockHost(context.Background(), path, false, say)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(first.release)

	ctx, cancel := context.WithTimeout(context.Background(), 1200*time.Millisecond)
	defer cancel()
	if _, err := lockHost(ctx, path, false, say); !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "held by pid") {
		t.Fatalf("second lock while the first is held: %v, want a deadline error naming the holder", err)
	}
	if len(said) != 1 || !strings.Contains(said[0], "waiting for another cluster") {
		t.Fatalf("said %q, want one waiting message", said)
	}

	got := make(chan error, 1)
	go func() {
		l, err := lockHost(context.Background(), path, false, func(string, ...any) {})
		if err == nil {
			l.release()
		}
		got <- err
	}()
	first.release()
	first.release() // idempotent
	if err := <-got; err != nil {
		t.Fatalf("lock after the release: %v", err)
	}
	var none *hostLock
	none.release()
}

// TestSharedHostLock: clusters share DirsLockPath's kind of lock without
// waiting; the one that goes down while another holds it is not alone (and
// leaves the shared directories), the last one is; an exclusive taker
// waits for every sharer.
func TestSharedHostLock(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lock")
	quiet := func(string, ...any) {}
	a, err := lockHost(context.Background(), path, true, quiet)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.release)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	b, err := lockHost(ctx, path, true, quiet)
	if err != nil {
		t.Fatalf("second shared lock: %v", err)
	}
	t.Cleanup(b.release)

	short, cancelShort := context.WithTimeout(context.Background(), 600*time.Millisecond)
	defer cancelShort()
	if _, err := lockHost(short, path, false, quiet); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("exclusive lock while two share it: %v, want a deadline error", err)
	}
	if a.alone() {
		t.Fatal("alone() while another holder shares the lock")
	}
	a.release()
	if !b.alone() {
		t.Fatal("alone() false for the last holder")
	}
	var none *hostLock
	if none.alone() {
		t.Fatal("alone() on no lock")
	}
}

func TestClusterLockPath(t *testing.T) {
	if got := clusterLockPath(1); got != HostLockPath {
		t.Errorf("one node: %s", got)
	}
	if got := clusterLockPath(2); got != NodesLockPath {
		t.Errorf("two nodes: %s", got)
	}
}
