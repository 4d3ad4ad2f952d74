package pool

import (
	"fmt"
	"os"
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
	// AvailableBytes is what new volumes may still get:
	// FreeBytes - PromisedBytes - ReserveBytes, never below zero.
	AvailableBytes int64
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
	if err := unix.Statfs(p.Path, &st); err != nil {
		return Usage{}, fmt.Errorf("pool %s: statfs %s: %w", p.Name, p.Path, err)
	}
	u := Usage{
		TotalBytes: int64(st.Blocks) * st.Bsize,
		FreeBytes:  int64(st.Bavail) * st.Bsize,
	}
	promised, err := p.promisedBytes()
	if err != nil {
		return Usage{}, err
	}
	u.PromisedBytes = promised
	u.AvailableBytes = max(0, u.FreeBytes-promised-p.ReserveBytes)
	return u, nil
}

// promisedBytes adds up, over all images, the bytes of their size that the
// filesystem has not allocated yet: sparse images (no fallocate) will take
// them when written.
func (p *Pool) promisedBytes() (int64, error) {
	entries, err := os.ReadDir(p.volumesPath())
	if err != nil {
		return 0, fmt.Errorf("pool %s: list images: %w", p.Name, err)
	}
	var total int64
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), imageSuffix) {
			continue
		}
		var st unix.Stat_t
		if err := unix.Stat(p.volumesPath()+"/"+e.Name(), &st); err != nil {
			continue // deleted meanwhile
		}
		if unallocated := st.Size - st.Blocks*512; unallocated > 0 {
			total += unallocated
		}
	}
	return total, nil
}
