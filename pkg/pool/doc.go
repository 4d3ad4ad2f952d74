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
// Every file in a pool is untrusted: a shared pool is written by every node
// that serves it. The pool's directories are opened once and every file is
// reached relative to them without following symlinks, checked on the
// descriptor that is then used (a regular file of the pool directory's
// owner with one name) and read with a bound (MaxRecordBytes). One bad entry
// is reported for itself; the rest of the pool is served (fs.go).
//
// Two processes may serve one pool (two controllers, or a controller and
// node plugins on NFS): a volume lock (in-process mutex plus flock) guards
// each volume's record and image, a pool lock makes each capacity check
// and the allocation it allows one step, and a node lock makes counting a
// node's attachments and adding one a single step (lock.go). The pool and
// node locks wait, but never past the context their caller passes (the
// RPC's deadline) nor past 30 s; then they answer ErrBusy. Sweep removes
// what killed processes left (sweep.go).
//
// Snapshots (snapshot.go) are read-only images beside the volumes', with a
// record of their own (snap-<hash>.json, written first as not ready); their
// IDs (<pool>.snap-<hash>) never parse as volume IDs. An image is copied by
// FICLONE where the filesystem has reflinks, else by a sparse copy whose
// space is reserved under the pool lock (copy.go). A group snapshot
// (group.go) is a record listing member snapshots whose records name it. A
// volume's image is thick (fully allocated) or thin (sparse, still counted
// as promised); SetLayout changes it, with the intent in the record
// (layout.go). MoveVolume moves a volume to another pool of its zone,
// keeping its ID: the pool the ID names keeps a forwarding record, which
// Locate follows one hop, strictly (move.go has the design and the crash
// order).
//
// The package imports only the standard library and x/sys: it knows nothing of
// gRPC or Kubernetes. Callers map its sentinel errors to status codes.
package pool
