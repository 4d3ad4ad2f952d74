package kube

import (
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"

	"github.com/loopvol/loopvol/pkg/csiclient"
)

// NoCode is the grpc_status_code label of a failure that carries no gRPC
// code: the driver was not called or did not answer with a status (a
// missing Secret, an API error).
const NoCode = "None"

// ClaimMetrics are the own Prometheus metrics of a claim controller (the
// resizer's, the modify controller's), next to the CSI call latency of the
// csiclient connection and the workqueue metrics of its queue.
type ClaimMetrics struct {
	// Done counts the operations the controller finished.
	Done prometheus.Counter
	// Errors counts the failed attempts by grpc_status_code (NoCode for a
	// failure without one).
	Errors *prometheus.CounterVec
}

// ClaimMetricNames name a claim controller's own metrics.
type ClaimMetricNames struct {
	// Done and DoneHelp name and describe the counter of finished
	// operations.
	Done, DoneHelp string
	// Errors names the counter of failed attempts by grpc_status_code;
	// Attempts begins its help ("Failed expansion attempts").
	Errors, Attempts string
}

// NewClaimMetrics builds the counters names names and registers them on
// reg, when not nil.
func NewClaimMetrics(reg prometheus.Registerer, names ClaimMetricNames) (*ClaimMetrics, error) {
	m := &ClaimMetrics{
		Done: prometheus.NewCounter(prometheus.CounterOpts{Name: names.Done, Help: names.DoneHelp}),
		Errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: names.Errors,
			Help: names.Attempts + " by gRPC code (" + NoCode + ": failed before the driver answered, e.g. a missing Secret).",
		}, []string{"grpc_status_code"}),
	}
	if reg == nil {
		return m, nil
	}
	for _, col := range []prometheus.Collector{m.Done, m.Errors} {
		if err := reg.Register(col); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Failed counts one failed attempt under the gRPC code of err (NoCode when
// it has none), and returns that code and whether err had one.
func (m *ClaimMetrics) Failed(err error) (codes.Code, bool) {
	code, ok := csiclient.Code(err)
	label := NoCode
	if ok {
		label = code.String()
	}
	m.Errors.WithLabelValues(label).Inc()
	return code, ok
}
