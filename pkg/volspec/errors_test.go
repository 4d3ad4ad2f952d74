package volspec

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Sentinels of a package below the services, as pkg/pool's.
var (
	errLowerBusy    = errors.New("lower: busy")
	errLowerMissing = errors.New("lower: missing")
)

var lowerCodes = []Sentinels{
	{Code: codes.NotFound, Errs: []error{errLowerMissing}},
	{Code: codes.Aborted, Errs: []error{errLowerBusy}},
}

func TestStatus(t *testing.T) {
	errNarrow := NewKind(ErrPrecondition, "volume is not staged")
	errNarrower := NewKind(errNarrow, "staging path is gone")
	for _, tc := range []struct {
		name string
		err  error
		want codes.Code
	}{
		{name: "invalid", err: Errorf(ErrInvalid, "name is required"), want: codes.InvalidArgument},
		{name: "not found", err: Errorf(ErrNotFound, "x"), want: codes.NotFound},
		{name: "exists", err: Errorf(ErrExists, "x"), want: codes.AlreadyExists},
		{name: "precondition", err: Errorf(ErrPrecondition, "x"), want: codes.FailedPrecondition},
		{name: "no space", err: Errorf(ErrNoSpace, "x"), want: codes.ResourceExhausted},
		{name: "out of range", err: Errorf(ErrOutOfRange, "x"), want: codes.OutOfRange},
		{name: "busy", err: Errorf(ErrBusy, "x"), want: codes.Aborted},
		{name: "a kind wins over a wrapped sentinel", err: Errorf(ErrPrecondition, "node: %w", errLowerMissing), want: codes.FailedPrecondition},
		{name: "kinds in their order: invalid before not found", err: Errorf(ErrNotFound, "path: %w", Errorf(ErrInvalid, "a symbolic link")), want: codes.InvalidArgument},
		{name: "narrower kind has its parent's code", err: Errorf(errNarrow, "volume v"), want: codes.FailedPrecondition},
		{name: "narrower kind, two levels, wrapped", err: fmt.Errorf("a: %w", errNarrower), want: codes.FailedPrecondition},
		{name: "sentinel, wrapped twice", err: fmt.Errorf("a: %w", fmt.Errorf("b: %w", errLowerBusy)), want: codes.Aborted},
		{name: "sentinels in the order given", err: errors.Join(errLowerBusy, errLowerMissing), want: codes.NotFound},
		{name: "sentinel before the context", err: fmt.Errorf("%w (%w)", errLowerBusy, context.DeadlineExceeded), want: codes.Aborted},
		{name: "deadline", err: fmt.Errorf("x: %w", context.DeadlineExceeded), want: codes.DeadlineExceeded},
		{name: "canceled", err: context.Canceled, want: codes.Canceled},
		{name: "anything else", err: errors.New("disk on fire"), want: codes.Internal},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Status(tc.err, lowerCodes...)
			if status.Code(got) != tc.want {
				t.Fatalf("Status(%v) = %v, want %v", tc.err, status.Code(got), tc.want)
			}
			if status.Convert(got).Message() != tc.err.Error() {
				t.Fatalf("message %q, want %q", status.Convert(got).Message(), tc.err.Error())
			}
		})
	}
	if Status(nil, lowerCodes...) != nil {
		t.Fatal("Status(nil) is not nil")
	}
	if got := Status(errLowerBusy); status.Code(got) != codes.Internal {
		t.Errorf("a sentinel nobody gave a code = %v, want Internal", status.Code(got))
	}
}

// TestErrorf: the message is the formatted one alone, and errors.Is finds
// the kind, a narrower kind's parent and what %w wrapped.
func TestErrorf(t *testing.T) {
	errNarrow := NewKind(ErrExists, "path is in use by something else")
	err := Errorf(errNarrow, "target %s: %w", "/t", errLowerBusy)
	if got, want := err.Error(), "target /t: lower: busy"; got != want {
		t.Errorf("message %q, want %q", got, want)
	}
	for _, target := range []error{errNarrow, ErrExists, errLowerBusy} {
		if !errors.Is(err, target) {
			t.Errorf("errors.Is(%v, %v) = false", err, target)
		}
	}
	if errors.Is(err, ErrInvalid) {
		t.Errorf("errors.Is(%v, ErrInvalid) = true", err)
	}
	if got := fmt.Errorf("x: %w", errNarrow).Error(); got != "x: path is in use by something else" {
		t.Errorf("a narrower kind wrapped reads %q; its text alone should show", got)
	}
}
