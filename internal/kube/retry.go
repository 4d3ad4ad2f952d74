package kube

import (
	"context"
	"errors"
	"fmt"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
)

// onceMore is the backoff of RetryStale: two tries, the second at once.
// The second try works on a copy just read, so waiting would only make it
// staler; a failure of that one is left to the work queue's backoff.
var onceMore = wait.Backoff{Steps: 2}

// RetryStale writes obj with write and, when that fails with an error
// retriable accepts (nil: any error), reads the object again with read and
// writes that copy once more. It is the one "patch, GET, retry once" loop
// of the controllers. Their patches are built from a cached copy and carry
// a precondition (a resourceVersion, a JSON patch test op) that fails when
// the cache lags behind the API server; one more try on the live object
// then usually succeeds, and anything beyond it belongs to the queue's
// backoff, not to a hot loop.
//
// read returns the zero T (and no error) when the object is gone; write
// decides what that means (a removed finalizer is done, an entry to write
// needs a new object). write is handed each copy in turn and keeps what
// it needs of the outcome itself. The error is the last write's, or the
// first write's joined with read's when the read failed.
func RetryStale[T any](ctx context.Context, obj T, retriable func(error) bool,
	read func(context.Context) (T, error), write func(context.Context, T) error) error {
	if retriable == nil {
		retriable = func(error) bool { return true }
	}
	cur, tries := obj, 0
	var writeErr error
	return retry.OnError(onceMore, func(err error) bool { return !errors.Is(err, errReread) && retriable(err) }, func() error {
		if tries++; tries > 1 {
			live, err := read(ctx)
			if err != nil {
				return fmt.Errorf("%w (%w: %w)", writeErr, errReread, err)
			}
			cur = live
		}
		writeErr = write(ctx, cur)
		return writeErr
	})
}

// errReread marks the error of RetryStale's read of the live object.
var errReread = errors.New("and reading it again")
