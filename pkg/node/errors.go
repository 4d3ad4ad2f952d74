package node

import (
	"google.golang.org/grpc/codes"

	"github.com/loopvol/loopvol/pkg/loop"
	"github.com/loopvol/loopvol/pkg/pool"
	"github.com/loopvol/loopvol/pkg/volspec"
)

// Kinds of failure of this package, each narrower than a kind of
// pkg/volspec, whose code toStatus gives it.
var (
	errPathMissing = volspec.NewKind(volspec.ErrNotFound, "path does not exist")
	errNotAttached = volspec.NewKind(volspec.ErrPrecondition, "volume is not attached to this node")
	errNotStaged   = volspec.NewKind(volspec.ErrPrecondition, "volume is not staged on this node")
	errInUse       = volspec.NewKind(volspec.ErrPrecondition, "volume is in use")
	errConflict    = volspec.NewKind(volspec.ErrExists, "path is in use by something else")
	errUnusable    = volspec.NewKind(volspec.ErrPrecondition, "volume cannot be used as asked")
)

// sentinelCodes are the codes of the sentinels of pkg/pool and pkg/loop.
var sentinelCodes = []volspec.Sentinels{
	{Code: codes.NotFound, Errs: []error{pool.ErrInvalidID, pool.ErrNotFound}},
	// ErrNotOwned: a device of another node's plugin on this kernel, which
	// this node never changes (it finds only its own; the error means a
	// device changed hands between a lookup and the act).
	{Code: codes.FailedPrecondition, Errs: []error{loop.ErrBusy, loop.ErrNotAttached, loop.ErrNotOwned}},
	{Code: codes.Aborted, Errs: []error{pool.ErrBusy}},
	// A self-fenced node (selffence.go): retried, served once it renews.
	{Code: codes.Unavailable, Errs: []error{errSelfFenced}},
}

// toStatus is the one place where errors become gRPC status codes.
func toStatus(err error) error { return volspec.Status(err, sentinelCodes...) }
