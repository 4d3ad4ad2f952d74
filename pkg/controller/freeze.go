package controller

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/loopvol/loopvol/pkg/loop"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
	"k8s.io/mount-utils"
)

// A snapshot of a mounted volume is at least crash-consistent (snapshot.go).
// When the volume is mounted on the controller's own node (one-node
// installations, --mode=all, a controller beside the node plugin) loopvol
// does better: it freezes the filesystem (FIFREEZE: dirty data is written,
// the journal is clean, new writes wait) for the clone and thaws it
// (FITHAW) right after, on every path, so the snapshot is a clean
// filesystem that mounts without recovery. Elsewhere the controller cannot
// reach the mount and the snapshot stays crash-consistent.
//
// The freeze lasts as long as the clone: nothing for a reflink, the copy's
// time on the copy path (writers of the volume wait meanwhile). Were the
// process killed while frozen, the filesystem would stay frozen until
// someone thaws it (fsfreeze -u <staging path>); the deferred thaw covers
// every return and panic, not a SIGKILL.

// The ioctls of linux/fs.h, _IOWR('X', 119, int) and _IOWR('X', 120, int);
// golang.org/x/sys/unix does not define them.
const (
	ioctlFIFREEZE = 0xC0045877
	ioctlFITHAW   = 0xC0045878
)

// freezer freezes the filesystem on a volume's image where this process
// can see it mounted.
type freezer struct {
	loop loop.Interface
	// mountInfo is the mount table read, /proc/self/mountinfo.
	mountInfo string
}

// thawFunc undoes a freeze; it is safe to call when nothing was frozen.
type thawFunc func()

// freeze freezes the filesystem on image if this process sees it mounted:
// the loop device the image is attached to, the mount of that device's
// filesystem (its root, not a bind of a subdirectory; mount-utils' reading of
// the host's mount table, as pkg/node reads it). It returns a no-op thaw
// when the image is not attached here, when the device holds no mounted
// filesystem (a raw block volume: its user's writes are its own), or when
// the filesystem cannot be frozen; those snapshots are crash-consistent.
// An error is returned only when a freeze was possible and failed.
func (f *freezer) freeze(ctx context.Context, image string) (thawFunc, error) {
	noop := func() {}
	if f == nil || f.loop == nil {
		return noop, nil
	}
	logger := klog.FromContext(ctx)
	dev, ok, err := f.loop.Find(image)
	if err != nil || !ok {
		if err != nil {
			logger.V(4).Info("Cannot tell whether the volume is attached here; the snapshot is crash-consistent", "image", image, "err", err)
		}
		return noop, nil
	}
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil {
		return noop, nil
	}
	mounts, err := mount.ParseMountInfo(f.mountInfo)
	if err != nil {
		logger.V(4).Info("Cannot read the mount table; the snapshot is crash-consistent", "err", err)
		return noop, nil
	}
	major, minor := int(unix.Major(st.Rdev)), int(unix.Minor(st.Rdev))
	for _, m := range mounts {
		if m.Major != major || m.Minor != minor || m.Root != "/" {
			continue
		}
		return freezeAt(ctx, m.MountPoint, dev)
	}
	return noop, nil
}

// freezeAt freezes the filesystem mounted at dir. EBUSY means it is frozen
// already (by an administrator or another snapshot of the same volume): it
// is consistent, and the thaw is left to whoever froze it. EOPNOTSUPP means
// the filesystem cannot be frozen.
func freezeAt(ctx context.Context, dir, dev string) (thawFunc, error) {
	logger := klog.FromContext(ctx)
	noop := func() {}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return noop, fmt.Errorf("open %s to freeze it: %w", dir, err)
	}
	err = unix.IoctlSetInt(fd, ioctlFIFREEZE, 0)
	switch {
	case errors.Is(err, unix.EBUSY):
		unix.Close(fd)
		logger.V(2).Info("Filesystem is frozen already; leaving its thaw to whoever froze it", "mountPoint", dir, "device", dev)
		return noop, nil
	case errors.Is(err, unix.EOPNOTSUPP), errors.Is(err, unix.ENOTTY):
		unix.Close(fd)
		logger.V(2).Info("Filesystem cannot be frozen; the snapshot is crash-consistent", "mountPoint", dir, "device", dev)
		return noop, nil
	case err != nil:
		unix.Close(fd)
		return noop, fmt.Errorf("freeze the filesystem at %s (%s): %w", dir, dev, os.NewSyscallError("FIFREEZE", err))
	}
	logger.V(4).Info("Froze filesystem", "mountPoint", dir, "device", dev)
	return func() {
		if err := unix.IoctlSetInt(fd, ioctlFITHAW, 0); err != nil {
			// Nothing the caller can do better than say so loudly:
			// the volume's writers wait until it is thawed.
			logger.Error(err, "Filesystem could not be thawed; thaw it by hand with fsfreeze -u", "mountPoint", dir, "device", dev)
		} else {
			logger.V(4).Info("Thawed filesystem", "mountPoint", dir, "device", dev)
		}
		unix.Close(fd)
	}, nil
}
