package node

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/loopvol/loopvol/pkg/loop"
	"github.com/loopvol/loopvol/pkg/pool"
)

// Kinds of failure of this package; toStatus maps each to one gRPC code.
var (
	errInvalid     = errors.New("invalid argument")
	errPathMissing = errors.New("path does not exist")
	errNotAttached = errors.New("volume is not attached to this node")
	errNotStaged   = errors.New("volume is not staged on this node")
	errInUse       = errors.New("volume is in use")
	errConflict    = errors.New("path is in use by something else")
	errBusy        = errors.New("another operation on this volume is in progress")
	errOutOfRange  = errors.New("size out of range")
	errUnusable    = errors.New("volume cannot be used as asked")
)

// kindError is an error of one of the kinds above with a message of its own:
// errors.Is finds both the kind and any error wrapped in the message.
type kindError struct {
	kind error
	err  error
}

func (e *kindError) Error() string   { return e.err.Error() }
func (e *kindError) Unwrap() []error { return []error{e.kind, e.err} }

// kindf returns an error of kind with a formatted message; %w works as in fmt.Errorf.
func kindf(kind error, format string, args ...any) error {
	return &kindError{kind: kind, err: fmt.Errorf(format, args...)}
}

// toStatus is the one place where errors become gRPC status codes.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	var code codes.Code
	switch {
	case errors.Is(err, errInvalid), errors.Is(err, errNotOwn):
		code = codes.InvalidArgument
	case errors.Is(err, pool.ErrInvalidID), errors.Is(err, pool.ErrNotFound), errors.Is(err, errPathMissing):
		code = codes.NotFound
	case errors.Is(err, errConflict):
		code = codes.AlreadyExists
	case errors.Is(err, errNotAttached), errors.Is(err, errNotStaged), errors.Is(err, errInUse),
		errors.Is(err, errUnusable), errors.Is(err, loop.ErrBusy), errors.Is(err, loop.ErrNotAttached):
		code = codes.FailedPrecondition
	case errors.Is(err, errBusy), errors.Is(err, pool.ErrBusy):
		code = codes.Aborted
	case errors.Is(err, errOutOfRange):
		code = codes.OutOfRange
	case errors.Is(err, context.DeadlineExceeded):
		code = codes.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		code = codes.Canceled
	default:
		code = codes.Internal
	}
	return status.Error(code, err.Error())
}
