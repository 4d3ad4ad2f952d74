package node

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"

	"k8s.io/klog/v2"
)

// ext4 superblock fields (offsets within the superblock, which starts 1024
// bytes into the device).
const (
	ext4SuperOffset     = 1024
	ext4MagicOffset     = 0x38
	ext4Magic           = 0xEF53
	ext4BlocksLoOffset  = 0x04
	ext4LogBlockOffset  = 0x18
	ext4IncompatOffset  = 0x60
	ext4BlocksHiOffset  = 0x150
	ext4Incompat64Bit   = 0x80
	ext4SuperblockBytes = 1024
)

// ext4Size returns the size in bytes of the ext filesystem on dev, or 0 if
// dev holds none. Reading the superblock directly costs one 1 KiB read where
// dumpe2fs would cost a process per stage; no maintained Go library reads it.
func ext4Size(dev string) (size, blockSize int64, err error) {
	f, err := os.Open(dev)
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	sb := make([]byte, ext4SuperblockBytes)
	if _, err := f.ReadAt(sb, ext4SuperOffset); err != nil {
		return 0, 0, fmt.Errorf("read superblock of %s: %w", dev, err)
	}
	le := binary.LittleEndian
	if le.Uint16(sb[ext4MagicOffset:]) != ext4Magic {
		return 0, 0, nil
	}
	blocks := uint64(le.Uint32(sb[ext4BlocksLoOffset:]))
	if le.Uint32(sb[ext4IncompatOffset:])&ext4Incompat64Bit != 0 {
		blocks |= uint64(le.Uint32(sb[ext4BlocksHiOffset:])) << 32
	}
	blockSize = int64(1024) << le.Uint32(sb[ext4LogBlockOffset:])
	return int64(blocks) * blockSize, blockSize, nil
}

// growExt4BeforeMount grows an ext4 filesystem that is smaller than its
// device (the volume was expanded while it was not staged) before it is
// mounted. Offline growth needs no CAP_SYS_RESOURCE, which the kernel asks
// for online ext4 resizing, and is faster than growing later while mounted.
func (n *node) growExt4BeforeMount(ctx context.Context, dev string, readOnly bool) error {
	if readOnly || n.ext4Size == nil {
		return nil
	}
	fsSize, blockSize, err := n.ext4Size(dev)
	if err != nil || fsSize == 0 {
		return err
	}
	devSize, err := n.Loop.Size(dev)
	if err != nil {
		return err
	}
	if devSize-fsSize < blockSize {
		return nil
	}
	exec := n.withContext(ctx).Exec
	// resize2fs insists on a freshly checked filesystem when it is offline;
	// -p repairs only what is safe to repair without asking.
	if out, err := exec.Command("e2fsck", "-f", "-p", dev).CombinedOutput(); err != nil {
		if code, ok := exitCode(err); !ok || code > 1 { // 1: errors corrected
			return fmt.Errorf("e2fsck %s before growing it: %w: %s", dev, err, out)
		}
	}
	if out, err := exec.Command("resize2fs", dev).CombinedOutput(); err != nil {
		return fmt.Errorf("resize2fs %s: %w: %s", dev, err, out)
	}
	klog.FromContext(ctx).V(2).Info("Grew the filesystem before mounting it", "device", dev, "fromBytes", fsSize, "toBytes", devSize)
	return nil
}

// exitCode extracts a command's exit status.
func exitCode(err error) (int, bool) {
	type exitStatus interface{ ExitStatus() int }
	if e, ok := err.(exitStatus); ok {
		return e.ExitStatus(), true
	}
	return 0, false
}
