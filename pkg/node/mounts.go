package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"

	"golang.org/x/sys/unix"
	mount "k8s.io/mount-utils"
	utilexec "k8s.io/utils/exec"

	"github.com/loopvol/loopvol/pkg/volspec"
)

// mountEntry is one mount of the mount table.
type mountEntry struct {
	path   string // mount point
	source string // as the table names it
	fsType string
	root   string // the directory of the filesystem mounted here ("/" unless a bind of a part)
	opts   []string
	// real tells entries of the kernel's table, which carry device numbers,
	// from those of a fake, which carry only names.
	real bool
	// dev is the device number of the mounted filesystem (mountinfo
	// major:minor).
	dev uint64
	// rootRdev is the device number of the mount's root when it is a block
	// device node (a raw-block publish) and was seen through a descriptor.
	rootRdev uint64
}

// readOnly reports whether the mount is read-only.
func (e mountEntry) readOnly() bool { return contains(e.opts, "ro") }

// mountTable is how the node sees and changes mounts. The node's own
// (sysMounts) acts only on resolved descriptors; the unit tests put
// mount-utils' FakeMounter behind it.
type mountTable interface {
	// list returns every mount.
	list() ([]mountEntry, error)
	// at returns the mount on top of the resolved object, if the object is
	// a mount point.
	at(r *resolved) (mountEntry, bool, error)
	// mountFS mounts the filesystem on dev (fsType, options already
	// checked) onto the resolved directory, read-only if asked.
	mountFS(dev string, r *resolved, fsType string, o mountOptions, readOnly bool) error
	// bind bind-mounts source onto the resolved object with the per-mount
	// options, read-only if asked. The new mount is read-only from its
	// first moment when the kernel can do it (mount_setattr).
	bind(source bindSource, r *resolved, o mountOptions, readOnly bool) error
	// unmount unmounts the mount on top of the resolved object; r's own
	// descriptor is closed (reopen it after).
	unmount(r *resolved) error
}

// bindSource is what a publish bind-mounts: the resolved staging directory
// (mount) or the loop device node (block).
type bindSource struct {
	staging *resolved // nil for a device
	dev     string
}

// sysMounts is the mount table of the kernel, changed through the
// descriptors of resolved paths: mount(2) on /proc/self/fd/N, the new mount
// API (open_tree, mount_setattr, move_mount) for binds, umount2 with
// UMOUNT_NOFOLLOW relative to the resolved parent. It never hands a path
// string to mount(8): mount(8) would walk it again (and canonicalise it,
// following any symbolic link put there since the check).
type sysMounts struct{}

// noMountAPI is set once open_tree proved missing (kernels before 5.12
// lack mount_setattr), so binds go straight to mount(2).
var noMountAPI atomic.Bool

const mountInfoPath = "/proc/self/mountinfo"

func (sysMounts) list() ([]mountEntry, error) {
	mis, err := mount.ParseMountInfo(mountInfoPath)
	if err != nil {
		return nil, fmt.Errorf("read the mount table: %w", err)
	}
	out := make([]mountEntry, 0, len(mis))
	for _, mi := range mis {
		out = append(out, entryOf(mi))
	}
	return out, nil
}

func entryOf(mi mount.MountInfo) mountEntry {
	return mountEntry{
		path:   mi.MountPoint,
		source: mi.Source,
		fsType: mi.FsType,
		root:   mi.Root,
		opts:   append(append([]string(nil), mi.MountOptions...), mi.SuperOptions...),
		real:   true,
		dev:    unix.Mkdev(uint32(mi.Major), uint32(mi.Minor)),
	}
}

// at finds the mount whose root the descriptor is (statx: the mount ID and
// STATX_ATTR_MOUNT_ROOT) in mountinfo. Kernels before 5.8 report neither;
// then the topmost mount at the canonical path counts, if the descriptor is
// on that mount's filesystem.
func (sysMounts) at(r *resolved) (mountEntry, bool, error) {
	if !r.exists() {
		return mountEntry{}, false, nil
	}
	var stx unix.Statx_t
	if err := unix.Statx(r.fd, "", unix.AT_EMPTY_PATH|unix.AT_STATX_DONT_SYNC, unix.STATX_MNT_ID|unix.STATX_TYPE, &stx); errors.Is(err, unix.EIO) {
		return unreadableMountAt(r, err)
	} else if err != nil {
		return mountEntry{}, false, fmt.Errorf("statx %s: %w", r.path, err)
	}
	byID := stx.Mask&unix.STATX_MNT_ID != 0 && stx.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT != 0
	if byID && stx.Attributes&unix.STATX_ATTR_MOUNT_ROOT == 0 {
		return mountEntry{}, false, nil // no mount point: no need to read the table
	}
	mis, err := mount.ParseMountInfo(mountInfoPath)
	if err != nil {
		return mountEntry{}, false, fmt.Errorf("read the mount table: %w", err)
	}
	var e mountEntry
	found := false
	if byID {
		for _, mi := range mis {
			if uint64(mi.ID) == stx.Mnt_id {
				e, found = entryOf(mi), true
				break
			}
		}
	} else {
		fsDev := unix.Mkdev(stx.Dev_major, stx.Dev_minor)
		for _, mi := range mis {
			if mi.MountPoint == r.path {
				e, found = entryOf(mi), true // later entries are mounted over earlier ones
			}
		}
		found = found && e.dev == fsDev
	}
	if !found {
		return mountEntry{}, false, nil
	}
	if stx.Mode&unix.S_IFMT == unix.S_IFBLK {
		e.rootRdev = unix.Mkdev(stx.Rdev_major, stx.Rdev_minor)
	}
	return e, true, nil
}

// unreadableMountAt is at for a descriptor that statx answers with EIO: the
// root of a filesystem that shut down (xfs after an I/O error, or
// xfs_io's shutdown), which must still be unmounted. The mount it is on
// comes from /proc/self/fdinfo (the kernel's, no stat involved); the
// descriptor is that mount's root when the mount's mount point is the
// resolved path. Anything else keeps the error: a broken filesystem below
// the path is nothing the driver mounted there.
func unreadableMountAt(r *resolved, statErr error) (mountEntry, bool, error) {
	info, err := os.ReadFile("/proc/self/fdinfo/" + strconv.Itoa(r.fd))
	if err != nil {
		return mountEntry{}, false, fmt.Errorf("statx %s: %w (and its fdinfo: %v)", r.path, statErr, err)
	}
	var mntID int
	for _, line := range strings.Split(string(info), "\n") {
		if v, ok := strings.CutPrefix(line, "mnt_id:"); ok {
			mntID, err = strconv.Atoi(strings.TrimSpace(v))
		}
	}
	if mntID == 0 || err != nil {
		return mountEntry{}, false, fmt.Errorf("statx %s: %w (no mount ID in its fdinfo)", r.path, statErr)
	}
	mis, err := mount.ParseMountInfo(mountInfoPath)
	if err != nil {
		return mountEntry{}, false, fmt.Errorf("read the mount table: %w", err)
	}
	for _, mi := range mis {
		if mi.ID == mntID && mi.MountPoint == r.path {
			return entryOf(mi), true, nil
		}
	}
	return mountEntry{}, false, fmt.Errorf("statx %s: %w", r.path, statErr)
}

// mountFS mounts with mount(2) on the descriptor's magic link: the kernel
// attaches the filesystem to exactly the resolved directory. The data
// string goes to the filesystem as given (SELinux contexts keep their
// quotes, which the kernel's parser understands).
func (sysMounts) mountFS(dev string, r *resolved, fsType string, o mountOptions, readOnly bool) error {
	if err := unix.Mount(dev, r.proc(), fsType, o.msFlags(readOnly), o.data()); err != nil {
		return fmt.Errorf("mount %s (%s, %v) on %s: %w", dev, fsType, o, r.path, err)
	}
	return nil
}

// bind clones the source mount (open_tree), gives the detached clone its
// flags (mount_setattr: read-only before anyone can reach it) and attaches
// it to the resolved target (move_mount). Without the new mount API it
// bind-mounts with mount(2) and then remounts the new mount with its flags.
func (m sysMounts) bind(source bindSource, r *resolved, o mountOptions, readOnly bool) error {
	src, srcPath := -1, source.dev
	if source.staging != nil {
		src, srcPath = source.staging.fd, source.staging.path
	}
	if !noMountAPI.Load() {
		err := bindNewAPI(src, source.dev, r, o, readOnly)
		if !errors.Is(err, unix.ENOSYS) && !errors.Is(err, unix.EPERM) {
			if err != nil {
				return fmt.Errorf("bind mount %s on %s: %w", srcPath, r.path, err)
			}
			return nil
		}
		noMountAPI.Store(true)
	}
	return m.bindMount2(src, source.dev, r, o, readOnly)
}

func bindNewAPI(src int, dev string, r *resolved, o mountOptions, readOnly bool) error {
	var tree int
	var err error
	if src >= 0 {
		tree, err = unix.OpenTree(src, "", unix.OPEN_TREE_CLONE|unix.O_CLOEXEC|unix.AT_EMPTY_PATH)
	} else {
		tree, err = unix.OpenTree(unix.AT_FDCWD, dev, unix.OPEN_TREE_CLONE|unix.O_CLOEXEC|unix.AT_SYMLINK_NOFOLLOW)
	}
	if err != nil {
		return fmt.Errorf("open_tree: %w", err)
	}
	defer unix.Close(tree)
	if set, clr := o.mountAttrs(readOnly); set != 0 || clr != 0 {
		if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH, &unix.MountAttr{Attr_set: set, Attr_clr: clr}); err != nil {
			return fmt.Errorf("mount_setattr: %w", err)
		}
	}
	if err := unix.MoveMount(tree, "", r.fd, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH); err != nil {
		return fmt.Errorf("move_mount: %w", err)
	}
	return nil
}

// bindMount2 is bind with mount(2): a bind, then a remount of the new mount
// (reached again through the resolved parent: the target's old descriptor
// names the directory under it) with the flags the source had plus the
// options and read-only.
func (m sysMounts) bindMount2(src int, dev string, r *resolved, o mountOptions, readOnly bool) error {
	source := dev
	if src >= 0 {
		source = procFd(src)
	}
	if err := unix.Mount(source, r.proc(), "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind mount %s on %s: %w", source, r.path, err)
	}
	if err := r.reopen(); err != nil {
		return err
	}
	var st unix.Statfs_t
	if err := unix.Fstatfs(r.fd, &st); err != nil {
		return fmt.Errorf("statfs %s: %w", r.path, err)
	}
	flags := unix.MS_REMOUNT | unix.MS_BIND | inheritedFlags(st.Flags)
	for _, opt := range o {
		if opt.spec.kind != perMount {
			continue
		}
		if opt.spec.flag&atimeFlags != 0 {
			flags &^= atimeFlags
		}
		if opt.spec.clear {
			flags &^= opt.spec.flag
		} else {
			flags |= opt.spec.flag
		}
	}
	if readOnly {
		flags |= unix.MS_RDONLY
	}
	if err := unix.Mount("", r.proc(), "", flags, ""); err != nil {
		_ = m.unmount(r)
		_ = r.reopen()
		return fmt.Errorf("remount %s with its flags: %w", r.path, err)
	}
	return nil
}

// inheritedFlags turns statfs flags into the per-mount mount(2) flags a
// bind remount must repeat: a remount sets the per-mount flags whole.
func inheritedFlags(f int64) uintptr {
	var flags uintptr
	for st, ms := range map[int64]uintptr{
		unix.ST_RDONLY: unix.MS_RDONLY, unix.ST_NOSUID: unix.MS_NOSUID, unix.ST_NODEV: unix.MS_NODEV,
		unix.ST_NOEXEC: unix.MS_NOEXEC, unix.ST_NOATIME: unix.MS_NOATIME, unix.ST_NODIRATIME: unix.MS_NODIRATIME,
		unix.ST_RELATIME: unix.MS_RELATIME,
	} {
		if f&st != 0 {
			flags |= ms
		}
	}
	return flags
}

// unmount unmounts by the name in the resolved parent (it closes r's own
// descriptor, which would keep the mount busy; reopen it after) with
// UMOUNT_NOFOLLOW: a symbolic link put there is not followed (and is no
// mount point), and a mount point cannot be renamed away, so what is
// unmounted is the mount at was shown.
func (sysMounts) unmount(r *resolved) error {
	r.closeFd()
	if err := unix.Unmount(procFd(r.parent)+"/"+r.name, unix.UMOUNT_NOFOLLOW); err != nil {
		return fmt.Errorf("unmount %s: %w", r.path, err)
	}
	return nil
}

// mountAt returns the mount on top of the resolved object, if any.
func (n *node) mountAt(r *resolved) (mountEntry, bool, error) {
	return n.mounts.at(r)
}

// mountAtPath resolves a checked path (creating nothing) and returns the
// mount on top of it. A path that does not exist, or leads through
// something not the driver's, has no mount of ours.
func (n *node) mountAtPath(p string) (mountEntry, bool, *resolved, error) {
	r, err := n.resolve(p, false)
	if errors.Is(err, errPathMissing) || errors.Is(err, errNotOwn) {
		return mountEntry{}, false, nil, nil
	}
	if err != nil {
		return mountEntry{}, false, nil, err
	}
	e, ok, err := n.mountAt(r)
	if err != nil || !ok || e.path != r.path {
		r.close()
		return mountEntry{}, false, nil, err
	}
	return e, true, r, nil
}

// mountedFrom reports whether e is a mount of device dev: a filesystem on
// it or a bind of one (the table's device number is dev's), or a bind of
// the device node itself (raw block: its root is the node). The kernel's
// entries are compared by device number only: a source name is chosen by
// whoever mounts (a FUSE file system can call itself /dev/loop3).
func (n *node) mountedFrom(e mountEntry, dev string) bool {
	return deviceOf(dev).holds(e)
}

// device is a device node with its device number read once, for checks
// against many mount entries (users reads the host's whole table).
type device struct {
	path string
	rdev uint64
	ok   bool // the number could be read
}

func deviceOf(path string) device {
	r, err := rdev(path)
	return device{path: path, rdev: r, ok: err == nil}
}

// holds is mountedFrom for d.
func (d device) holds(e mountEntry) bool {
	if !e.real {
		return e.source == d.path
	}
	if !d.ok {
		return false
	}
	switch {
	case e.dev == d.rdev:
		return true
	case e.rootRdev != 0:
		return e.rootRdev == d.rdev
	case e.fsType == "devtmpfs":
		// A bind of a node of /dev: the root is the node's name in devtmpfs.
		return e.root == "/"+filepath.Base(d.path)
	}
	return false
}

// users lists the mount points that use device dev, except those in skip
// (canonical paths): filesystems on the device, binds of them, and binds of
// the device node itself anywhere on the host, since detaching a loop
// device that something still has bind-mounted would turn that mount into a
// dead node. It reads only the mount table.
func (n *node) users(dev string, skip ...string) ([]string, error) {
	es, err := n.mounts.list()
	if err != nil {
		return nil, err
	}
	d := deviceOf(dev)
	var paths []string
	for _, e := range es {
		if contains(skip, e.path) {
			continue
		}
		if d.holds(e) {
			paths = append(paths, e.path)
		}
	}
	return paths, nil
}

// rdev returns the device number of a block device node.
func rdev(path string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFBLK {
		return 0, fmt.Errorf("%s is not a block device", path)
	}
	return st.Rdev, nil
}

// ctxExec runs every command under the request's context, so that a caller
// that gives up (kubelet's timeout) also stops a long mkfs or resize.
type ctxExec struct {
	utilexec.Interface
	ctx context.Context
}

// Command runs cmd under the context.
func (e ctxExec) Command(cmd string, args ...string) utilexec.Cmd {
	return e.Interface.CommandContext(e.ctx, cmd, args...)
}

// withContext returns the mounter with its commands bound to ctx.
func (n *node) withContext(ctx context.Context) *mount.SafeFormatAndMount {
	return &mount.SafeFormatAndMount{Interface: n.Mounter.Interface, Exec: ctxExec{Interface: n.Mounter.Exec, ctx: ctx}}
}

// formatter is mount-utils' SafeFormatAndMount with its last step, the
// mount, replaced: mount-utils decides whether to make a filesystem
// (blkid), makes it (mkfs) or checks it (fsck), all on the device, which is
// safe; then, instead of running mount(8) with the target path, it calls
// back here, and the node mounts on the resolved directory.
type formatter struct {
	mount.Interface
	mountFS func() error
}

// MountSensitive is the call formatAndMount makes after formatting; source,
// target and options are the ones the node passed and already holds.
func (f formatter) MountSensitive(string, string, string, []string, []string) error {
	return f.mountFS()
}

// Mount is MountSensitive.
func (f formatter) Mount(source, target, fstype string, options []string) error {
	return f.MountSensitive(source, target, fstype, options, nil)
}

// formatAndMount makes the filesystem on dev if blkid finds it blank (or
// checks an existing one before a writable mount), then mounts it with
// mountFS. The option strings given to mount-utils are "ro" or nothing: it
// reads them only to tell a read-only mount (no mkfs, no fsck).
func (n *node) formatAndMount(ctx context.Context, dev string, r *resolved, fsType string, o mountOptions, readOnly bool) error {
	var opts []string
	if readOnly {
		opts = []string{"ro"}
	}
	m := &mount.SafeFormatAndMount{
		Interface: formatter{Interface: n.Mounter.Interface, mountFS: func() error { return n.mounts.mountFS(dev, r, fsType, o, readOnly) }},
		Exec:      ctxExec{Interface: n.Mounter.Exec, ctx: ctx},
	}
	return m.FormatAndMountSensitiveWithFormatOptions(dev, r.path, fsType, opts, nil, formatOptions[fsType])
}

// unmountAll unmounts the mounts of device dev stacked at the resolved
// object, top first, and stops at the first that is not dev's (an error of
// kind errInUse). It returns how many it unmounted.
func (n *node) unmountAll(r *resolved, dev string) (int, error) {
	for i := 0; ; i++ {
		e, ok, err := n.mountAt(r)
		if err != nil || !ok {
			return i, err
		}
		if e.path != r.path || !n.mountedFrom(e, dev) {
			return i, volspec.Errorf(errInUse, "%s is mounted from %s, not from the volume's device %s: not unmounting it", r.path, e.source, dev)
		}
		// The descriptor on the mount would keep it busy.
		r.closeFd()
		if err := n.mounts.unmount(r); err != nil {
			_ = r.reopen()
			return i, err
		}
		if err := r.reopen(); err != nil {
			return i + 1, err
		}
		if i > 16 {
			return i, fmt.Errorf("%s: still mounted after %d unmounts", r.path, i)
		}
	}
}

// checkMounted checks, after a mount, that the path now holds a mount of
// the volume's device at the canonical path: the resolved directory is
// opened again by name and its mount looked up. A mount that landed
// elsewhere (an ancestor renamed meanwhile) or is not of the device is
// unmounted again, if it is the device's, and reported.
func (n *node) checkMounted(r *resolved, dev string) error {
	if err := r.reopen(); err != nil {
		return err
	}
	e, ok, err := n.mountAt(r)
	if err != nil {
		return err
	}
	switch {
	case !ok:
		return fmt.Errorf("%s: nothing is mounted there after the mount", r.path)
	case !n.mountedFrom(e, dev):
		return fmt.Errorf("%s: mounted from %s after the mount, not from %s", r.path, e.source, dev)
	case e.path != r.path:
		_, _ = n.unmountAll(r, dev)
		return volspec.Errorf(errNotOwn, "%s moved to %s while it was being mounted; unmounted it again", r.path, e.path)
	}
	return nil
}
