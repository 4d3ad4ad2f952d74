package controller

import (
	"context"
	"errors"

	"github.com/loopvol/loopvol/pkg/pool"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// toStatus maps an error from pkg/pool (or one of ours) to the gRPC status
// the CSI spec asks for. Errors that already are statuses pass through.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	code := codes.Internal
	switch {
	case errors.Is(err, pool.ErrInvalidID), errors.Is(err, pool.ErrNotFound):
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
	}
	return status.Error(code, err.Error())
}

func invalid(format string, args ...any) error {
	return status.Errorf(codes.InvalidArgument, format, args...)
}
