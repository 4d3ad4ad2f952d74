package controller

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/loopvol/loopvol/pkg/pool"
	"github.com/loopvol/loopvol/pkg/volspec"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestToStatus(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want codes.Code
	}{
		{"invalid", invalid("name is required"), codes.InvalidArgument},
		{"invalid wrapping a pool error", invalid("parameter: %w", pool.ErrNoSpace), codes.InvalidArgument},
		{"kind wins over a wrapped sentinel", volspec.Errorf(volspec.ErrNotFound, "node: %w", pool.ErrInvalidID), codes.NotFound},
		{"exists", volspec.Errorf(volspec.ErrExists, "x"), codes.AlreadyExists},
		{"precondition", volspec.Errorf(volspec.ErrPrecondition, "x"), codes.FailedPrecondition},
		{"no space", volspec.Errorf(volspec.ErrNoSpace, "x"), codes.ResourceExhausted},
		{"out of range", outOfRange("x"), codes.OutOfRange},
		{"busy", volspec.Errorf(volspec.ErrBusy, "x"), codes.Aborted},
		{"pool busy, wrapped twice", fmt.Errorf("a: %w", fmt.Errorf("b: %w", pool.ErrBusy)), codes.Aborted},
		{"pool not found", fmt.Errorf("v: %w", pool.ErrNotFound), codes.NotFound},
		{"pool invalid ID", pool.ErrInvalidID, codes.NotFound},
		{"pool exists", pool.ErrExists, codes.AlreadyExists},
		{"pool in use", pool.ErrInUse, codes.FailedPrecondition},
		{"pool no space", pool.ErrNoSpace, codes.ResourceExhausted},
		{"deadline", fmt.Errorf("x: %w", context.DeadlineExceeded), codes.DeadlineExceeded},
		{"canceled", context.Canceled, codes.Canceled},
		{"anything else", errors.New("disk on fire"), codes.Internal},
		{"corrupt record", pool.ErrCorrupt, codes.Internal},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := toStatus(tc.err)
			if status.Code(got) != tc.want {
				t.Fatalf("toStatus(%v) = %v, want %v", tc.err, status.Code(got), tc.want)
			}
			if status.Convert(got).Message() != tc.err.Error() {
				t.Fatalf("message %q, want %q", status.Convert(got).Message(), tc.err.Error())
			}
		})
	}
	if toStatus(nil) != nil {
		t.Fatal("toStatus(nil) is not nil")
	}
}

// Every RPC answers through toStatus: no error of this package reaches a
// caller as UNKNOWN.
func TestNoUnknownCodes(t *testing.T) {
	f := newFixture(t, map[string]string{"p1": "z1"})
	c := ctx(t)
	_, err := f.s.CreateVolume(c, createReq("", 1<<20))
	wantCode(t, err, codes.InvalidArgument)
	_, err = f.s.ControllerExpandVolume(c, nil)
	wantCode(t, err, codes.InvalidArgument)
	_, err = f.s.ControllerPublishVolume(c, nil)
	wantCode(t, err, codes.InvalidArgument)
	_, err = f.s.ControllerGetVolume(c, nil)
	wantCode(t, err, codes.InvalidArgument)
	_, err = f.s.ListVolumes(c, nil)
	if err != nil {
		t.Fatal(err)
	}
}
