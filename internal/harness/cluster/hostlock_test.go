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
	first, err := lockHost(context.Background(), path, say)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(first.release)

	ctx, cancel := context.WithTimeout(context.Background(), 1200*time.Millisecond)
	defer cancel()
	if _, err := lockHost(ctx, path, say); !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "held by pid") {
		t.Fatalf("second lock while the first is held: %v, want a deadline error naming the holder", err)
	}
	if len(said) != 1 || !strings.Contains(said[0], "waiting for another cluster") {
		t.Fatalf("said %q, want one waiting message", said)
	}

	got := make(chan error, 1)
	go func() {
		l, err := lockHost(context.Background(), path, func(string, ...any) {})
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
