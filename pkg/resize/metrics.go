package resize

import "github.com/prometheus/client_golang/prometheus"

// noCode is the grpc_status_code label of failures that carry no gRPC code:
// the driver was not called or did not answer with a status (a missing
// Secret, an API error).
const noCode = "None"

// metrics are the controller's own Prometheus metrics, next to the CSI call
// latency (csi_sidecar_operations_seconds, from the csiclient connection)
// and the workqueue metrics (the queue named by QueueName).
type metrics struct {
	resizes prometheus.Counter
	errors  *prometheus.CounterVec
}

// newMetrics builds the metrics and registers them on reg (when not nil).
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		resizes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "loopvol_resizer_resizes_total",
			Help: "Volume expansions the controller finished its part of: the volume has its new capacity and the claim is handed to the node or done.",
		}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "loopvol_resizer_resize_errors_total",
			Help: "Failed expansion attempts by gRPC code (" + noCode + ": failed before the driver answered, e.g. a missing Secret).",
		}, []string{"grpc_status_code"}),
	}
	if reg == nil {
		return m, nil
	}
	for _, col := range []prometheus.Collector{m.resizes, m.errors} {
		if err := reg.Register(col); err != nil {
			return nil, err
		}
	}
	return m, nil
}
