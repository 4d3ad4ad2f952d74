// Package metrics makes the CSI call-latency metrics that both loopvol
// binaries serve, with the names and labels of the upstream drivers and
// sidecars, so existing dashboards keep working:
//
//   - NewPlugin, for the driver: csi_plugin_operations_seconds of every
//     call it answers (pkg/csiserver records them);
//   - NewSidecar, for the sidecar: csi_sidecar_operations_seconds of every
//     call it makes to the driver (pkg/csiclient records them), served
//     together with component-base's legacy registry (workqueue and
//     leader-election metrics) and a registry for the controllers' own.
//
// Both come from csi-lib-utils' metrics manager, labelled driver_name,
// method_name and grpc_status_code. The metrics of one part of loopvol live
// beside it: the pool gauges in pkg/pool/poolmetrics, the controllers' in
// their packages.
package metrics
