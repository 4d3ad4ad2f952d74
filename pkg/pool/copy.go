package pool

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// Copy methods of a snapshot or a volume made from a source.
const (
	// CopyReflink: FICLONE, the new image shares the source's blocks until
	// either is written (xfs with reflink=1, btrfs). Instant.
	CopyReflink = "reflink"
	// CopyData: the source's data ranges copied with copy_file_range,
	// holes kept (ext4 and every other filesystem).
	CopyData = "copy"
)

// Progress is told, after each data range of a copy, how many bytes of
// the source's size have been walked.
type Progress func(doneBytes, totalBytes int64)

// reflink makes dst share src's blocks. It returns false, with no error,
// when the filesystem cannot do it, so that the caller copies instead.
func reflink(dst, src *os.File) (bool, error) {
	err := unix.IoctlFileClone(int(dst.Fd()), int(src.Fd()))
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, unix.EOPNOTSUPP), errors.Is(err, unix.ENOTTY), errors.Is(err, unix.EXDEV),
		errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOSYS), errors.Is(err, unix.EPERM):
		return false, nil
	default:
		return false, fmt.Errorf("clone %s into %s: %w", src.Name(), dst.Name(), err)
	}
}

// dataRanges calls fn for each range [off, end) of src that holds data,
// up to size, as SEEK_DATA and SEEK_HOLE report them: the holes of a
// sparse image (and, on ext4, the unwritten extents of a fallocated one)
// are skipped. A filesystem without SEEK_DATA reports one range, all data.
func dataRanges(src *os.File, size int64, fn func(off, end int64) error) error {
	fd := int(src.Fd())
	for off := int64(0); off < size; {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return nil // only a hole is left
		}
		if err != nil {
			return fmt.Errorf("seek data in %s: %w", src.Name(), err)
		}
		if data >= size {
			return nil
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("seek hole in %s: %w", src.Name(), err)
		}
		hole = min(hole, size)
		if err := fn(data, hole); err != nil {
			return err
		}
		off = hole
	}
	return nil
}

// allocatedData returns how many bytes of src's first size bytes hold
// data: what a copy of it needs.
func allocatedData(src *os.File, size int64) (int64, error) {
	var n int64
	err := dataRanges(src, size, func(off, end int64) error {
		n += end - off
		return nil
	})
	return n, err
}

// reserveData allocates in dst the data ranges of src (fallocate, so the
// copy that follows cannot run out of space half-way); the caller holds
// the pool lock around its space check and this.
func reserveData(dst, src *os.File, size int64) error {
	return dataRanges(src, size, func(off, end int64) error {
		err := unix.Fallocate(int(dst.Fd()), unix.FALLOC_FL_KEEP_SIZE, off, end-off)
		if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOSYS) {
			return nil
		}
		if errors.Is(err, unix.ENOSPC) {
			return fmt.Errorf("reserve %d bytes for %s: %w", end-off, dst.Name(), ErrNoSpace)
		}
		return err
	})
}

// copyData copies the data ranges of src's first size bytes into dst at
// the same offsets with copy_file_range (which the kernel may itself turn
// into a reflink or a server-side copy); holes stay holes. Between two
// filesystems, where the kernel refuses copy_file_range (EXDEV: a move to
// a pool on another filesystem), it reads and writes instead. dst must be
// at least size bytes long already.
func copyData(dst, src *os.File, size int64, progress Progress) error {
	buffered := false
	return dataRanges(src, size, func(off, end int64) error {
		roff, woff := off, off
		for roff < end {
			if buffered {
				if err := copyRange(dst, src, roff, end); err != nil {
					return err
				}
				roff = end
				break
			}
			n, err := unix.CopyFileRange(int(src.Fd()), &roff, int(dst.Fd()), &woff, int(min(end-roff, 1<<30)), 0)
			if errors.Is(err, unix.EXDEV) || errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOSYS) {
				buffered = true
				continue
			}
			if errors.Is(err, unix.ENOSPC) {
				return fmt.Errorf("copy %s into %s: %w", src.Name(), dst.Name(), ErrNoSpace)
			}
			if err != nil {
				return fmt.Errorf("copy %s into %s at %d: %w", src.Name(), dst.Name(), roff, err)
			}
			if n == 0 {
				return fmt.Errorf("copy %s into %s: source ended at %d, before its size %d", src.Name(), dst.Name(), roff, size)
			}
		}
		if progress != nil {
			progress(end, size)
		}
		return nil
	})
}

// copyRange copies [off, end) of src into dst at the same offsets through
// a buffer: the copy_file_range fallback.
func copyRange(dst, src *os.File, off, end int64) error {
	buf := make([]byte, min(end-off, 4<<20))
	for off < end {
		n, err := src.ReadAt(buf[:min(int64(len(buf)), end-off)], off)
		if n > 0 {
			if _, werr := dst.WriteAt(buf[:n], off); werr != nil {
				if errors.Is(werr, unix.ENOSPC) {
					return fmt.Errorf("copy %s into %s: %w", src.Name(), dst.Name(), ErrNoSpace)
				}
				return fmt.Errorf("copy %s into %s at %d: %w", src.Name(), dst.Name(), off, werr)
			}
			off += int64(n)
			continue
		}
		if err != nil {
			return fmt.Errorf("copy %s into %s at %d: %w", src.Name(), dst.Name(), off, err)
		}
	}
	return nil
}
