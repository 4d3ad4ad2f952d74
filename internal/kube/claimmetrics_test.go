package kube

import (
	"errors"
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
	m, err := NewClaimMetrics(reg, prometheus.CounterOpts{Name: "ops_total", Help: "ops"}, prometheus.CounterOpts{Name: "op_errors_total", Help: "errors"})
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
	if n, err := testutil.GatherAndCount(reg); err != nil || n != 3 {
		t.Errorf("gathered %d series (%v), want 3", n, err)
	}
	if _, err := NewClaimMetrics(reg, prometheus.CounterOpts{Name: "ops_total", Help: "ops"}, prometheus.CounterOpts{Name: "other_total", Help: "x"}); err == nil {
		t.Error("registering a name twice did not fail")
	}
}
