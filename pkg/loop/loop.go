package loop

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
)

// BlockSize is the logical block size of the devices we attach. It is
// fixed, not taken from the backing filesystem, because a filesystem made
// on a device of one sector size may not mount on a device of another (xfs
// records its sector size), and a shared pool can be reached from nodes
// whose backing filesystems differ. 4096 satisfies the direct I/O alignment
// of every backing filesystem we meet, and lets direct I/O through in the
// page-sized pieces the page cache above writes. The one exception is an
// image whose filesystem was made with smaller blocks (blocksize_linux.go).
const BlockSize = 4096

var (
	// ErrNotAttached: the device exists but no image is attached to it.
	ErrNotAttached = errors.New("loop device is not attached")
	// ErrBusy: the device is still open elsewhere (mounted, or held by a
	// process). The kernel detaches it when the last user closes it.
	ErrBusy = errors.New("loop device is in use")
	// ErrInvalidDevice: a path that does not name a loop device.
	ErrInvalidDevice = errors.New("not a loop device path")
	// ErrNotOwned: the device is attached, but by another owner (another
	// node's plugin on the same kernel); it is neither changed nor
	// described.
	ErrNotOwned = errors.New("loop device is attached by another owner")
)

// Devices is the Interface of this machine's loop devices, as one owner
// sees them (New).
type Devices struct {
	owner string
	tag   string // OwnerTag(owner)
}

// Option configures Devices.
type Option func(*Devices)

// Owner makes Devices act for the owner id, a node plugin's node ID: Attach
// tags each device with OwnerTag(id), and every other method acts only on
// the owner's devices and on untagged ones (see OwnerTag). An empty id is
// no owner.
func Owner(id string) Option {
	return func(d *Devices) { d.owner, d.tag = id, OwnerTag(id) }
}

// New returns the loop devices of this machine. Without an Owner option
// they are the machine's view, for tools and tests: every device, whoever
// attached it, and devices attached untagged, as before owners existed.
func New(opts ...Option) Devices {
	var d Devices
	for _, o := range opts {
		o(&d)
	}
	return d
}

// Owner implements Interface.
func (d Devices) Owner() string { return d.owner }

// tagPrefix starts every owner tag. An untagged device's lo_file_name is
// an image path (what an older loopvol and losetup write), which starts
// with "/" and so never with the prefix.
const tagPrefix = "loopvol:"

// OwnerTag returns the tag Attach gives the devices of owner id, "" for no
// owner: "loopvol:" and the first 8 bytes of the SHA-256 of id in hex, 24
// characters. A hash, because node IDs may be longer than the 63 bytes the
// tag has room for.
//
// The tag is the device's lo_file_name, which LOOP_CONFIGURE sets in the
// same call that binds the image, so no device is ever seen attached and
// untagged, and which LOOP_GET_STATUS64 reads back. The kernel does not
// use the name; which file backs a device is sysfs loop/backing_file,
// which Find still matches. The devices of several owners live side by
// side on one kernel: two node plugins of a test cluster on one machine,
// sharing /dev and a pool, each see only their own.
//
// A device without a tag (attached by a loopvol from before owners, or by
// losetup) belongs to no one in particular, and every owner sees it: after
// an upgrade, a node plugin still finds, tunes, grows and detaches the
// devices its predecessor attached (on a real node, all its devices are its
// own). When an owner has a tagged device of an image too, Find returns
// that one. Such a device gets its owner's tag the next time it is
// attached, after its volume is unstaged.
func OwnerTag(id string) string {
	if id == "" {
		return ""
	}
	sum := sha256.Sum256([]byte(id))
	return tagPrefix + hex.EncodeToString(sum[:8])
}

// holder is how a device's tag relates to the owner of Devices.
type holder int

const (
	heldByOwner  holder = iota // tagged with the owner's tag, or no owner asks
	heldUntagged               // no tag: every owner's (see OwnerTag)
	heldByOther                // another owner's tag
)

// holderOf classifies a device whose tag (tagOf) is tag for the owner
// whose tag is ownerTag.
func holderOf(ownerTag, tag string) holder {
	switch {
	case ownerTag == "" || tag == ownerTag:
		return heldByOwner
	case tag == "":
		return heldUntagged
	}
	return heldByOther
}

// tagOf returns the owner tag in a device's lo_file_name, "" when it holds
// none (an image path).
func tagOf(fileName []byte) string {
	name, _, _ := strings.Cut(string(fileName), "\x00")
	if !strings.HasPrefix(name, tagPrefix) {
		return ""
	}
	return name
}

// notOwned is the error of a device that holder says is another owner's.
func notOwned(devPath, tag, ownerTag string) error {
	return fmt.Errorf("%s: %w (it is tagged %s; this owner's tag is %s)", devPath, ErrNotOwned, tag, ownerTag)
}

// Interface is what the node plugin needs of loop devices. Every method is
// safe for concurrent use, also by several processes.
//
// An Interface acts for an owner (Owner), the node plugin whose node ID it
// is: Attach tags the device with the owner (OwnerTag), and the other
// methods see only the owner's devices and untagged ones. Find and List
// pass over another owner's devices (FindReplaced over untagged ones
// too); Resize, Detach, Size, Status and Tune refuse them with an error
// wrapping ErrNotOwned, without changing them.
// An Interface without an owner sees every device.
type Interface interface {
	// Owner returns the owner this Interface acts for, "" for none.
	Owner() string
	// Attach attaches the image to a free loop device and returns its path
	// (/dev/loopN), tagged with the owner. It asks for direct I/O; when the
	// backing filesystem refuses direct I/O (tmpfs on old kernels, for
	// example) the device falls back to buffered I/O, which Status reports.
	// readOnly attaches a read-only device. Attach does not look for an
	// existing device of the image: call Find first.
	Attach(ctx context.Context, imagePath string, readOnly bool) (devPath string, err error)
	// AttachFile is Attach of an image already opened (and checked) by the
	// caller, read-write or read-only as readOnly says; imagePath only names
	// it in errors. It is what the node plugin uses: the pool opens the
	// image without following symlinks and checks the descriptor, and the
	// device is bound to that very file, not to whatever the path names a
	// moment later.
	AttachFile(ctx context.Context, image *os.File, imagePath string, readOnly bool) (devPath string, err error)
	// Find returns the owner's device the image is attached to: one tagged
	// with the owner, else an untagged one. ok is false, with a nil error,
	// when the owner has the image attached nowhere, also when another
	// owner has. A device whose backing file was deleted and replaced by
	// another file at the same path does not count; when the path has no
	// file at all, a device of the deleted file does, so that it can still
	// be detached.
	Find(imagePath string) (devPath string, ok bool, err error)
	// FindReplaced returns the owner's devices of a file that was at
	// imagePath and was replaced there by another (a fence renames a copy
	// over a volume's image, pkg/pool FenceImage): the devices Find passes
	// over. A device counts when its backing file was at the path (marked
	// deleted, or, on NFS, which does not mark it, not the file now at the
	// path by device and inode); never a device of the file now at the
	// path. Only devices tagged with the owner count, never untagged ones:
	// what such a device holds since the replacement is dropped with it,
	// and an untagged device may be another plugin's on the same kernel.
	// Without an owner, every device counts. With no file at the path
	// nothing was replaced, and the result is empty (Find returns the
	// device of the deleted file then).
	FindReplaced(imagePath string) ([]string, error)
	// List returns the owner's devices (tagged with the owner, or untagged)
	// that have an image attached, whatever the image.
	List() ([]string, error)
	// Resize makes the device take the current size of its image, after the
	// image has grown.
	Resize(devPath string) error
	// Detach detaches the image from the device. A device that is already
	// detached, or gone, is not an error. A device that stays open elsewhere
	// gives an error wrapping ErrBusy; the kernel then detaches it when the
	// last user closes it. A detached device that Tune made refuse discards
	// is removed (the kernel would keep that limit for its next user);
	// the next attach makes a new one.
	Detach(devPath string) error
	// Size returns the size of the device in bytes. A device with no image
	// gives an error wrapping ErrNotAttached.
	Size(devPath string) (int64, error)
	// Status describes an attached device. A device with no image gives an
	// error wrapping ErrNotAttached.
	Status(devPath string) (Status, error)
	// Tune gives an attached device the queue settings that make it fast
	// (tune_linux.go says which and why) and, unless discard is true, makes
	// it refuse discards: a thick volume's, whose fallocated image a
	// discard (a hole punch) would thin. It changes only what differs, so
	// calling it again on a device that is in use (a restarted node plugin
	// finding its devices, or a device an older plugin attached) is cheap
	// and harmless. A device with no image gives an error wrapping
	// ErrNotAttached.
	Tune(devPath string, discard bool) error
}

// Status describes an attached loop device.
type Status struct {
	// OwnerTag is the device's owner tag (OwnerTag), "" for an untagged
	// device.
	OwnerTag string
	// BackingFile is the image path as the kernel reports it, without the
	// " (deleted)" suffix.
	BackingFile string
	// Deleted is true when the image file has been unlinked.
	Deleted bool
	// DirectIO is true when the device does direct I/O on its image.
	DirectIO bool
	// ReadOnly is true for a read-only device.
	ReadOnly bool
}

var devPathRE = regexp.MustCompile(`^/dev/(loop[0-9]{1,7})$`)

// deviceName returns "loopN" for "/dev/loopN", so that no other path can
// reach an ioctl or a sysfs lookup.
func deviceName(devPath string) (string, error) {
	m := devPathRE.FindStringSubmatch(devPath)
	if m == nil {
		return "", fmt.Errorf("%q: %w", devPath, ErrInvalidDevice)
	}
	return m[1], nil
}
