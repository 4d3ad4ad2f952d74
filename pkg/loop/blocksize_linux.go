package loop

import (
	"encoding/binary"
	"os"
)

// blockSizeFor returns the logical block size to attach the image with:
// BlockSize, unless the image already holds a filesystem made with smaller
// blocks (ext2/3/4) or sectors (xfs), which the kernel refuses to mount on
// a device whose sectors are larger ("invalid argument"). Such an image was
// formatted on a device of 512-byte sectors (losetup's default, an older
// plugin, a copy from elsewhere); it gets the size its filesystem was made
// for, so it still mounts. Direct I/O stays on as long as the backing
// filesystem takes I/O of that alignment (512 on the disks seen here); the
// kernel falls back to buffered I/O otherwise, which Status reports.
//
// A blank image (mkfs comes after the attach) gets BlockSize, so every
// filesystem the plugin makes has blocks and sectors of 4096.
func blockSizeFor(image *os.File) uint32 {
	// ext2/3/4: the superblock at byte 1024; s_log_block_size at 24,
	// s_magic 0xEF53 at 56, little endian.
	ext := make([]byte, 64)
	if _, err := image.ReadAt(ext, 1024); err == nil && binary.LittleEndian.Uint16(ext[56:]) == 0xEF53 {
		if log := binary.LittleEndian.Uint32(ext[24:]); log < 2 {
			return 1024 << log
		}
	}
	// xfs: the superblock at byte 0; "XFSB", sb_sectsize at 102, big
	// endian.
	xfs := make([]byte, 104)
	if _, err := image.ReadAt(xfs, 0); err == nil && string(xfs[:4]) == "XFSB" {
		if sect := uint32(binary.BigEndian.Uint16(xfs[102:])); sect >= 512 && sect < BlockSize && sect&(sect-1) == 0 {
			return sect
		}
	}
	return BlockSize
}
