// Package node is loopvol's CSI Node service: it attaches a volume's image
// to a loop device, makes and mounts its filesystem (or hands over the raw
// device), bind-mounts it into pods, grows it and reports its usage and
// health.
//
// The node plugin keeps no state of its own, but for what its self-fence
// froze (selffence.go). Which device backs a volume
// comes from sysfs (pkg/loop Find, which sees only the devices this node
// attached, by their owner tag, and untagged ones an older plugin left:
// another node's plugin on the same kernel has its own device of a shared
// image, never this node's), what is mounted where from the mount table,
// and whether the volume may be used here at all from the volume's record
// in its pool: NodeStageVolume refuses a volume that the record does not
// show attached to this node, which is what fences a shared pool. A plugin
// that restarts therefore picks up where it left off, and every call can
// be repeated.
//
// Paths are resolved once (beneath.go): staging and target paths are
// opened beneath the kubelet directory with no symbolic link allowed on the
// way (openat2 RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS, or an O_NOFOLLOW walk),
// missing directories are made relative to the resolved parent, and every
// mount, unmount and removal acts on those descriptors (mounts.go), never on
// the path string again; after each mount the mount table is checked to
// show the volume's device at the canonical path. NodeUnpublishVolume and
// NodeUnstageVolume touch only mounts of the volume's own device and remove
// only an empty directory or the file a raw-block mount was on. Mount flags
// come from an allowlist (options.go) and cannot undo read-only, which the
// request's readonly field, the access mode and the attachment decide.
//
// Server is a locking decorator: it validates a request, takes the volume's
// lock without waiting (ABORTED when another call holds it) and hands the
// request to the unlocked implementation. Errors are wrapped with %w inside
// and turned into gRPC codes once, by toStatus. Their kinds, the topology
// key, the filesystems and the access-mode rules are pkg/volspec's, the
// vocabulary this package shares with pkg/controller.
package node
