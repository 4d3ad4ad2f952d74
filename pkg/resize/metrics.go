package resize

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/loopvol/loopvol/internal/kube"
)

// newMetrics builds the controller's own metrics (kube.ClaimMetrics:
// expansions finished, failed attempts by gRPC code) and registers them on
// reg (when not nil). The workqueue metrics are the queue's named by
// QueueName.
func newMetrics(reg prometheus.Registerer) (*kube.ClaimMetrics, error) {
	return kube.NewClaimMetrics(reg, prometheus.CounterOpts{
		Name: "loopvol_resizer_resizes_total",
		Help: "Volume expansions the controller finished its part of: the volume has its new capacity and the claim is handed to the node or done.",
	}, prometheus.CounterOpts{
		Name: "loopvol_resizer_resize_errors_total",
		Help: "Failed expansion attempts by gRPC code (" + kube.NoCode + ": failed before the driver answered, e.g. a missing Secret).",
	})
}
