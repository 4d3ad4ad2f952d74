package resize

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/loopvol/loopvol/internal/kube"
)

// metricNames are the controller's own metrics (kube.ClaimMetrics:
// expansions finished, failed attempts by gRPC code), next to the
// workqueue metrics of the queue named by QueueName.
var metricNames = kube.ClaimMetricNames{
	Done: "loopvol_resizer_resizes_total", Errors: "loopvol_resizer_resize_errors_total", Attempts: "Failed expansion attempts",
	DoneHelp: "Volume expansions the controller finished its part of: the volume has its new capacity and the claim is handed to the node or done.",
}

// newMetrics builds the controller's own metrics and registers them on reg
// (when not nil).
func newMetrics(reg prometheus.Registerer) (*kube.ClaimMetrics, error) {
	return kube.NewClaimMetrics(reg, metricNames)
}
