package controller

import (
	"context"
	"errors"
	"fmt"

	"github.com/loopvol/loopvol/pkg/pool"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Kinds of failure of this package besides pkg/pool's sentinels; toStatus
// maps each to one gRPC code.
var (
	errInvalid      = errors.New("invalid argument")
	errNotFound     = errors.New("not found")
	errExists       = errors.New("exists with other properties")
	errPrecondition = errors.New("not possible in the current state")
	errNoSpace      = errors.New("not enough space")
	errOutOfRange   = errors.New("size out of range")
	errBusy         = errors.New("another operation is in progress")
)

// kindError is an error of one of the kinds above with a message of its own:
// errors.Is finds both the kind and any error wrapped in the message.
type kindError struct {
	kind error
	err  error
}

func (e *kindError) Error() string   { return e.err.Error() }
func (e *kindError) Unwrap() []error { return []error{e.kind, e.err} }

// kindf returns an error of kind with a formatted message; %w works as in
// fmt.Errorf.
func kindf(kind error, format string, args ...any) error {
	return &kindError{kind: kind, err: fmt.Errorf(format, args...)}
}

func invalid(format string, args ...any) error { return kindf(errInvalid, format, args...) }

func outOfRange(format string, args ...any) error { return kindf(errOutOfRange, format, args...) }

// toStatus is the one place where errors become gRPC status codes: every
// RPC's answer passes through it (rpc.go), nothing else builds a status.
// The kinds of this package are tested first, so that a kind given on
// purpose (an unknown node is NOT_FOUND even though pkg/pool said
// ErrInvalidID) wins over a sentinel wrapped in its message.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	var code codes.Code
	switch {
	case errors.Is(err, errInvalid):
		code = codes.InvalidArgument
	case errors.Is(err, errNotFound):
		code = codes.NotFound
	case errors.Is(err, errExists):
		code = codes.AlreadyExists
	case errors.Is(err, errPrecondition):
		code = codes.FailedPrecondition
	case errors.Is(err, errNoSpace):
		code = codes.ResourceExhausted
	case errors.Is(err, errOutOfRange):
		code = codes.OutOfRange
	case errors.Is(err, errBusy):
		code = codes.Aborted
	case errors.Is(err, pool.ErrInvalidID), errors.Is(err, pool.ErrNotFound), errors.Is(err, pool.ErrGuest):
		code = codes.NotFound
	case errors.Is(err, pool.ErrExists):
		code = codes.AlreadyExists
	case errors.Is(err, pool.ErrInUse):
		code = codes.FailedPrecondition
	case errors.Is(err, pool.ErrNoSpace):
		code = codes.ResourceExhausted
	case errors.Is(err, pool.ErrBusy):
		code = codes.Aborted
	case errors.Is(err, context.DeadlineExceeded):
		code = codes.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		code = codes.Canceled
	default:
		code = codes.Internal
	}
	return status.Error(code, err.Error())
}
