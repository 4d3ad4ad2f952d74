package resize

import "github.com/loopvol/loopvol/internal/kube"

// metricNames are the controller's own metrics (kube.ClaimMetrics, built
// by its claim queue: expansions finished, failed attempts by gRPC code),
// next to the workqueue metrics of the queue named by QueueName.
var metricNames = kube.ClaimMetricNames{
	Done: "loopvol_resizer_resizes_total", Errors: "loopvol_resizer_resize_errors_total", Attempts: "Failed expansion attempts",
	DoneHelp: "Volume expansions the controller finished its part of: the volume has its new capacity and the claim is handed to the node or done.",
}
