// Package pool owns loopvol's state on disk: pool directories, volume images,
// volume and node records, their locks and the capacity arithmetic.
//
// Everything a driver process needs to know lives here, in files, so that a
// controller or node plugin that restarts (or a second plugin on a shared NFS
// pool) sees the same truth. Records are written atomically (temporary file,
// fsync, rename, directory fsync) so a crash leaves either the old or the new
// record, never half of one; a record that does not parse is reported as
// ErrCorrupt, never a panic.
//
// The package imports only the standard library and x/sys: it knows nothing of
// gRPC or Kubernetes. Callers map its sentinel errors to status codes.
package pool
