package csiclient

import (
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// IsFinal reports whether err is a final outcome of a CSI operation: the
// operation failed and is certainly not in progress in the driver, so
// calling again with the same arguments fails the same way until something
// else changes.
//
// Canceled, DeadlineExceeded, Unavailable, ResourceExhausted and Aborted are
// not final: the driver may still be working on the call (or on an earlier
// one for the same volume), so the caller must try again to learn the
// outcome. Errors that carry no gRPC status failed before a call reached the
// driver and are not final either. This is the classification of the
// upstream external-attacher. status.FromError sees through wrapped errors.
func IsFinal(err error) bool {
	if err == nil {
		return false
	}
	st, ok := status.FromError(err)
	if !ok {
		return false
	}
	switch st.Code() {
	case codes.Canceled, codes.DeadlineExceeded, codes.Unavailable,
		codes.ResourceExhausted, codes.Aborted:
		return false
	}
	return true
}

// Code returns the gRPC code of err and true, or codes.Unknown and false when
// err carries no gRPC status (for example a Kubernetes API error). A nil err
// is codes.OK.
func Code(err error) (codes.Code, bool) {
	st, ok := status.FromError(err)
	if !ok {
		return codes.Unknown, false
	}
	return st.Code(), true
}
