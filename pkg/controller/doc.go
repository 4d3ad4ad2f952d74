// Package controller implements loopvol's CSI Identity, Controller and
// GroupController services on top of pkg/pool: it validates every request
// before anything touches the disk, takes the per-volume lock (busy →
// ABORTED), looks the volume up and acts. ControllerPublishVolume is
// fencing: it records the attachment in the volume record, and node plugins
// refuse to stage a volume that is not attached to them.
//
// Snapshots (snapshot.go) are images beside their source volume's in its
// pool; CreateVolume restores one or clones a volume (source.go). A volume
// mounted on this node is frozen for its clone (freeze.go). The
// GroupController service (group.go) snapshots volumes of one pool
// together. ControllerModifyVolume (modify.go) applies the mutable
// parameters of a VolumeAttributesClass, moving a detached volume to
// another pool of its zone; every lookup by ID goes through its home pool's
// record (locate, settle). docs/snapshots.md has the whole.
//
// Errors are plain wrapped errors inside: pkg/pool's sentinels and the
// kinds of pkg/volspec, the vocabulary this package shares with pkg/node
// (with the topology key, the filesystems and the access-mode rules).
// toStatus (errors.go) turns them into gRPC codes in one place, at the edge
// of every RPC (rpc.go, which also writes down the lock order).
package controller
