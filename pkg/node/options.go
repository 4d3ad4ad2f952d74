package node

import (
	"fmt"
	"regexp"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/loopvol/loopvol/pkg/volspec"
)

// Mount flags (volume_capability.mount.mount_flags, a StorageClass's
// mountOptions) are taken from an allowlist: each accepted option is one
// that is meaningful and safe for ext4 or xfs on a loop device, and says
// why. Anything else is INVALID_ARGUMENT naming the option. The node builds
// mount(2) flags and the filesystem's option string itself from the list;
// no flag reaches mount(8), and none can undo read-only (the read-only bit
// is set from the request's readonly field and the access mode, after the
// options). docs/mount-options.md lists them for users.

// optionKind says where an option goes.
type optionKind int

const (
	// perMount options are flags of one mount (a bind mount can have its
	// own): they apply to the staging mount and to every publish.
	perMount optionKind = iota
	// perFS options are flags of the filesystem (the superblock): they are
	// set when the volume is staged and are the same for every publish.
	perFS
	// fsData options go to the filesystem in mount(2)'s data string, when
	// the volume is staged.
	fsData
	// noop options change nothing (defaults, rw on a writable mount, ro on
	// a read-only one).
	noop
)

// optionSpec is one entry of the allowlist.
type optionSpec struct {
	kind optionKind
	// flag is the mount(2) flag and attr the mount_setattr(2) attribute of
	// a perMount or perFS option; clear means the option turns it off.
	flag  uintptr
	attr  uint64
	clear bool
	// value is the pattern the value after "=" must match, for an option
	// listed as "name=" (and only for those).
	value *regexp.Regexp
	// fs lists the filesystems the option exists on; nil is every one.
	fs []string
	// why is the reason it is accepted (and the line in docs/mount-options.md).
	why string
}

var (
	number       = regexp.MustCompile(`^[0-9]{1,9}$`)
	size         = regexp.MustCompile(`^[0-9]{1,12}[kKmMgG]?$`)
	zeroOne      = regexp.MustCompile(`^[01]$`)
	dataMode     = regexp.MustCompile(`^(journal|ordered|writeback)$`)
	errorsMode   = regexp.MustCompile(`^(continue|remount-ro)$`)
	seLinuxLabel = regexp.MustCompile(`^("[A-Za-z0-9_.:,-]{1,255}"|[A-Za-z0-9_.:-]{1,255})$`)
	ext4Only     = []string{volspec.FsExt4}
	xfsOnly      = []string{volspec.FsXFS}
)

// allowedOptions is the allowlist. Refused on purpose, among others:
// loop, offset=, sizelimit= (mount(8) would stack a second loop
// device, which no unstage finds), X-mount.* and x-* (mount(8) actions such
// as X-mount.subdir, which mount something other than the volume), bind,
// rbind, move, remount and the propagation flags (they change other
// mounts), errors=panic (a damaged volume would crash the node), norecovery
// and noload (a writable mount that skips the journal corrupts it),
// journal_path=, journal_dev=, logdev=, rtdev= (other devices of the
// node), dax (no such thing on a loop device), and user, users, owner,
// nofail, noauto, _netdev (fstab words mount(2) does not know).
var allowedOptions = map[string]optionSpec{
	"defaults": {kind: noop, why: "the default flags; mount-utils adds it to every mount"},
	"ro":       {kind: noop, why: "only on a read-only volume (readonly, a reader-only access mode or a read-only attachment), which is mounted read-only anyway"},
	"rw":       {kind: noop, why: "only on a writable volume; read-only is decided by the request, never by a flag"},

	"noatime":          {kind: perMount, flag: unix.MS_NOATIME, attr: unix.MOUNT_ATTR_NOATIME, why: "no access-time updates: fewer writes"},
	"relatime":         {kind: perMount, flag: unix.MS_RELATIME, attr: unix.MOUNT_ATTR_RELATIME, why: "access times updated at most daily (the kernel's default)"},
	"strictatime":      {kind: perMount, flag: unix.MS_STRICTATIME, attr: unix.MOUNT_ATTR_STRICTATIME, why: "every access updates the access time, for applications that need it"},
	"nodiratime":       {kind: perMount, flag: unix.MS_NODIRATIME, attr: unix.MOUNT_ATTR_NODIRATIME, why: "no access-time updates on directories"},
	"diratime":         {kind: perMount, flag: unix.MS_NODIRATIME, attr: unix.MOUNT_ATTR_NODIRATIME, clear: true, why: "the default, undoing nodiratime"},
	"nodev":            {kind: perMount, flag: unix.MS_NODEV, attr: unix.MOUNT_ATTR_NODEV, why: "device nodes on the volume do not work: hardening"},
	"dev":              {kind: perMount, flag: unix.MS_NODEV, attr: unix.MOUNT_ATTR_NODEV, clear: true, why: "the default, undoing nodev"},
	"nosuid":           {kind: perMount, flag: unix.MS_NOSUID, attr: unix.MOUNT_ATTR_NOSUID, why: "set-user-ID bits on the volume are ignored: hardening"},
	"suid":             {kind: perMount, flag: unix.MS_NOSUID, attr: unix.MOUNT_ATTR_NOSUID, clear: true, why: "the default, undoing nosuid"},
	"noexec":           {kind: perMount, flag: unix.MS_NOEXEC, attr: unix.MOUNT_ATTR_NOEXEC, why: "programs on the volume cannot be run: hardening"},
	"exec":             {kind: perMount, flag: unix.MS_NOEXEC, attr: unix.MOUNT_ATTR_NOEXEC, clear: true, why: "the default, undoing noexec"},
	"sync":             {kind: perFS, flag: unix.MS_SYNCHRONOUS, why: "every write is synchronous, for applications that want it"},
	"async":            {kind: perFS, flag: unix.MS_SYNCHRONOUS, clear: true, why: "the default, undoing sync"},
	"dirsync":          {kind: perFS, flag: unix.MS_DIRSYNC, why: "directory changes are synchronous"},
	"lazytime":         {kind: perFS, flag: unix.MS_LAZYTIME, why: "timestamps are kept in memory and written lazily: fewer writes"},
	"nolazytime":       {kind: perFS, flag: unix.MS_LAZYTIME, clear: true, why: "the default, undoing lazytime"},
	"context=":         {kind: fsData, value: seLinuxLabel, why: "SELinux label of every file (kubelet's seLinuxMount; the value may be quoted, with commas inside the quotes)"},
	"fscontext=":       {kind: fsData, value: seLinuxLabel, why: "SELinux label of the filesystem itself"},
	"defcontext=":      {kind: fsData, value: seLinuxLabel, why: "SELinux label of unlabelled files"},
	"rootcontext=":     {kind: fsData, value: seLinuxLabel, why: "SELinux label of the root directory"},
	"discard":          {kind: fsData, why: "online discard: on a thin volume (preallocate \"false\") each delete gives its blocks back to the pool, a hole punched in the image; a thick volume's device refuses discards (its blocks stay promised), and there the option does nothing"},
	"nodiscard":        {kind: fsData, why: "the default: deleted files' blocks stay in the image until an fstrim"},
	"barrier":          {kind: fsData, fs: ext4Only, why: "write barriers (the default): the journal stays consistent across a node crash"},
	"nobarrier":        {kind: fsData, fs: ext4Only, why: "no write barriers, for pools whose storage has a battery-backed cache"},
	"barrier=":         {kind: fsData, value: zeroOne, fs: ext4Only, why: "barrier=1 or barrier=0, as barrier and nobarrier"},
	"data=":            {kind: fsData, value: dataMode, fs: ext4Only, why: "ext4 journalling mode: journal, ordered (the default) or writeback"},
	"commit=":          {kind: fsData, value: number, fs: ext4Only, why: "seconds between ext4 journal commits"},
	"errors=":          {kind: fsData, value: errorsMode, fs: ext4Only, why: "continue or remount-ro on an ext4 error (panic is refused: a damaged volume would crash the node)"},
	"journal_checksum": {kind: fsData, fs: ext4Only, why: "checksums in the ext4 journal"},
	"delalloc":         {kind: fsData, fs: ext4Only, why: "delayed allocation (the ext4 default)"},
	"nodelalloc":       {kind: fsData, fs: ext4Only, why: "no delayed allocation"},
	"auto_da_alloc":    {kind: fsData, fs: ext4Only, why: "ext4 flushes on replace-by-rename (the default)"},
	"noauto_da_alloc":  {kind: fsData, fs: ext4Only, why: "no flush on replace-by-rename"},
	"dioread_nolock":   {kind: fsData, fs: ext4Only, why: "ext4 direct-I/O reads without the inode lock"},
	"dioread_lock":     {kind: fsData, fs: ext4Only, why: "ext4 direct-I/O reads under the inode lock"},
	"init_itable=":     {kind: fsData, value: number, fs: ext4Only, why: "pace of ext4's background inode-table initialisation"},
	"noinit_itable":    {kind: fsData, fs: ext4Only, why: "no background inode-table initialisation"},
	"max_batch_time=":  {kind: fsData, value: number, fs: ext4Only, why: "ext4 journal batching, microseconds"},
	"min_batch_time=":  {kind: fsData, value: number, fs: ext4Only, why: "ext4 journal batching, microseconds"},
	"stripe=":          {kind: fsData, value: number, fs: ext4Only, why: "ext4 allocation stripe, blocks"},
	"acl":              {kind: fsData, fs: ext4Only, why: "POSIX ACLs (the default)"},
	"noacl":            {kind: fsData, fs: ext4Only, why: "no POSIX ACLs"},
	"user_xattr":       {kind: fsData, fs: ext4Only, why: "user extended attributes (the default)"},
	"grpid":            {kind: fsData, why: "new files take the group of their directory"},
	"bsdgroups":        {kind: fsData, why: "as grpid"},
	"nogrpid":          {kind: fsData, why: "new files take the group of their creator (the default)"},
	"sysvgroups":       {kind: fsData, why: "as nogrpid"},
	"logbufs=":         {kind: fsData, value: number, fs: xfsOnly, why: "xfs in-memory log buffers (2 to 8)"},
	"logbsize=":        {kind: fsData, value: size, fs: xfsOnly, why: "size of each xfs log buffer"},
	"allocsize=":       {kind: fsData, value: size, fs: xfsOnly, why: "xfs preallocation size for buffered writes"},
	"inode64":          {kind: fsData, fs: xfsOnly, why: "xfs inodes anywhere (the default)"},
	"inode32":          {kind: fsData, fs: xfsOnly, why: "xfs inode numbers below 2^32, for old 32-bit applications"},
	"largeio":          {kind: fsData, fs: xfsOnly, why: "xfs reports its stripe width as the I/O size"},
	"nolargeio":        {kind: fsData, fs: xfsOnly, why: "xfs reports the page size as the I/O size (the default)"},
	"swalloc":          {kind: fsData, fs: xfsOnly, why: "xfs rounds allocations to the stripe width"},
	"wsync":            {kind: fsData, fs: xfsOnly, why: "synchronous xfs namespace operations"},
	"filestreams":      {kind: fsData, fs: xfsOnly, why: "xfs filestream allocator"},
	"nouuid":           {kind: fsData, fs: xfsOnly, why: "the default (the node adds it to every xfs mount): an xfs copy, a clone or a restore, has its source's UUID, which xfs otherwise refuses to mount twice"},
	"noquota":          {kind: fsData, fs: xfsOnly, why: "no xfs quotas (the default)"},
	"uquota":           {kind: fsData, fs: xfsOnly, why: "xfs user quotas, enforced"},
	"usrquota":         {kind: fsData, fs: xfsOnly, why: "as uquota"},
	"uqnoenforce":      {kind: fsData, fs: xfsOnly, why: "xfs user quotas, accounted only"},
	"gquota":           {kind: fsData, fs: xfsOnly, why: "xfs group quotas, enforced"},
	"grpquota":         {kind: fsData, fs: xfsOnly, why: "as gquota"},
	"gqnoenforce":      {kind: fsData, fs: xfsOnly, why: "xfs group quotas, accounted only"},
	"pquota":           {kind: fsData, fs: xfsOnly, why: "xfs project quotas, enforced"},
	"prjquota":         {kind: fsData, fs: xfsOnly, why: "as pquota"},
	"pqnoenforce":      {kind: fsData, fs: xfsOnly, why: "xfs project quotas, accounted only"},
}

// mountOption is one checked mount flag.
type mountOption struct {
	raw  string // as given
	name string // the key in allowedOptions
	spec optionSpec
}

// mountOptions are checked mount flags, in the order given.
type mountOptions []mountOption

// parseMountFlags checks every flag against the allowlist: one option each
// (no comma outside quotes), a known name, a value where one is wanted and
// of the right form. It does not know the filesystem or whether the mount
// is read-only yet; forMount checks those.
func parseMountFlags(flags []string) (mountOptions, error) {
	var out mountOptions
	for _, f := range flags {
		if !singleMountOption(f) {
			return nil, volspec.Errorf(volspec.ErrInvalid, "volume_capability.mount.mount_flags: %q is not a single mount option", f)
		}
		name, value, hasValue := strings.Cut(f, "=")
		// An option that takes a value is listed as "name=".
		key, other := name, name+"="
		if hasValue {
			key, other = other, key
		}
		spec, ok := allowedOptions[key]
		_, otherForm := allowedOptions[other]
		switch {
		case !ok && otherForm && hasValue:
			return nil, volspec.Errorf(volspec.ErrInvalid, "volume_capability.mount.mount_flags: %q: %s takes no value", f, name)
		case !ok && otherForm:
			return nil, volspec.Errorf(volspec.ErrInvalid, "volume_capability.mount.mount_flags: %q needs a value", f)
		case !ok:
			return nil, volspec.Errorf(volspec.ErrInvalid, "volume_capability.mount.mount_flags: %q is not an accepted mount option (see docs/mount-options.md)", f)
		case hasValue && !spec.value.MatchString(value):
			return nil, volspec.Errorf(volspec.ErrInvalid, "volume_capability.mount.mount_flags: %q: the value %q is not accepted for %s", f, value, name)
		}
		out = append(out, mountOption{raw: f, name: key, spec: spec})
	}
	return out, nil
}

// forMount checks the options against the filesystem and the read-only
// decision: an option of another filesystem, rw on a read-only mount and
// ro on a writable one are refused (the request's readonly field and access
// mode decide, a flag never does).
func (o mountOptions) forMount(fsType string, readOnly bool) error {
	for _, opt := range o {
		switch {
		case opt.name == "rw" && readOnly:
			return volspec.Errorf(volspec.ErrInvalid, "volume_capability.mount.mount_flags: rw contradicts a read-only volume (readonly, the access mode or a read-only attachment)")
		case opt.name == "ro" && !readOnly:
			return volspec.Errorf(volspec.ErrInvalid, "volume_capability.mount.mount_flags: ro on a writable volume: ask for read-only with readonly or a reader-only access mode")
		case opt.spec.fs != nil && fsType != "" && !contains(opt.spec.fs, fsType):
			return volspec.Errorf(volspec.ErrInvalid, "volume_capability.mount.mount_flags: %q is not an option of %s", opt.raw, fsType)
		}
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, e := range list {
		if e == s {
			return true
		}
	}
	return false
}

// msFlags returns the mount(2) flags of a new filesystem mount: per-mount
// and per-filesystem options in order (a later one wins), then MS_RDONLY if
// read-only, which no option can clear.
func (o mountOptions) msFlags(readOnly bool) uintptr {
	var flags uintptr
	for _, opt := range o {
		if opt.spec.kind != perMount && opt.spec.kind != perFS {
			continue
		}
		if opt.spec.flag&atimeFlags != 0 && !opt.spec.clear {
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
	return flags
}

// atimeFlags are the mutually exclusive access-time modes.
const atimeFlags = unix.MS_NOATIME | unix.MS_RELATIME | unix.MS_STRICTATIME

// mountAttrs returns the mount_setattr(2) attributes of a bind mount: the
// per-mount options only (the filesystem's were set when it was staged), and
// MOUNT_ATTR_RDONLY if read-only, which no option can clear.
func (o mountOptions) mountAttrs(readOnly bool) (set, clr uint64) {
	for _, opt := range o {
		if opt.spec.kind != perMount {
			continue
		}
		a := opt.spec.attr
		switch {
		case opt.spec.flag&atimeFlags != 0:
			// The access-time mode is one field: clear it whole, set one.
			clr |= unix.MOUNT_ATTR__ATIME
			set = set&^unix.MOUNT_ATTR__ATIME | a
		case opt.spec.clear:
			set &^= a
			clr |= a
		default:
			set |= a
			clr &^= a
		}
	}
	if readOnly {
		set |= unix.MOUNT_ATTR_RDONLY
		clr &^= unix.MOUNT_ATTR_RDONLY
	}
	return set, clr
}

// withDefaults returns the options with what every mount of fsType gets:
// xfs is mounted nouuid, because a clone or a restore is a copy of its
// source's image, UUID included, and xfs refuses to mount a second
// filesystem with a UUID already mounted ("invalid argument"), so a
// clone could not be staged on its source's node. Nothing here finds
// filesystems by UUID; regenerating it instead (xfs_admin -U) would need
// the copied log clean, which a snapshot of a mounted volume's is not.
func (o mountOptions) withDefaults(fsType string) mountOptions {
	if fsType != volspec.FsXFS || slices.ContainsFunc(o, func(opt mountOption) bool { return opt.name == "nouuid" }) {
		return o
	}
	return append(slices.Clip(o), mountOption{raw: "nouuid", name: "nouuid", spec: allowedOptions["nouuid"]})
}

// data returns the filesystem options of a new mount, comma-separated, as
// given (the SELinux values keep their quotes: the kernel's option parser
// reads commas inside quotes as part of the value).
func (o mountOptions) data() string {
	var parts []string
	for _, opt := range o {
		if opt.spec.kind == fsData {
			parts = append(parts, opt.raw)
		}
	}
	return strings.Join(parts, ",")
}

// strings returns the options as given, for messages and for mounters that
// take option strings (the fakes of the unit tests).
func (o mountOptions) strings() []string {
	out := make([]string, 0, len(o))
	for _, opt := range o {
		out = append(out, opt.raw)
	}
	return out
}

// String is the options for messages.
func (o mountOptions) String() string { return fmt.Sprint(o.strings()) }
