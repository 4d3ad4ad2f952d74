package kube

import (
	"errors"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestClaimMetricsFailed: a failure is counted under its gRPC code, one
// without a code under NoCode; both counters are registered.
func TestClaimMetricsFailed(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewClaimMetrics(reg, ClaimMetricNames{Done: "ops_total", DoneHelp: "ops", Errors: "op_errors_total", Attempts: "Failed attempts"})
	if err != nil {
		t.Fatal(err)
	}
	if code, ok := m.Failed(status.Error(codes.OutOfRange, "too big")); !ok || code != codes.OutOfRange {
		t.Errorf("Failed(OUT_OF_RANGE) = %v, %v", code, ok)
	}
	if _, ok := m.Failed(errors.New("no secret")); ok {
		t.Error("Failed of an error without a status reported a code")
	}
	m.Done.Inc()
	if got := testutil.ToFloat64(m.Errors.WithLabelValues("OutOfRange")); got != 1 {
		t.Errorf("OutOfRange count %v, want 1", got)
	}
	if got := testutil.ToFloat64(m.Errors.WithLabelValues(NoCode)); got != 1 {
		t.Errorf("%s count %v, want 1", NoCode, got)
	}
	want := `
# HELP op_errors_total Failed attempts by gRPC code (None: failed before the driver answered, e.g. a missing Secret).
# TYPE op_errors_total counter
op_errors_total{grpc_status_code="None"} 1
op_errors_total{grpc_status_code="OutOfRange"} 1
# HELP ops_total ops
# TYPE ops_total counter
ops_total 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
	if _, err := NewClaimMetrics(reg, ClaimMetricNames{Done: "ops_total", DoneHelp: "ops", Errors: "other_total", Attempts: "x"}); err == nil {
		t.Error("registering a name twice did not fail")
	}
}
