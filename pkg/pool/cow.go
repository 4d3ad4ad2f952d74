package pool

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// Copy-on-write reserve.
//
// On a filesystem with reflinks (xfs reflink=1) a snapshot, a clone or a
// restore shares its source's data blocks instead of copying them. The
// blocks are counted once by statfs, but a volume that writes over a shared
// block gets a new one: a thick volume, whose whole image was allocated when
// it was made, would otherwise run out of space writing over its own data
// once the pool had given the "free" blocks to other volumes (ENOSPC in its
// loop device, the filesystem inside shuts down), and a thin one would lose
// the promise its size stands for in the same way.
//
// So every volume image (never a snapshot's: those are never written) keeps
// its shared bytes, as FIEMAP reports them now, out of the pool's
// AvailableBytes: what a snapshot of a volume costs in offered capacity is
// what a full copy would, though it takes neither the time nor the blocks
// of one. The reserve follows the images: a block the volume has written
// over is its own again (its new block is counted by statfs instead), and
// deleting the snapshot unshares the rest. With several writable images
// sharing one block each counts it, one copy more than the worst case needs
// when no snapshot holds the block too: the error is on the safe side.
//
// xfs also needs room for the metadata of each copy-on-write (its block map
// grows by one record per copied extent, and every allocation transaction
// reserves blocks up front): with exactly the shared bytes free an overwrite
// still failed with about 0.5 MiB left, so each image that shares anything
// also keeps cowFixedMargin and 1/cowMarginDivisor of its shared bytes.
const (
	cowFixedMargin   = 1 << 20
	cowMarginDivisor = 1024
)

// cowReserve returns what the volume image name (stat st) keeps out of
// the pool for copy-on-write. An image that cannot be opened now (deleted
// meanwhile, or not a file of ours, which promises nothing) keeps nothing;
// one whose extents cannot be read keeps its whole allocation, as if all
// of it were shared.
func (p *Pool) cowReserve(name string, st unix.Stat_t) int64 {
	f, _, err := p.vols.open(name, unix.O_RDONLY)
	if err != nil {
		return 0
	}
	defer f.Close()
	shared, err := sharedBytes(f)
	if err != nil {
		shared = st.Blocks * 512
	}
	if shared == 0 {
		return 0
	}
	return shared + cowFixedMargin + shared/cowMarginDivisor
}

// unreserved is what the pool has left after every promise, before its
// own reserve; negative when it promised more than it has.
func (u Usage) unreserved() int64 {
	return u.FreeBytes - u.PromisedBytes - u.CowReserveBytes
}

// checkSharing refuses a reflink that left the pool unable to keep its
// promises: before is the pool's Usage before the clone, and the clone
// (snapshot, clone or restore) made volume images share blocks, whose
// copy-on-write reserve must fit in what the pool had. A pool already short
// before (another writer filled it) refuses only a clone that makes it
// shorter. The caller holds the pool lock, so no other allocation ran in
// between, and removes the new image on error, which unshares it again.
func (p *Pool) checkSharing(before Usage) error {
	after, err := p.Usage()
	if err != nil {
		return err
	}
	left := after.unreserved() - p.ReserveBytes
	if left < 0 && left < before.unreserved()-p.ReserveBytes {
		return fmt.Errorf("pool %s cannot keep the copy-on-write reserve of the blocks this clone shares: it needs %d bytes more for it (%d reserved for copy-on-write before, %d after, %d available before): %w",
			p.Name, -left, before.CowReserveBytes, after.CowReserveBytes, before.AvailableBytes, ErrNoSpace)
	}
	return nil
}
