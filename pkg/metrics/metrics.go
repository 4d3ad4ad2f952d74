package metrics

import (
	"github.com/kubernetes-csi/csi-lib-utils/metrics"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/component-base/metrics/legacyregistry"
)

// NewPlugin returns the metrics manager of the driver driverName:
// csi_plugin_operations_seconds{driver_name, method_name, grpc_status_code}
// and process_start_time_seconds in a registry of its own, to which the
// driver adds its other collectors (GetRegistry().RawMustRegister) and
// which RegisterToServer serves.
func NewPlugin(driverName string) metrics.CSIMetricsManager {
	return metrics.NewCSIMetricsManagerWithOptions(driverName, metrics.WithSubsystem(metrics.SubsystemPlugin))
}

// NewSidecar returns the sidecar's metrics manager and own, the registry
// for its controllers' metrics. The manager records
// csi_sidecar_operations_seconds{driver_name, method_name,
// grpc_status_code}, the driver named by SetDriverName once it is known
// (pkg/csiclient does so when it connects); its RegisterToServer serves those, component-base's legacy
// registry (the workqueue and leader-election metrics, once the command
// has registered their providers) and own.
func NewSidecar() (m metrics.CSIMetricsManager, own *prometheus.Registry) {
	m = metrics.NewCSIMetricsManagerForSidecar("")
	own = prometheus.NewRegistry()
	m.WithAdditionalRegistry(legacyregistry.DefaultGatherer)
	m.WithAdditionalRegistry(own)
	return m, own
}
