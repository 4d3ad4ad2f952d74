package controller

import (
	"google.golang.org/grpc/codes"

	"github.com/loopvol/loopvol/pkg/pool"
	"github.com/loopvol/loopvol/pkg/volspec"
)

// The errors of this package are of the kinds of pkg/volspec (volspec.Errorf)
// or wrap pkg/pool's sentinels; invalid and outOfRange are the two kinds
// its validation gives most.

func invalid(format string, args ...any) error {
	return volspec.Errorf(volspec.ErrInvalid, format, args...)
}

func outOfRange(format string, args ...any) error {
	return volspec.Errorf(volspec.ErrOutOfRange, format, args...)
}

// poolCodes are the codes of pkg/pool's sentinels, tested after the kinds:
// a kind given on purpose (an unknown node is NOT_FOUND even though pkg/pool
// said ErrInvalidID) wins over a sentinel wrapped in its message.
var poolCodes = []volspec.Sentinels{
	{Code: codes.NotFound, Errs: []error{pool.ErrInvalidID, pool.ErrNotFound, pool.ErrGuest}},
	{Code: codes.AlreadyExists, Errs: []error{pool.ErrExists}},
	{Code: codes.FailedPrecondition, Errs: []error{pool.ErrInUse, pool.ErrNeedsCopy}},
	{Code: codes.ResourceExhausted, Errs: []error{pool.ErrNoSpace}},
	{Code: codes.Aborted, Errs: []error{pool.ErrBusy}},
}

// toStatus is where errors become gRPC status codes: every RPC's answer
// passes through it (rpc.go), nothing else builds a status.
func toStatus(err error) error { return volspec.Status(err, poolCodes...) }
