package pool

import (
	"fmt"
	"strings"

	"golang.org/x/sys/unix"
)

// Usage is the pool's space, in bytes.
type Usage struct {
	// TotalBytes is the size of the filesystem that holds the pool.
	TotalBytes int64
	// FreeBytes is what statfs says an unprivileged writer may still use.
	FreeBytes int64
	// PromisedBytes are promised to sparse images but not yet allocated.
	PromisedBytes int64
	// CowReserveBytes are kept for copy-on-write: the blocks that volume
	// images share with other files (reflinked snapshots and clones),
	// which each volume needs again when it writes over them, plus
	// xfs's metadata margin for that (cow.go).
	CowReserveBytes int64
	// AvailableBytes is what new volumes may still get:
	// FreeBytes - PromisedBytes - CowReserveBytes - ReserveBytes, never
	// below zero.
	AvailableBytes int64
	// OrphanImages counts images without a record: the remains of a
	// CreateVolume that died between the image and its record (or of a
	// record that was removed). Their blocks are allocated, so FreeBytes
	// already excludes them, and their unallocated rest is promised: they
	// stay out of AvailableBytes until a retried CreateVolume reuses them
	// or Sweep reclaims them.
	OrphanImages int
	// OrphanBytes is the size of those images.
	OrphanBytes int64
}

// Available returns Usage().AvailableBytes. It is also the largest single
// volume the pool can hold: an image needs a promise of bytes, not contiguous
// blocks.
func (p *Pool) Available() (int64, error) {
	u, err := p.Usage()
	return u.AvailableBytes, err
}

// Usage measures the pool now.
func (p *Pool) Usage() (Usage, error) {
	var st unix.Statfs_t
	if err := unix.Fstatfs(p.vols.fd(), &st); err != nil {
		return Usage{}, fmt.Errorf("pool %s: statfs %s: %w", p.Name, p.Path, err)
	}
	u := Usage{
		TotalBytes: int64(st.Blocks) * st.Bsize,
		FreeBytes:  int64(st.Bavail) * st.Bsize,
	}
	if err := p.countImages(&u); err != nil {
		return Usage{}, err
	}
	u.AvailableBytes = max(0, u.unreserved()-p.ReserveBytes)
	return u, nil
}

// countImages adds up, over all images, the bytes of their size that the
// filesystem has not allocated yet (sparse images, with no fallocate, will
// take them when written), and counts the images that have no record. An
// entry that is not a regular file (a symlink named like an image) is no
// image of ours and promises nothing.
func (p *Pool) countImages(u *Usage) error {
	names, err := p.vols.names()
	if err != nil {
		return fmt.Errorf("pool %s: list images: %w", p.Name, err)
	}
	records := map[string]bool{}
	for _, name := range names {
		if hash, ok := strings.CutSuffix(name, recordSuffix); ok {
			records[hash] = true
		}
	}
	for _, name := range names {
		if strings.HasPrefix(name, ".") && strings.HasSuffix(name, moveTempSuffix) {
			// The copy of a move in progress: what it has not
			// allocated yet is promised to the volume coming in.
			if st, err := p.vols.stat(name); err == nil && st.Mode&unix.S_IFMT == unix.S_IFREG && st.Size > st.Blocks*512 {
				u.PromisedBytes += st.Size - st.Blocks*512
			}
			continue
		}
		hash, ok := strings.CutSuffix(name, imageSuffix)
		if !ok {
			continue
		}
		st, err := p.vols.stat(name)
		if err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
			continue // deleted meanwhile, or not an image
		}
		// A snapshot's image is never written: its holes promise nothing.
		// Its data blocks, its own (copy) or shared with its volume
		// (reflink), are what statfs already counts.
		if unallocated := st.Size - st.Blocks*512; unallocated > 0 && !strings.HasPrefix(name, snapPrefix) {
			u.PromisedBytes += unallocated
		}
		if !strings.HasPrefix(name, snapPrefix) {
			u.CowReserveBytes += p.cowReserve(name, st)
		}
		if !records[hash] {
			u.OrphanImages++
			u.OrphanBytes += st.Size
		}
	}
	return nil
}
