package loop

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
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
)

// Interface is what the node plugin needs of loop devices. Every method is
// safe for concurrent use, also by several processes.
type Interface interface {
	// Attach attaches the image to a free loop device and returns its path
	// (/dev/loopN). It asks for direct I/O; when the backing filesystem refuses
	// direct I/O (tmpfs on old kernels, for example) the device falls back to
	// buffered I/O, which Status reports. readOnly attaches a read-only device.
	// Attach does not look for an existing device of the image: call Find
	// first.
	Attach(ctx context.Context, imagePath string, readOnly bool) (devPath string, err error)
	// AttachFile is Attach of an image already opened (and checked) by the
	// caller, read-write or read-only as readOnly says; imagePath only names
	// it in errors. It is what the node plugin uses: the pool opens the
	// image without following symlinks and checks the descriptor, and the
	// device is bound to that very file, not to whatever the path names a
	// moment later.
	AttachFile(ctx context.Context, image *os.File, imagePath string, readOnly bool) (devPath string, err error)
	// Find returns the device the image is attached to. ok is false, with a
	// nil error, when the image is attached nowhere. A device whose backing
	// file was deleted and replaced by another file at the same path does not
	// count; when the path has no file at all, a device of the deleted file
	// does, so that it can still be detached.
	Find(imagePath string) (devPath string, ok bool, err error)
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
