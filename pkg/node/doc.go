// Package node is loopvol's CSI Node service: it attaches a volume's image
// to a loop device, makes and mounts its filesystem (or hands over the raw
// device), bind-mounts it into pods, grows it and reports its usage and
// health.
//
// The node plugin keeps no state of its own. Which device backs a volume
// comes from sysfs (pkg/loop Find), what is mounted where from the mount
// table, and whether the volume may be used here at all from the volume's
// record in its pool: NodeStageVolume refuses a volume that the record does
// not show attached to this node, which is what fences a shared pool. A
// plugin that restarts therefore picks up where it left off, and every call
// can be repeated.
//
// Server is a locking decorator: it validates a request, takes the volume's
// lock without waiting (ABORTED when another call holds it) and hands the
// request to the unlocked implementation. Errors are wrapped with %w inside
// and turned into gRPC codes once, by toStatus.
package node
