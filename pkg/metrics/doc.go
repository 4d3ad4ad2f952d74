// Package metrics holds the Prometheus metrics loopvol defines itself. CSI
// call latency uses csi-lib-utils' metrics manager, so its names
// (csi_plugin_operations_seconds, csi_sidecar_operations_seconds) match the
// upstream sidecars' and existing dashboards keep working.
package metrics
