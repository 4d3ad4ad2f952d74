package pool

import (
	"encoding/binary"
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// FIEMAP (linux/fiemap.h); golang.org/x/sys does not wrap it.
const (
	fsIocFiemap        = 0xC020660B // _IOWR('f', 11, struct fiemap)
	fiemapHeaderSize   = 32         // struct fiemap without its extents
	fiemapExtentSize   = 56         // struct fiemap_extent
	fiemapExtentLast   = 0x1
	fiemapExtentShared = 0x2000
	// fiemapBatch extents are asked for per call: one 28 KiB buffer,
	// however fragmented the image, so a file of millions of extents
	// costs calls, never memory.
	fiemapBatch = 512
)

// sharedBytes returns how many bytes of f's mapping the filesystem reports
// as shared with another file (FIEMAP_EXTENT_SHARED: a reflink, xfs or
// btrfs): each of them is copied when f writes over it, so it is space f
// may still need. A filesystem without FIEMAP (EOPNOTSUPP, ENOTTY) shares
// nothing. No FIEMAP_FLAG_SYNC: it would flush f, and would block on a
// filesystem frozen for a snapshot; extents are what counts here, and an
// image written through its loop device (direct I/O) has no dirty pages.
func sharedBytes(f *os.File) (int64, error) {
	buf := make([]byte, fiemapHeaderSize+fiemapBatch*fiemapExtentSize)
	var shared int64
	for start := uint64(0); ; {
		clear(buf)
		binary.NativeEndian.PutUint64(buf[0:], start)            // fm_start
		binary.NativeEndian.PutUint64(buf[8:], ^uint64(0)-start) // fm_length: to the end
		binary.NativeEndian.PutUint32(buf[24:], fiemapBatch)     // fm_extent_count
		_, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), fsIocFiemap, uintptr(unsafe.Pointer(&buf[0])))
		switch errno {
		case 0:
		case unix.EOPNOTSUPP, unix.ENOTTY:
			return 0, nil
		default:
			return 0, fmt.Errorf("fiemap %s: %w", f.Name(), errno)
		}
		mapped := min(binary.NativeEndian.Uint32(buf[20:]), fiemapBatch) // fm_mapped_extents
		if mapped == 0 {
			return shared, nil
		}
		var end uint64
		for i := range mapped {
			e := buf[fiemapHeaderSize+int(i)*fiemapExtentSize:]
			logical, length := binary.NativeEndian.Uint64(e[0:]), binary.NativeEndian.Uint64(e[16:])
			flags := binary.NativeEndian.Uint32(e[40:])
			if flags&fiemapExtentShared != 0 {
				shared += int64(length)
			}
			end = logical + length
			if flags&fiemapExtentLast != 0 {
				return shared, nil
			}
		}
		if end <= start {
			// An answer that does not move forward would loop forever.
			return 0, fmt.Errorf("fiemap %s: extents do not advance past offset %d", f.Name(), start)
		}
		start = end
	}
}
