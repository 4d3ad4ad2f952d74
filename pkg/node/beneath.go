package node

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/loopvol/loopvol/pkg/volspec"
)

// Paths below the kubelet directory are resolved once, here, and every later
// step acts on what was resolved: the descriptors of the object and of its
// parent directory. A path that is checked as a string and used again as a
// string is walked twice, and whoever can rename or replace a component
// between the two walks (anyone who can write somewhere under the kubelet
// directory) decides what the second walk reaches.
//
// The walk refuses symbolic links in every component below the kubelet
// directory (openat2 with RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS, or an
// O_NOFOLLOW walk one component at a time where openat2 is missing). Kubelet
// never puts a symbolic link into the staging and target paths it hands to a
// CSI driver, so this costs nothing and makes the canonical path of an
// object simply the kubelet directory's own path joined with the rest. That
// canonical path is what the mount table is compared with, so a target
// reached in two spellings is one target. The kubelet directory itself is
// configuration and may be a symbolic link (it is opened normally).

// errNotOwn: a path leads through or to something the driver does not put
// there (a symbolic link, a file where a directory belongs, a device node).
var errNotOwn = volspec.NewKind(volspec.ErrInvalid, "path is not the driver's to use")

// resolved is a path resolved beneath the kubelet directory. parent is an
// O_PATH descriptor of the directory holding the object; fd one of the
// object itself, or -1 when nothing exists there. When the object is a mount
// point, fd is of the mount on top (the walk crosses mount points).
type resolved struct {
	path   string // canonical path
	parent int
	name   string
	fd     int
	mode   uint32 // S_IFMT bits of the object; 0 when it does not exist
}

// exists reports whether something is at the path.
func (r *resolved) exists() bool { return r.fd >= 0 }

// isDir and isFile report the kind of the object.
func (r *resolved) isDir() bool  { return r.mode == unix.S_IFDIR }
func (r *resolved) isFile() bool { return r.mode == unix.S_IFREG }

// proc is the path through which the kernel reaches exactly the resolved
// object, with no walk of its own: the descriptor's magic link. It is for
// system calls of this process only; a child process has other descriptors.
func (r *resolved) proc() string { return procFd(r.fd) }

func procFd(fd int) string { return "/proc/self/fd/" + strconv.Itoa(fd) }

// closeFd releases the descriptor of the object (an open descriptor of a
// mount, even an O_PATH one, makes unmounting it fail with EBUSY); reopen
// opens it again.
func (r *resolved) closeFd() {
	if r.fd >= 0 {
		_ = unix.Close(r.fd)
		r.fd = -1
	}
}

// close releases the descriptors.
func (r *resolved) close() {
	if r == nil {
		return
	}
	r.closeFd()
	if r.parent >= 0 {
		_ = unix.Close(r.parent)
		r.parent = -1
	}
}

// reopen opens the object again by its name in the resolved parent: after a
// mount or an unmount at the path, the old descriptor still names what was
// there before.
func (r *resolved) reopen() error {
	fd, mode, err := openChild(r.parent, r.name)
	if errors.Is(err, unix.ENOENT) {
		fd, mode, err = -1, 0, nil
	}
	if err != nil {
		return fmt.Errorf("open %s again: %w", r.path, err)
	}
	if r.fd >= 0 {
		_ = unix.Close(r.fd)
	}
	r.fd, r.mode = fd, mode
	return nil
}

// resolve resolves the checked, clean path p strictly below the kubelet
// directory. With create, missing directories up to and including the
// parent are made (mkdirat in the resolved parent, 0750). A missing parent
// without create gives an error of kind errPathMissing; a symbolic link or a
// non-directory on the way one of kind errNotOwn. The object itself need not
// exist. The caller closes the result.
func (n *node) resolve(p string, create bool) (*resolved, error) {
	rel, ok := strings.CutPrefix(p, n.kubeletDir+"/")
	if !ok || rel == "" {
		return nil, volspec.Errorf(volspec.ErrInvalid, "%s is not below the kubelet directory %s", p, n.kubeletDir)
	}
	comps := strings.Split(rel, "/")
	root, err := unix.Open(n.kubeletDir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open the kubelet directory %s: %w", n.kubeletDir, err)
	}
	parent, err := walkDirs(root, comps[:len(comps)-1], create)
	if err != nil {
		return nil, pathError(p, err)
	}
	r := &resolved{path: n.canonical(p), parent: parent, name: comps[len(comps)-1], fd: -1}
	if err := r.reopen(); err != nil {
		r.close()
		return nil, pathError(p, err)
	}
	return r, nil
}

// pathError gives the errors of a walk their kind.
func pathError(p string, err error) error {
	switch {
	case errors.Is(err, unix.ENOENT):
		return volspec.Errorf(errPathMissing, "%s: %w", p, err)
	case errors.Is(err, unix.ELOOP), errors.Is(err, unix.ENOTDIR), errors.Is(err, unix.EXDEV):
		return volspec.Errorf(errNotOwn, "%s leads through a symbolic link or a non-directory: %w", p, err)
	}
	return fmt.Errorf("%s: %w", p, err)
}

// walkDirs opens the directories comps one below the other, starting at
// the descriptor dir, which it takes over (closes). It returns a descriptor
// of the last one.
func walkDirs(dir int, comps []string, create bool) (int, error) {
	if len(comps) == 0 {
		return dir, nil
	}
	// One system call for the whole walk when it exists.
	if fd, err := openBeneath(dir, strings.Join(comps, "/"), unix.O_DIRECTORY); err == nil {
		_ = unix.Close(dir)
		return fd, nil
	} else if !errors.Is(err, unix.ENOENT) || !create {
		_ = unix.Close(dir)
		return -1, err
	}
	for _, c := range comps {
		fd, err := openBeneath(dir, c, unix.O_DIRECTORY)
		if errors.Is(err, unix.ENOENT) {
			// Made relative to the descriptor, so the directory lands where
			// the walk is, not wherever the path string now leads.
			if err := unix.Mkdirat(dir, c, 0o750); err != nil && !errors.Is(err, unix.EEXIST) {
				_ = unix.Close(dir)
				return -1, fmt.Errorf("create %s: %w", c, err)
			}
			fd, err = openBeneath(dir, c, unix.O_DIRECTORY)
		}
		_ = unix.Close(dir)
		if err != nil {
			return -1, err
		}
		dir = fd
	}
	return dir, nil
}

// openChild opens the single entry name of the directory dir without
// following it if it is a symbolic link, and returns its file type.
func openChild(dir int, name string) (int, uint32, error) {
	fd, err := openBeneath(dir, name, unix.O_NOFOLLOW)
	if err != nil {
		return -1, 0, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); errors.Is(err, unix.EIO) {
		// The root of a filesystem that answers every stat with EIO (an
		// xfs that shut down): it is there, of no kind we can tell, and it
		// must still be found and unmounted (sysMounts.at).
		return fd, modeUnreadable, nil
	} else if err != nil {
		_ = unix.Close(fd)
		return -1, 0, err
	}
	return fd, st.Mode & unix.S_IFMT, nil
}

// modeUnreadable is the mode of an object whose stat failed with EIO: all
// the type bits, which no real object has, so it is neither a directory
// nor a file.
const modeUnreadable = unix.S_IFMT

// noOpenat2 is set once openat2 proved missing (ENOSYS, or a seccomp filter
// that answers EPERM), so that every later walk goes straight to the
// fallback.
var noOpenat2 atomic.Bool

// openBeneath opens the relative path rel below dir as an O_PATH descriptor,
// following no symbolic link on the way and never leaving dir. flags may add
// O_DIRECTORY (the object must be a directory) or O_NOFOLLOW (a symbolic
// link as the last component is opened itself rather than refused).
func openBeneath(dir int, rel string, flags int) (int, error) {
	if !noOpenat2.Load() {
		fd, err := unix.Openat2(dir, rel, &unix.OpenHow{
			Flags:   uint64(unix.O_PATH | unix.O_CLOEXEC | flags),
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
		})
		if !errors.Is(err, unix.ENOSYS) && !errors.Is(err, unix.EPERM) {
			return fd, err
		}
		noOpenat2.Store(true)
	}
	return walkNoFollow(dir, rel, flags)
}

// walkNoFollow is openBeneath without openat2: one component at a time,
// each opened with O_NOFOLLOW, so a symbolic link is never followed. The
// components are plain names (the paths were checked: no "..", no "."), so
// the walk cannot leave dir either.
func walkNoFollow(dir int, rel string, flags int) (int, error) {
	comps := strings.Split(rel, "/")
	cur := dir
	for i, c := range comps {
		if c == "" || c == "." || c == ".." {
			if cur != dir {
				_ = unix.Close(cur)
			}
			return -1, unix.EXDEV
		}
		f := unix.O_PATH | unix.O_CLOEXEC | unix.O_NOFOLLOW | unix.O_DIRECTORY
		last := i == len(comps)-1
		if last {
			f = unix.O_PATH | unix.O_CLOEXEC | unix.O_NOFOLLOW | flags
		}
		fd, err := unix.Openat(cur, c, f, 0)
		if cur != dir {
			_ = unix.Close(cur)
		}
		if err != nil {
			return -1, err
		}
		if !last || flags&unix.O_NOFOLLOW == 0 {
			// O_PATH|O_NOFOLLOW opens a symbolic link itself instead of
			// failing; only the caller that asked for that gets it.
			var st unix.Stat_t
			if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT == unix.S_IFLNK {
				_ = unix.Close(fd)
				if err == nil {
					err = unix.ELOOP
				}
				return -1, err
			}
		}
		cur = fd
	}
	return cur, nil
}

// mkdirTarget makes the final directory of r if it is missing; a
// directory that is already there is used. Anything else is errNotOwn.
// created tells whether this call made it.
func mkdirTarget(r *resolved) (created bool, err error) {
	if !r.exists() {
		if err := unix.Mkdirat(r.parent, r.name, 0o750); err != nil && !errors.Is(err, unix.EEXIST) {
			return false, fmt.Errorf("create %s: %w", r.path, err)
		} else if err == nil {
			created = true
		}
		if err := r.reopen(); err != nil {
			return created, err
		}
	}
	if !r.isDir() {
		return created, volspec.Errorf(errNotOwn, "%s is not a directory (%s)", r.path, fileType(r.mode))
	}
	return created, nil
}

// mkfileTarget makes the file a raw-block volume is bind-mounted onto, if
// it is missing; a regular file that is already there is used.
func mkfileTarget(r *resolved) (created bool, err error) {
	if !r.exists() {
		fd, err := unix.Openat(r.parent, r.name, unix.O_CREAT|unix.O_EXCL|unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o640)
		switch {
		case err == nil:
			_ = unix.Close(fd)
			created = true
		case !errors.Is(err, unix.EEXIST):
			return false, fmt.Errorf("create %s: %w", r.path, err)
		}
		if err := r.reopen(); err != nil {
			return created, err
		}
	}
	if !r.isFile() {
		return created, volspec.Errorf(errNotOwn, "%s is not a regular file (%s)", r.path, fileType(r.mode))
	}
	return created, nil
}

// remove removes the object of r by its name in the resolved parent: an
// empty directory or, with file, a regular file. unlinkat follows no
// symbolic link, and removes only an empty directory. A missing object is
// not an error.
func remove(r *resolved, file bool) error {
	flags := unix.AT_REMOVEDIR
	if file {
		flags = 0
	}
	if err := unix.Unlinkat(r.parent, r.name, flags); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("remove %s: %w", r.path, err)
	}
	return nil
}

// fileType names a file type for messages.
func fileType(mode uint32) string {
	switch mode {
	case 0:
		return "nothing"
	case unix.S_IFDIR:
		return "directory"
	case unix.S_IFREG:
		return "regular file"
	case unix.S_IFLNK:
		return "symbolic link"
	case unix.S_IFBLK:
		return "block device"
	case unix.S_IFCHR:
		return "character device"
	case unix.S_IFIFO:
		return "FIFO"
	case unix.S_IFSOCK:
		return "socket"
	}
	return os.FileMode(mode).String()
}
