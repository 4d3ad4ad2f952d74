package loop

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

const (
	controlPath = "/dev/loop-control"
	sysBlock    = "/sys/block"
	// deletedSuffix is what the kernel appends to backing_file once the image
	// has been unlinked.
	deletedSuffix = " (deleted)"
	// maxAttachAttempts bounds the retries when other processes take the free
	// device between LOOP_CTL_GET_FREE and LOOP_CONFIGURE.
	maxAttachAttempts = 64
	// detachWait is how long Detach waits for a device that someone else
	// briefly holds open (udev's blkid probe, typically) to let go.
	detachWait = time.Second
)

var _ Interface = Devices{}

// Attach implements Interface.
func (d Devices) Attach(ctx context.Context, imagePath string, readOnly bool) (string, error) {
	path, err := absClean(imagePath)
	if err != nil {
		return "", err
	}
	mode := os.O_RDWR
	if readOnly {
		mode = os.O_RDONLY
	}
	// The kernel takes its own reference to the file; ours is closed on return.
	backing, err := os.OpenFile(path, mode|unix.O_NOFOLLOW, 0)
	if err != nil {
		return "", fmt.Errorf("open image: %w", err)
	}
	defer backing.Close()
	return d.AttachFile(ctx, backing, path, readOnly)
}

// AttachFile implements Interface.
func (d Devices) AttachFile(ctx context.Context, backing *os.File, path string, readOnly bool) (string, error) {
	st, err := backing.Stat()
	if err != nil {
		return "", fmt.Errorf("image %s: %w", path, err)
	}
	if !st.Mode().IsRegular() {
		return "", fmt.Errorf("image %s is not a regular file (%s)", path, st.Mode().Type())
	}
	ctl, err := os.OpenFile(controlPath, os.O_RDWR, 0)
	if err != nil {
		return "", fmt.Errorf("open %s: %w", controlPath, err)
	}
	defer ctl.Close()

	directIO := true
	for attempt := 1; ; attempt++ {
		if err := ctx.Err(); err != nil {
			return "", fmt.Errorf("attach %s: %w", path, err)
		}
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return "", fmt.Errorf("LOOP_CTL_GET_FREE: %w", err)
		}
		devPath := "/dev/loop" + strconv.Itoa(n)
		err = configure(devPath, backing, path, d.tag, readOnly, directIO)
		switch {
		case err == nil:
			return devPath, nil
		case errors.Is(err, unix.EINVAL) && directIO:
			// Old kernels refuse LOOP_CONFIGURE outright when the backing
			// filesystem cannot do direct I/O, instead of falling back
			// themselves; a failed configure leaves the device free.
			directIO = false
		case (errors.Is(err, unix.EBUSY) || errors.Is(err, unix.ENXIO) || errors.Is(err, fs.ErrNotExist)) &&
			attempt < maxAttachAttempts:
			// Another process configured (or removed) the device that
			// LOOP_CTL_GET_FREE handed to both of us: ask for another.
		default:
			return "", fmt.Errorf("attach %s to %s: %w", path, devPath, err)
		}
	}
}

// configure binds backing to the free device devPath with LOOP_CONFIGURE,
// which sets the file, flags, block size and owner tag in one call, so the
// device never appears half set up (or without its owner) to udev or to
// another process.
func configure(devPath string, backing *os.File, path, tag string, readOnly, directIO bool) error {
	name, _ := deviceName(devPath)
	if err := ensureNode(devPath, name); err != nil {
		return err
	}
	dev, err := os.OpenFile(devPath, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", devPath, err)
	}
	defer dev.Close()
	cfg := unix.LoopConfig{Fd: uint32(backing.Fd()), Size: blockSizeFor(backing)}
	if directIO {
		cfg.Info.Flags |= unix.LO_FLAGS_DIRECT_IO
	}
	if readOnly {
		cfg.Info.Flags |= unix.LO_FLAGS_READ_ONLY
	}
	// lo_file_name is informational (backing_file is the truth for the
	// path): it carries the owner's tag, or without an owner the path, as
	// before owners existed.
	copy(cfg.Info.File_name[:len(cfg.Info.File_name)-1], cmp.Or(tag, path))
	if err := unix.IoctlLoopConfigure(int(dev.Fd()), &cfg); err != nil {
		return fmt.Errorf("LOOP_CONFIGURE: %w", err)
	}
	return nil
}

// ensureNode creates /dev/loopN when the kernel made the device but /dev is
// not a devtmpfs that shows it (some container setups).
func ensureNode(devPath, name string) error {
	if _, err := os.Stat(devPath); !errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	data, err := os.ReadFile(filepath.Join(sysBlock, name, "dev"))
	if err != nil {
		return fmt.Errorf("device number of %s: %w", name, err)
	}
	var major, minor uint32
	if _, err := fmt.Sscanf(strings.TrimSpace(string(data)), "%d:%d", &major, &minor); err != nil {
		return fmt.Errorf("device number of %s: %q: %w", name, data, err)
	}
	err = unix.Mknod(devPath, unix.S_IFBLK|0o660, int(unix.Mkdev(major, minor)))
	if err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("mknod %s: %w", devPath, err)
	}
	return nil
}

// Find implements Interface.
func (d Devices) Find(imagePath string) (string, bool, error) {
	path, resolved, st, imageExists, err := imageAt(imagePath)
	if err != nil {
		return "", false, err
	}

	names, err := attachedNames()
	if err != nil {
		return "", false, err
	}
	untagged := "" // the first untagged device of the image
	for _, name := range names {
		backing, deleted, err := backingFile(name)
		if errors.Is(err, ErrNotAttached) {
			continue
		}
		if err != nil {
			return "", false, err
		}
		devPath := "/dev/" + name
		byPath := backing == path || backing == resolved
		switch {
		case byPath && imageExists && deleted:
			continue // the file now at the path is another one
		case !byPath && (!imageExists || deleted || !strings.HasSuffix(backing, "/"+filepath.Base(path))):
			// The kernel prints the path through the mount the image was
			// opened by. When that mount is gone (the node plugin's
			// container restarted, and with it the bind mount of the pool
			// it attached through), the path is printed relative to the
			// mount's root ("/volumes/<id>.img"): such a device is matched
			// by the image's device and inode below. Only devices whose
			// path ends in the image's name are asked, so a Find costs
			// one ioctl per candidate, not per loop device.
			continue
		}
		// One LOOP_GET_STATUS64 tells the owner and the file. Same path,
		// but is it the same file? A deleted and re-created image on a
		// filesystem that does not mark it " (deleted)" (NFS) would fool
		// the path compare; device and inode do not.
		info, err := status64(devPath)
		if errors.Is(err, ErrNotAttached) || errors.Is(err, fs.ErrNotExist) {
			continue // detached while we looked
		}
		if err != nil {
			return "", false, err
		}
		if imageExists && (info.Inode != st.Ino || info.Device != st.Dev) {
			continue
		}
		switch holderOf(d.tag, tagOf(info.File_name[:])) {
		case heldByOwner:
			return devPath, true, nil
		case heldUntagged:
			if untagged == "" {
				untagged = devPath
			}
		}
	}
	return untagged, untagged != "", nil
}

// imageAt cleans imagePath and returns it, its form with symbolic links
// resolved (the kernel reports backing files that way), and the file now
// at it, if there is one.
func imageAt(imagePath string) (path, resolved string, st unix.Stat_t, exists bool, err error) {
	if path, err = absClean(imagePath); err != nil {
		return "", "", st, false, err
	}
	resolved = path
	if r, err := filepath.EvalSymlinks(path); err == nil {
		resolved = r
	} else if r, err := filepath.EvalSymlinks(filepath.Dir(path)); err == nil {
		resolved = filepath.Join(r, filepath.Base(path))
	}
	if err := unix.Stat(path, &st); errors.Is(err, unix.ENOENT) {
		return path, resolved, st, false, nil
	} else if err != nil {
		return "", "", st, false, fmt.Errorf("stat %s: %w", path, err)
	}
	return path, resolved, st, true, nil
}

// FindReplaced implements Interface.
func (d Devices) FindReplaced(imagePath string) ([]string, error) {
	path, resolved, st, imageExists, err := imageAt(imagePath)
	if err != nil || !imageExists {
		// No file at the path: nothing replaced the image, and Find
		// returns the device of the deleted one.
		return nil, err
	}
	names, err := attachedNames()
	if err != nil {
		return nil, err
	}
	var devs []string
	for _, name := range names {
		backing, _, err := backingFile(name)
		if errors.Is(err, ErrNotAttached) {
			continue
		}
		if err != nil {
			return nil, err
		}
		byPath := backing == path || backing == resolved
		// A path relative to the root of a mount that is gone (see Find)
		// names a file that no name reaches any more, so only its name
		// and filesystem tell: such a device counts when the path is a
		// suffix of the image's and its file is on the image's filesystem
		// (a rename over the image stays on it). A replaced file of the
		// same name elsewhere on that filesystem would count too; pool
		// images are named by their volume, so it is the same volume's.
		relative := !byPath && strings.HasPrefix(backing, "/") &&
			(strings.HasSuffix(path, backing) || strings.HasSuffix(resolved, backing))
		if !byPath && !relative {
			continue
		}
		devPath := "/dev/" + name
		info, err := status64(devPath)
		if errors.Is(err, ErrNotAttached) || errors.Is(err, fs.ErrNotExist) {
			continue // detached while we looked
		}
		if err != nil {
			return nil, err
		}
		// The file, not the " (deleted)" mark, decides: NFS does not mark
		// a file the server unlinked, and the current image is never a
		// replaced one, however its path is printed.
		if info.Inode == st.Ino && info.Device == st.Dev {
			continue
		}
		if relative && info.Device != st.Dev {
			continue
		}
		// Only the owner's own: an untagged device may be any plugin's
		// from before owners, and another owner's is that owner's to
		// clean up.
		tag := tagOf(info.File_name[:])
		if d.tag != "" && tag != d.tag {
			continue
		}
		devs = append(devs, devPath)
	}
	return devs, nil
}

// List implements Interface.
func (d Devices) List() ([]string, error) {
	names, err := attachedNames()
	if err != nil {
		return nil, err
	}
	var devs []string
	for _, name := range names {
		if _, _, err := backingFile(name); err != nil {
			continue // not attached
		}
		devPath := "/dev/" + name
		if d.tag != "" {
			info, err := status64(devPath)
			if errors.Is(err, ErrNotAttached) || errors.Is(err, fs.ErrNotExist) {
				continue
			}
			if err != nil {
				return nil, err
			}
			if holderOf(d.tag, tagOf(info.File_name[:])) == heldByOther {
				continue
			}
		}
		devs = append(devs, devPath)
	}
	return devs, nil
}

// attachedNames lists the loop devices of sysfs ("loopN"), attached or not.
func attachedNames() ([]string, error) {
	entries, err := os.ReadDir(sysBlock)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", sysBlock, err)
	}
	var names []string
	for _, e := range entries {
		if devPathRE.MatchString("/dev/" + e.Name()) {
			names = append(names, e.Name())
		}
	}
	return names, nil
}

// status64 reads the device's LOOP_GET_STATUS64: its owner tag, and the
// device and inode of its backing file.
func status64(devPath string) (*unix.LoopInfo64, error) {
	dev, err := os.OpenFile(devPath, os.O_RDONLY, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", devPath, err)
	}
	defer dev.Close()
	return statusOf(dev, devPath)
}

// statusOf is status64 through an open descriptor of the device.
func statusOf(dev *os.File, devPath string) (*unix.LoopInfo64, error) {
	info, err := unix.IoctlLoopGetStatus64(int(dev.Fd()))
	if errors.Is(err, unix.ENXIO) {
		return nil, fmt.Errorf("%s: %w", devPath, ErrNotAttached)
	}
	if err != nil {
		return nil, fmt.Errorf("LOOP_GET_STATUS64 %s: %w", devPath, err)
	}
	return info, nil
}

// hold opens the attached device devPath and checks that d may act on it
// (the owner's device or an untagged one): it fails with ErrInvalidDevice,
// ErrNotAttached or ErrNotOwned. The caller acts through, or while holding,
// the returned descriptor and then closes it. Holding it pins the check:
// while the device is open, LOOP_CLR_FD by anyone only marks it for
// autoclear on the last close, so it cannot be detached and attached again
// by another owner between the check and the act. info is the device's
// LOOP_GET_STATUS64, read through the descriptor.
func (d Devices) hold(devPath string) (name string, dev *os.File, info *unix.LoopInfo64, err error) {
	if name, err = deviceName(devPath); err != nil {
		return "", nil, nil, err
	}
	if _, _, err := backingFile(name); err != nil {
		return "", nil, nil, err
	}
	if dev, err = os.OpenFile(devPath, os.O_RDONLY, 0); err != nil {
		return "", nil, nil, fmt.Errorf("open %s: %w", devPath, err)
	}
	info, err = statusOf(dev, devPath)
	if err == nil {
		if tag := tagOf(info.File_name[:]); holderOf(d.tag, tag) == heldByOther {
			err = notOwned(devPath, tag, d.tag)
		}
	}
	if err != nil {
		dev.Close()
		return "", nil, nil, err
	}
	return name, dev, info, nil
}

// Resize implements Interface.
func (d Devices) Resize(devPath string) error {
	_, dev, _, err := d.hold(devPath)
	if err != nil {
		return err
	}
	defer dev.Close()
	if err := unix.IoctlSetInt(int(dev.Fd()), unix.LOOP_SET_CAPACITY, 0); err != nil {
		if errors.Is(err, unix.ENXIO) {
			return fmt.Errorf("resize %s: %w", devPath, ErrNotAttached)
		}
		return fmt.Errorf("LOOP_SET_CAPACITY %s: %w", devPath, err)
	}
	return nil
}

// Detach implements Interface.
func (d Devices) Detach(devPath string) error {
	name, dev, _, err := d.hold(devPath)
	switch {
	case errors.Is(err, ErrNotAttached):
		// Detached already: by us, deferred until its last user closed
		// it, in an earlier call that returned ErrBusy (or detached while
		// we looked).
		if name, err := deviceName(devPath); err == nil {
			removeLimited(name)
		}
		return nil
	case errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ENXIO):
		return nil
	case err != nil:
		return err
	}
	err = unix.IoctlSetInt(int(dev.Fd()), unix.LOOP_CLR_FD, 0)
	dev.Close()
	switch {
	case errors.Is(err, unix.ENXIO):
		return nil // detached by someone else meanwhile
	case errors.Is(err, unix.EBUSY):
		// Kernels before 5.x refuse instead of deferring.
		return fmt.Errorf("detach %s: %w", devPath, ErrBusy)
	case err != nil:
		return fmt.Errorf("LOOP_CLR_FD %s: %w", devPath, err)
	}
	// When others hold the device open, the kernel only marks it for
	// autoclear and detaches it when the last of them closes it. A transient
	// opener (udev's probe) lets go at once; a mount does not.
	deadline := time.Now().Add(detachWait)
	for {
		if _, _, err := backingFile(name); errors.Is(err, ErrNotAttached) {
			removeLimited(name)
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("detach %s: still open, the kernel detaches it on last close: %w", devPath, ErrBusy)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// removeLimited removes the detached device name when Tune made it refuse
// discards, so that the limit does not pass to whoever attaches that
// number next (tune_linux.go, discardOff). It is best effort: a device
// someone attached or opened meanwhile stays (EBUSY), with the limit.
func removeLimited(name string) {
	if !discardsLimited(name) {
		return
	}
	n, err := strconv.Atoi(strings.TrimPrefix(name, "loop"))
	if err != nil {
		return
	}
	ctl, err := os.OpenFile(controlPath, os.O_RDWR, 0)
	if err != nil {
		return
	}
	defer ctl.Close()
	_ = unix.IoctlSetInt(int(ctl.Fd()), unix.LOOP_CTL_REMOVE, n)
}

// Size implements Interface.
func (d Devices) Size(devPath string) (int64, error) {
	name, dev, _, err := d.hold(devPath)
	if err != nil {
		return 0, err
	}
	defer dev.Close()
	// sysfs reports the size in 512-byte sectors whatever the block size.
	sectors, err := readInt(filepath.Join(sysBlock, name, "size"))
	if err != nil {
		return 0, err
	}
	return sectors * 512, nil
}

// Status implements Interface.
func (d Devices) Status(devPath string) (Status, error) {
	name, dev, info, err := d.hold(devPath)
	if err != nil {
		return Status{}, err
	}
	defer dev.Close()
	backing, deleted, err := backingFile(name)
	if err != nil {
		return Status{}, err
	}
	dio, err := readInt(filepath.Join(sysBlock, name, "loop", "dio"))
	if err != nil {
		return Status{}, err
	}
	ro, err := readInt(filepath.Join(sysBlock, name, "ro"))
	if err != nil {
		return Status{}, err
	}
	return Status{OwnerTag: tagOf(info.File_name[:]), BackingFile: backing, Deleted: deleted, DirectIO: dio == 1, ReadOnly: ro == 1}, nil
}

// backingFile reads the image path of device name ("loopN") from sysfs. The
// loop/ directory exists only while an image is attached.
func backingFile(name string) (path string, deleted bool, err error) {
	data, err := os.ReadFile(filepath.Join(sysBlock, name, "loop", "backing_file"))
	if errors.Is(err, fs.ErrNotExist) {
		return "", false, fmt.Errorf("/dev/%s: %w", name, ErrNotAttached)
	}
	if err != nil {
		return "", false, fmt.Errorf("backing file of /dev/%s: %w", name, err)
	}
	path = strings.TrimSuffix(string(data), "\n")
	if p, ok := strings.CutSuffix(path, deletedSuffix); ok {
		return p, true, nil
	}
	return path, false, nil
}

func readInt(path string) (int64, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, fmt.Errorf("%s: %w", path, ErrNotAttached)
	}
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", path, err)
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parse %s: %w", path, err)
	}
	return v, nil
}

func absClean(p string) (string, error) {
	if p == "" {
		return "", errors.New("empty image path")
	}
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", fmt.Errorf("image path %q: %w", p, err)
	}
	return abs, nil
}
