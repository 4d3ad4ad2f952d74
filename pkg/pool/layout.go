package pool

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"

	"golang.org/x/sys/unix"
)

// SetLayout makes v's image thin (sparse) or thick (fully allocated) and
// records it. The caller holds Lock and read v under it; params are the
// mutable parameters being applied, kept in the record's Modifying while the
// image changes.
//
// Order, for a crash at any point: the intent is written first, then the
// image changes (each step of which can be repeated), then the record
// says the new layout and drops the intent. A crash leaves a record that
// still says the old layout with the intent beside it, and the caller's
// retry (external-resizer retries a ModifyVolume until it succeeds) does
// the whole change again, which is idempotent: fallocate fills only holes,
// punching a hole where there is one already changes nothing.
//
// Thickening is safe while the volume is in use: fallocate only allocates
// what is unallocated and never changes data. Thinning is not: it finds the
// unwritten ranges first and punches them afterwards, and a write that lands
// in between would be lost. So a volume attached anywhere is refused
// (ErrInUse) and nothing changes: the caller retries once it is detached. Blocks a reflinked
// image shares with a snapshot stay shared either way. Thickening waits
// for the pool lock only while ctx lasts (ErrBusy after).
func (p *Pool) SetLayout(ctx context.Context, v *Volume, thin bool, params map[string]string) error {
	id, err := ParseVolumeID(v.ID)
	if err != nil {
		return err
	}
	if v.Thin == thin && v.Modifying == nil {
		return nil
	}
	if thin && len(v.Attachments) > 0 {
		return fmt.Errorf("volume %s is attached to node %s, and its unwritten blocks can be freed only while nothing writes to it; retry once it is detached: %w",
			id, v.Attachments[0].Node, ErrInUse)
	}
	old := maps.Clone(v.Modifying)
	v.Modifying = maps.Clone(params)
	if v.Modifying == nil {
		v.Modifying = map[string]string{}
	}
	if err := p.WriteVolume(v); err != nil {
		v.Modifying = old
		return err
	}
	f, err := p.OpenImage(id, os.O_RDWR)
	if errors.Is(err, ErrNotFound) {
		return fmt.Errorf("image of volume %s is missing: %w", id, ErrCorrupt)
	}
	if err != nil {
		return err
	}
	defer f.Close()
	if thin {
		err = punchHoles(f, v.SizeBytes)
	} else {
		err = p.thicken(ctx, f, v.SizeBytes)
	}
	if err == nil {
		err = f.Sync()
	}
	if err != nil {
		return fmt.Errorf("volume %s: %w", id, err)
	}
	v.Thin, v.Modifying = thin, nil
	return p.WriteVolume(v)
}

// thicken allocates every unallocated byte of f. The pool already counts
// those bytes as promised (Usage), so no new space is taken from
// AvailableBytes; the pool lock keeps the allocation apart from another
// capacity decision all the same.
func (p *Pool) thicken(ctx context.Context, f *os.File, size int64) error {
	unlock, err := p.lockCapacity(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	return growFile(f, size)
}

// punchHoles frees the blocks of f's first size bytes that hold no data:
// the ranges SEEK_HOLE reports, which on ext4 and xfs include the
// allocated but never written (unwritten) extents of a fallocated image.
// They read as zeros before and after. Nothing may write to f meanwhile.
func punchHoles(f *os.File, size int64) error {
	fd := int(f.Fd())
	for off := int64(0); off < size; {
		hole, err := unix.Seek(fd, off, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("seek hole in %s: %w", f.Name(), err)
		}
		if hole >= size {
			return nil
		}
		data, err := unix.Seek(fd, hole, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			data = size
		} else if err != nil {
			return fmt.Errorf("seek data in %s: %w", f.Name(), err)
		}
		data = min(data, size)
		err = unix.Fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, hole, data-hole)
		if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOSYS) {
			return nil // the filesystem cannot free blocks: the image stays as it is
		}
		if err != nil {
			return fmt.Errorf("free %d bytes at %d of %s: %w", data-hole, hole, f.Name(), err)
		}
		off = data
	}
	return nil
}
