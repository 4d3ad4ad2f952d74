// Package health serves a process's diagnostics over HTTP: the named checks
// behind /healthz and /healthz/<name> (Checks), a handler for any one check
// (Handler), and the server they and the metrics run on (Serve), whose
// failure the caller treats as the process's own.
package health
