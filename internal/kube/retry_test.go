package kube

import (
	"context"
	"errors"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// TestRetryStale: a retriable failure reads the object again and writes
// that copy once, a second failure or one not retriable is returned, and
// a failed read is joined to the write's error.
func TestRetryStale(t *testing.T) {
	gr := schema.GroupResource{Resource: "things"}
	conflict := apierrors.NewConflict(gr, "x", errors.New("stale"))
	for _, tc := range []struct {
		name      string
		fails     []error // of the writes, in order
		readErr   error
		want      []string // the copies written
		wantErr   error
		wantReads int
	}{
		{name: "success → one write", want: []string{"cached"}},
		{name: "conflict → read, one more write", fails: []error{conflict}, want: []string{"cached", "live"}, wantReads: 1},
		{name: "two conflicts → the second returned", fails: []error{conflict, conflict}, want: []string{"cached", "live"}, wantReads: 1, wantErr: conflict},
		{name: "not retriable → returned at once", fails: []error{errors.New("denied")}, want: []string{"cached"}, wantErr: errors.New("denied")},
		{name: "the read fails → both errors", fails: []error{conflict}, readErr: errors.New("gone away"), want: []string{"cached"}, wantReads: 1, wantErr: conflict},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var written []string
			reads := 0
			err := RetryStale(context.Background(), "cached", apierrors.IsConflict, func(context.Context) (string, error) {
				reads++
				return "live", tc.readErr
			}, func(_ context.Context, obj string) error {
				written = append(written, obj)
				if i := len(written) - 1; i < len(tc.fails) {
					return tc.fails[i]
				}
				return nil
			})
			switch {
			case tc.wantErr == nil && err != nil:
				t.Fatalf("RetryStale: %v", err)
			case tc.wantErr != nil && (err == nil || !errors.Is(err, tc.fails[len(written)-1])):
				t.Fatalf("RetryStale = %v, want %v", err, tc.wantErr)
			}
			if tc.readErr != nil && !errors.Is(err, tc.readErr) {
				t.Errorf("RetryStale = %v, want the read's error in it too", err)
			}
			if reads != tc.wantReads || len(written) != len(tc.want) || written[len(written)-1] != tc.want[len(tc.want)-1] {
				t.Errorf("wrote %v after %d reads, want %v after %d", written, reads, tc.want, tc.wantReads)
			}
		})
	}
}
