package volspec

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The kinds of failure the CSI services answer on purpose, one for each code
// of the CSI code map. A service makes an error of a kind with Errorf, or
// defines a narrower kind of its own with NewKind; Status gives it the
// kind's code.
var (
	// ErrInvalid: a bad or missing request field (INVALID_ARGUMENT).
	ErrInvalid = errors.New("invalid argument")
	// ErrNotFound: an unknown volume, snapshot, node or path (NOT_FOUND).
	ErrNotFound = errors.New("not found")
	// ErrExists: the same name with another spec, or a path taken by
	// something else (ALREADY_EXISTS).
	ErrExists = errors.New("exists with other properties")
	// ErrPrecondition: not possible in the volume's current state: not
	// attached here, still in use (FAILED_PRECONDITION).
	ErrPrecondition = errors.New("not possible in the current state")
	// ErrNoSpace: a pool too full, a node with too many attachments
	// (RESOURCE_EXHAUSTED).
	ErrNoSpace = errors.New("not enough space")
	// ErrOutOfRange: a size outside what is possible (OUT_OF_RANGE).
	ErrOutOfRange = errors.New("size out of range")
	// ErrBusy: another operation on the object is in progress; retry later
	// (ABORTED, which the sidecars treat as "still in progress").
	ErrBusy = errors.New("another operation is in progress")
)

// kinds are the kinds in the order Status tests them, with their codes.
var kinds = []struct {
	kind error
	code codes.Code
}{
	{ErrInvalid, codes.InvalidArgument},
	{ErrNotFound, codes.NotFound},
	{ErrExists, codes.AlreadyExists},
	{ErrPrecondition, codes.FailedPrecondition},
	{ErrNoSpace, codes.ResourceExhausted},
	{ErrOutOfRange, codes.OutOfRange},
	{ErrBusy, codes.Aborted},
}

// subKind is a narrower kind: errors.Is finds both it and its parent.
type subKind struct {
	parent error
	text   string
}

func (k *subKind) Error() string { return k.text }
func (k *subKind) Unwrap() error { return k.parent }

// NewKind returns a kind of failure narrower than parent (one of the kinds
// above, or a kind NewKind made), with text as its message: a sentinel its
// package can test for with errors.Is, which Status answers with parent's
// code.
func NewKind(parent error, text string) error {
	return &subKind{parent: parent, text: text}
}

// kindError is an error of a kind with a message of its own: errors.Is
// finds both the kind and any error wrapped in the message.
type kindError struct {
	kind error
	err  error
}

func (e *kindError) Error() string   { return e.err.Error() }
func (e *kindError) Unwrap() []error { return []error{e.kind, e.err} }

// Errorf returns an error of kind whose message is formatted as by
// fmt.Errorf, %w included; the kind does not appear in the message.
func Errorf(kind error, format string, args ...any) error {
	return &kindError{kind: kind, err: fmt.Errorf(format, args...)}
}

// Sentinels gives the sentinel errors of another package (pkg/pool's,
// pkg/loop's), which know nothing of gRPC, the code a service answers them
// with.
type Sentinels struct {
	Code codes.Code
	Errs []error
}

// Status is the one place where errors become gRPC statuses; a service
// passes every RPC's error through it at its edge. The status carries err's
// message and the code of the first that err is (errors.Is, through every
// wrap) of, in this order:
//
//  1. the kinds above, in the order they are declared (narrower kinds
//     count as their parent), so a kind given on purpose wins over a
//     sentinel wrapped in its message;
//  2. the sentinels, in the order given;
//  3. context.DeadlineExceeded and context.Canceled (DEADLINE_EXCEEDED,
//     CANCELLED);
//
// and INTERNAL when it is none of them. Status(nil) is nil.
func Status(err error, sentinels ...Sentinels) error {
	if err == nil {
		return nil
	}
	return status.Error(code(err, sentinels), err.Error())
}

func code(err error, sentinels []Sentinels) codes.Code {
	for _, k := range kinds {
		if errors.Is(err, k.kind) {
			return k.code
		}
	}
	for _, s := range sentinels {
		for _, e := range s.Errs {
			if errors.Is(err, e) {
				return s.Code
			}
		}
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return codes.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		return codes.Canceled
	}
	return codes.Internal
}
