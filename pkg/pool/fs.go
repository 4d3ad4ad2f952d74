package pool

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// Every file in a pool is untrusted: a shared pool is written by every node
// that serves it, and anyone who can write the directory can put a symlink,
// a FIFO, a hard link to a host file or a gigabyte of JSON where a record or
// an image should be. So the pool's directories are opened once, at Open, and
// every operation on their files is relative to those descriptors and never
// follows a symlink; a file is checked on the descriptor that is then used
// (no path is walked twice), and what is read from it is bounded.

const (
	// MaxRecordBytes bounds a volume record, read or written. The largest
	// record loopvol makes is its name (128 bytes), a few parameters (only
	// the ones it interprets are stored, under 1 KiB) and one attachment
	// per node, at most ~170 bytes each as indented JSON: 1 MiB holds about
	// 6000 attachments, more nodes than a Kubernetes cluster has (5000).
	// WriteVolume refuses to write more, so a reader never refuses a record
	// that a writer made.
	MaxRecordBytes = 1 << 20
	// maxSmallRecordBytes bounds node records and the pool marker, a few
	// hundred bytes each.
	maxSmallRecordBytes = 64 << 10
)

// dir is one directory of a pool, held open for the pool's lifetime.
type dir struct {
	f    *os.File
	path string // for messages only, never opened again
	// uid owns the pool directory; every file the pool trusts must be
	// owned by it (it is the uid this driver's writes get, also on an
	// NFS export that squashes root).
	uid uint32
}

func (d *dir) fd() int { return int(d.f.Fd()) }

// openRoot opens the pool directory itself. Its path comes from the
// administrator (flags or --config), so symlinks in it are followed, once.
func openRoot(path string) (*dir, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open pool directory %s: %w", path, err)
	}
	d, err := newDir(fd, path)
	if err != nil {
		return nil, err
	}
	d.uid = d.ownerOf()
	return d, nil
}

func newDir(fd int, path string) (*dir, error) {
	f := os.NewFile(uintptr(fd), path)
	if f == nil {
		unix.Close(fd)
		return nil, fmt.Errorf("open %s: bad descriptor", path)
	}
	return &dir{f: f, path: path}, nil
}

func (d *dir) ownerOf() uint32 {
	var st unix.Stat_t
	if err := unix.Fstat(d.fd(), &st); err != nil {
		return ^uint32(0)
	}
	return st.Uid
}

// subdir creates (if missing) and opens the directory name inside d, never
// through a symlink, and checks that it belongs to the pool's owner.
func (d *dir) subdir(name string) (*dir, error) {
	if err := unix.Mkdirat(d.fd(), name, 0o750); err != nil && !errors.Is(err, unix.EEXIST) {
		return nil, fmt.Errorf("create %s/%s: %w", d.path, name, err)
	}
	fd, err := unix.Openat(d.fd(), name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s/%s (it must be a directory, not a symlink): %w", d.path, name, err)
	}
	sub, err := newDir(fd, d.path+"/"+name)
	if err != nil {
		return nil, err
	}
	sub.uid = d.uid
	if owner := sub.ownerOf(); owner != d.uid {
		sub.f.Close()
		return nil, fmt.Errorf("%s is owned by uid %d, the pool directory by uid %d: %w", sub.path, owner, d.uid, ErrUntrusted)
	}
	return sub, nil
}

// sameAs reports whether name in parent is still the directory d holds.
func (d *dir) sameAs(parent *dir, name string) error {
	var held, now unix.Stat_t
	if err := unix.Fstat(d.fd(), &held); err != nil {
		return fmt.Errorf("stat %s: %w", d.path, err)
	}
	if err := unix.Fstatat(parent.fd(), name, &now, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("%s: %w", d.path, err)
	}
	if held.Dev != now.Dev || held.Ino != now.Ino {
		return fmt.Errorf("%s was replaced after the pool was opened; restart the driver once it is repaired: %w", d.path, ErrUntrusted)
	}
	return nil
}

// check says why the file st describes cannot be trusted, or nil: it must be
// a regular file with one name (a hard link could be a host file), owned by
// the pool's owner.
func (d *dir) check(name string, st *unix.Stat_t) error {
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return fmt.Errorf("%s/%s is not a regular file (%s): %w", d.path, name, fileType(st.Mode), ErrUntrusted)
	case st.Nlink != 1:
		return fmt.Errorf("%s/%s has %d hard links, pool files have one: %w", d.path, name, st.Nlink, ErrUntrusted)
	case st.Uid != d.uid:
		return fmt.Errorf("%s/%s is owned by uid %d, pool files by uid %d: %w", d.path, name, st.Uid, d.uid, ErrUntrusted)
	}
	return nil
}

func fileType(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFLNK:
		return "a symlink"
	case unix.S_IFDIR:
		return "a directory"
	case unix.S_IFIFO:
		return "a FIFO"
	case unix.S_IFSOCK:
		return "a socket"
	case unix.S_IFCHR, unix.S_IFBLK:
		return "a device"
	}
	return "not a file"
}

// stat describes name in d without following a symlink. A missing file
// wraps fs.ErrNotExist.
func (d *dir) stat(name string) (unix.Stat_t, error) {
	var st unix.Stat_t
	err := unix.Fstatat(d.fd(), name, &st, unix.AT_SYMLINK_NOFOLLOW)
	if errors.Is(err, unix.ENOENT) {
		return st, fmt.Errorf("%s/%s: %w", d.path, name, fs.ErrNotExist)
	}
	if err != nil {
		return st, fmt.Errorf("stat %s/%s: %w", d.path, name, err)
	}
	return st, nil
}

// open opens a trusted regular file of d with flag (O_RDONLY or O_RDWR).
// The name is resolved once, to an O_PATH descriptor that opens nothing
// (no FIFO can block, no device is opened), and the checks run on that
// descriptor; only then is the same inode opened for I/O through
// /proc/self/fd. A missing file wraps fs.ErrNotExist, an untrusted one
// ErrUntrusted.
func (d *dir) open(name string, flag int) (*os.File, unix.Stat_t, error) {
	var st unix.Stat_t
	pfd, err := unix.Openat(d.fd(), name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil, st, fmt.Errorf("%s/%s: %w", d.path, name, fs.ErrNotExist)
	}
	if err != nil {
		return nil, st, fmt.Errorf("open %s/%s: %w", d.path, name, err)
	}
	defer unix.Close(pfd)
	if err := unix.Fstat(pfd, &st); err != nil {
		return nil, st, fmt.Errorf("stat %s/%s: %w", d.path, name, err)
	}
	if err := d.check(name, &st); err != nil {
		return nil, st, err
	}
	fd, err := unix.Open("/proc/self/fd/"+strconv.Itoa(pfd), flag|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, st, fmt.Errorf("open %s/%s: %w", d.path, name, err)
	}
	f := os.NewFile(uintptr(fd), d.path+"/"+name)
	var again unix.Stat_t
	if err := unix.Fstat(fd, &again); err != nil || again.Dev != st.Dev || again.Ino != st.Ino {
		f.Close()
		return nil, st, fmt.Errorf("%s/%s changed while it was opened: %w", d.path, name, ErrUntrusted)
	}
	return f, st, nil
}

// readRecord decodes the JSON record name into v, reading at most limit
// bytes. A missing record wraps ErrNotFound; one that is not a trusted
// regular file, is too large or does not decode wraps ErrCorrupt.
func (d *dir) readRecord(name string, v any, limit int64) error {
	f, st, err := d.open(name, unix.O_RDONLY)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("record %s/%s: %w", d.path, name, ErrNotFound)
	case errors.Is(err, ErrUntrusted):
		return fmt.Errorf("record %w: %w", err, ErrCorrupt)
	case err != nil:
		return fmt.Errorf("read record: %w", err)
	}
	defer f.Close()
	if st.Size > limit {
		return fmt.Errorf("record %s is %d bytes, more than the %d a record may have: %w", f.Name(), st.Size, limit, ErrCorrupt)
	}
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return fmt.Errorf("read record %s: %w", f.Name(), err)
	}
	if int64(len(data)) > limit {
		return fmt.Errorf("record %s grew past %d bytes while it was read: %w", f.Name(), limit, ErrCorrupt)
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("record %s does not parse (%v): %w", f.Name(), err, ErrCorrupt)
	}
	return nil
}

// tempPrefix starts the name of a record's temporary file; Sweep finds the
// ones a killed process left by it.
func tempPrefix(name string) string { return "." + name + ".tmp-" }

// writeRecord stores v as JSON under name so that a crash at any point
// leaves either the old record or the new one: write a temporary file in the
// same directory, fsync it, rename it over name, fsync the directory. A
// record larger than limit is refused (ErrTooLarge).
func (d *dir) writeRecord(name string, v any, limit int) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encode %s/%s: %w", d.path, name, err)
	}
	data = append(data, '\n')
	if len(data) > limit {
		return fmt.Errorf("record %s/%s would be %d bytes, more than the %d a record may have: %w", d.path, name, len(data), limit, ErrTooLarge)
	}
	var rnd [8]byte
	rand.Read(rnd[:])
	tmp := tempPrefix(name) + hex.EncodeToString(rnd[:])
	fd, err := unix.Openat(d.fd(), tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("create temporary record in %s: %w", d.path, err)
	}
	f := os.NewFile(uintptr(fd), d.path+"/"+tmp)
	done := false
	defer func() {
		if !done {
			f.Close()
			unix.Unlinkat(d.fd(), tmp, 0)
		}
	}()
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("write %s: %w", f.Name(), err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", f.Name(), err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", f.Name(), err)
	}
	if err := unix.Renameat(d.fd(), tmp, d.fd(), name); err != nil {
		return fmt.Errorf("rename record %s/%s into place: %w", d.path, name, err)
	}
	done = true
	return d.sync()
}

// sync makes renames and unlinks in d durable.
func (d *dir) sync() error {
	if err := d.f.Sync(); err != nil {
		return fmt.Errorf("fsync directory %s: %w", d.path, err)
	}
	return nil
}

// remove unlinks name from d (a symlink itself, never its target). A missing
// file is not an error.
func (d *dir) remove(name string) error {
	if err := unix.Unlinkat(d.fd(), name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("remove %s/%s: %w", d.path, name, err)
	}
	return nil
}

// names lists the entries of d. It reads through a fresh descriptor of the
// same directory (no path walk), so concurrent listings do not share an
// offset.
func (d *dir) names() ([]string, error) {
	fd, err := unix.Openat(d.fd(), ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", d.path, err)
	}
	f := os.NewFile(uintptr(fd), d.path)
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", d.path, err)
	}
	return names, nil
}
