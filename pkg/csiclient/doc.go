// Package csiclient is the sidecar's connection to a CSI driver socket.
//
// It owns everything the sidecar controllers need to know about the driver
// and nothing else: the gRPC connection (csi-lib-utils connection.Connect, so
// every call is logged with secrets stripped and timed in
// csi_sidecar_operations_seconds by method and code), the readiness probe,
// the driver name, the controller capabilities, a few narrow calls with a
// per-call timeout, and the split of gRPC errors into final and transient
// ones.
//
// Losing the socket does not end the process. The upstream sidecars exit and
// let the kubelet restart them, which turns a driver restart into a crash
// loop. A Client instead notices that the connection left the READY state,
// reports itself unhealthy, waits for the socket to come back, probes the
// driver again (Probe, GetPluginInfo, capabilities) and only then reports
// ready again. Callers wait for that with WaitReady and read the current
// capabilities with Capabilities, so a driver that comes back with other
// capabilities is picked up without a restart.
package csiclient
