// Package csiserver is the gRPC plumbing that the driver's controller and
// node modes share: the unix socket (internal/unixsock: strict endpoint
// parsing, stale socket replacement, owner-only permissions without touching
// the umask), the interceptor that puts a logger with the method and volume
// ID into every request's context, logs sanitized payloads at V(5), records
// csi_plugin_operations_seconds and turns panics and plain errors into
// INTERNAL, and a stop that lets running calls finish.
package csiserver
