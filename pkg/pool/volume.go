package pool

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Access types of a volume.
const (
	AccessMount = "mount"
	AccessBlock = "block"
)

// Attachment records that a volume is attached (ControllerPublished) to a node.
type Attachment struct {
	Node     string `json:"node"`
	ReadOnly bool   `json:"readonly"`
}

// Volume is the record of one volume, PATH/volumes/<hash>.json.
type Volume struct {
	ID          string            `json:"id"`
	Name        string            `json:"name"`
	SizeBytes   int64             `json:"sizeBytes"`
	AccessType  string            `json:"accessType"`
	FsType      string            `json:"fsType,omitempty"`
	AccessModes []string          `json:"accessModes"`
	Parameters  map[string]string `json:"parameters,omitempty"`
	Created     time.Time         `json:"created"`
	Attachments []Attachment      `json:"attachments"`
	// Source is the ID of the snapshot or volume this volume was made
	// from, if any.
	Source string `json:"source,omitempty"`
	// Thin says the image is sparse (mutable parameter preallocate
	// "false"): its blocks are allocated as they are written, and their
	// promise is still counted in the pool's capacity. It is written only
	// once the image is laid out so; false (every record made before
	// preallocate existed) is a fully allocated image.
	Thin bool `json:"thin,omitempty"`
	// Modifying holds the mutable parameters a ControllerModifyVolume is
	// applying: written before the image changes, removed together with
	// the new Thin once it has. A record that still has it is the remains
	// of a modify that crashed half-way; the caller's retry finishes it.
	Modifying map[string]string `json:"modifying,omitempty"`
	// MovedTo makes this a forwarding record, in the volume's home pool
	// (the one its ID names): the volume lives in that pool of the same
	// zone, which holds its image and full record (move.go). A
	// forwarding record has only ID, Name, MovedTo, Move and Generation.
	MovedTo string `json:"movedTo,omitempty"`
	// Move, in the home record, is a move to another pool in progress
	// (move.go); the next holder of the volume's lock finishes it.
	Move *Move `json:"move,omitempty"`
	// Generation counts the writes of this record.
	Generation int64 `json:"generation"`

	// resident is the pool the record was read from (or made in):
	// WriteVolume writes it there only, so a record read in the pool a
	// volume moved to is never written over its home's forwarding record.
	resident string
}

// AttachedTo returns the attachment of the volume to node, if there is one.
func (v *Volume) AttachedTo(node string) (Attachment, bool) {
	for _, a := range v.Attachments {
		if a.Node == node {
			return a, true
		}
	}
	return Attachment{}, false
}

// VolumeSpec is what CreateVolume needs to make a volume.
type VolumeSpec struct {
	Name        string
	SizeBytes   int64
	AccessType  string
	FsType      string
	AccessModes []string
	Parameters  map[string]string
	// Thin makes a sparse image instead of a fully allocated one.
	Thin bool
	// Source, if set, is what the new image starts as: a snapshot or a
	// volume of this pool, whose lock the caller holds.
	Source *Source
}

// Source is the snapshot or volume a new volume is made from.
type Source struct {
	// ID is a snapshot ID or a volume ID of the pool.
	ID string
	// SizeBytes is the source's size; the new volume is at least as large.
	SizeBytes int64
}

// sourceStem returns the file stem of the source's image.
func (p *Pool) sourceStem(src *Source) (string, error) {
	if sid, err := ParseSnapshotID(src.ID); err == nil {
		return sid.stem(), p.ownSnapshot(sid)
	}
	vid, err := ParseVolumeID(src.ID)
	if err != nil {
		return "", err
	}
	return vid.Hash, p.own(vid)
}

// ReadVolume reads a volume's record. A volume without a record wraps
// ErrNotFound; an unreadable record (it does not parse, is larger than
// MaxRecordBytes, is not a regular file of the pool's owner) wraps
// ErrCorrupt.
//
// It reads the record of id in this pool: a volume moved here from its home
// pool is read by its own ID (Locate finds the pool). The record of another
// pool's volume moved here, read by this pool's ID of the same hash, wraps
// ErrGuest; a forwarding record wraps ErrMoved (Locate follows it).
func (p *Pool) ReadVolume(id VolumeID) (*Volume, error) {
	v, err := p.readRecordOf(id)
	if err != nil {
		return nil, err
	}
	if v.MovedTo != "" {
		return nil, fmt.Errorf("volume %s moved to pool %s: %w", id, v.MovedTo, ErrMoved)
	}
	return v, nil
}

// readRecordOf reads the record of id in this pool, whatever its form, and
// checks that it names id.
func (p *Pool) readRecordOf(id VolumeID) (*Volume, error) {
	var v Volume
	if err := p.vols.readRecord(recordName(id), &v, MaxRecordBytes); err != nil {
		return nil, fmt.Errorf("volume %s: %w", id, err)
	}
	if v.ID != id.String() {
		if other, err := ParseVolumeID(v.ID); err == nil && other.Hash == id.Hash && other.Pool != id.Pool {
			return nil, fmt.Errorf("volume %s: pool %s holds volume %s, moved here, under its name: %w", id, p.Name, other, ErrGuest)
		}
		return nil, fmt.Errorf("volume %s: record names volume %q: %w", id, v.ID, ErrCorrupt)
	}
	v.resident = p.Name
	return &v, nil
}

// CreateVolume makes the image and record of a new volume. The caller holds
// Lock(id); CreateVolume itself checks, under that lock, that no record
// exists (ErrExists otherwise), so an image that another process has returned
// is never replaced. An image without a record is the remains of a
// CreateVolume that crashed before it finished: it is replaced. The space
// check and the allocation run under the pool lock (lockCapacity), which
// it waits for only while ctx lasts (ErrBusy after). The record is written
// last, so a volume exists only once its image is complete.
func (p *Pool) CreateVolume(ctx context.Context, spec VolumeSpec) (*Volume, error) {
	id := DeriveVolumeID(p.Name, spec.Name)
	if spec.SizeBytes <= 0 || spec.SizeBytes%512 != 0 {
		return nil, fmt.Errorf("volume size %d is not a positive multiple of 512", spec.SizeBytes)
	}
	if _, err := p.vols.stat(recordName(id)); !errors.Is(err, fs.ErrNotExist) {
		if err == nil {
			return nil, fmt.Errorf("volume %s has a record already: %w", id, ErrExists)
		}
		return nil, err
	}
	if err := p.vols.remove(imageName(id)); err != nil {
		return nil, fmt.Errorf("remove unfinished image: %w", err)
	}
	if spec.Source == nil {
		if err := p.allocate(ctx, id, spec.SizeBytes, spec.Thin); err != nil {
			return nil, err
		}
	} else {
		stem, err := p.sourceStem(spec.Source)
		if err != nil {
			return nil, err
		}
		if spec.Source.SizeBytes > spec.SizeBytes {
			return nil, fmt.Errorf("volume size %d is below its source's %d", spec.SizeBytes, spec.Source.SizeBytes)
		}
		if _, err := p.copyImage(ctx, id.Hash, stem, spec.Source.SizeBytes, spec.SizeBytes, spec.Thin, nil); err != nil {
			return nil, err
		}
	}
	v := &Volume{
		ID:          id.String(),
		Name:        spec.Name,
		SizeBytes:   spec.SizeBytes,
		AccessType:  spec.AccessType,
		FsType:      spec.FsType,
		AccessModes: spec.AccessModes,
		Parameters:  spec.Parameters,
		Created:     time.Now().UTC().Truncate(time.Second),
		Attachments: []Attachment{},
		Thin:        spec.Thin,
		resident:    p.Name,
	}
	if spec.Source != nil {
		v.Source = spec.Source.ID
	}
	if err := p.WriteVolume(v); err != nil {
		p.vols.remove(imageName(id))
		return nil, err
	}
	return v, nil
}

// allocate creates the image file and reserves its blocks, so that a volume
// never runs out of the space it was promised: under the pool lock, check
// that the pool has room, then take it. Filesystems without fallocate (some
// NFS servers) get a sparse file, and so does a thin volume; Usage then
// counts the unallocated rest as promised. The fsync runs after the pool lock is released: the allocation
// is visible to statfs as soon as fallocate returns.
func (p *Pool) allocate(ctx context.Context, id VolumeID, size int64, thin bool) error {
	unlock, err := p.lockCapacity(ctx)
	if err != nil {
		return err
	}
	avail, err := p.Available()
	if err != nil {
		unlock()
		return err
	}
	if size > avail {
		unlock()
		return fmt.Errorf("pool %s has %d bytes available, volume needs %d: %w", p.Name, avail, size, ErrNoSpace)
	}
	fd, err := unix.Openat(p.vols.fd(), imageName(id), unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		unlock()
		return fmt.Errorf("create image %s: %w", p.ImagePath(id), err)
	}
	f := os.NewFile(uintptr(fd), p.ImagePath(id))
	defer f.Close()
	if thin {
		err = f.Truncate(size)
	} else {
		err = growFile(f, size)
	}
	unlock()
	if err == nil {
		err = f.Sync()
	}
	if err != nil {
		p.vols.remove(imageName(id))
		return fmt.Errorf("allocate image %s: %w", f.Name(), err)
	}
	return nil
}

func growFile(f *os.File, size int64) error {
	err := unix.Fallocate(int(f.Fd()), 0, 0, size)
	if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOSYS) {
		err = f.Truncate(size)
	}
	if errors.Is(err, unix.ENOSPC) {
		return fmt.Errorf("allocate %d bytes for %s: %w", size, f.Name(), ErrNoSpace)
	}
	if err != nil {
		return fmt.Errorf("allocate %d bytes for %s: %w", size, f.Name(), err)
	}
	return nil
}

// WriteVolume stores v atomically and bumps its generation. The caller holds
// Lock for the volume and read v under it. A record that would exceed
// MaxRecordBytes is refused (ErrTooLarge).
func (p *Pool) WriteVolume(v *Volume) error {
	id, err := ParseVolumeID(v.ID)
	if err != nil {
		return err
	}
	if err := p.own(id); err != nil {
		return err
	}
	if v.resident != "" && v.resident != p.Name {
		return fmt.Errorf("volume %s lives in pool %s; its record is not written to pool %s", id, v.resident, p.Name)
	}
	if v.MovedTo != "" {
		return fmt.Errorf("volume %s: WriteVolume writes full records, not forwarding ones", id)
	}
	v.Generation++
	if err := p.vols.writeRecord(recordName(id), v, MaxRecordBytes); err != nil {
		v.Generation--
		return fmt.Errorf("volume %s: %w", id, err)
	}
	return nil
}

// OpenImage opens a volume's image for I/O (flag is os.O_RDONLY or
// os.O_RDWR) after checking, on the descriptor it returns, that it is a
// regular file of the pool's owner with one name: never a symlink, device or
// hard link to a host file put in its place. A missing image wraps
// ErrNotFound, an untrusted one ErrUntrusted.
func (p *Pool) OpenImage(id VolumeID, flag int) (*os.File, error) {
	if err := p.own(id); err != nil {
		return nil, err
	}
	f, _, err := p.vols.open(imageName(id), flag)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("image of volume %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("image of volume %s: %w", id, err)
	}
	return f, nil
}

// ExpandVolume grows the image of v to size bytes and records the new size.
// The caller holds Lock and read v under it. Shrinking is refused; the same
// size is a no-op. The space check and the growth run under the pool lock,
// waited for only while ctx lasts (ErrBusy after).
func (p *Pool) ExpandVolume(ctx context.Context, v *Volume, size int64) error {
	id, err := ParseVolumeID(v.ID)
	if err != nil {
		return err
	}
	if size <= v.SizeBytes {
		return nil
	}
	if size%512 != 0 {
		return fmt.Errorf("volume size %d is not a multiple of 512", size)
	}
	f, err := p.OpenImage(id, os.O_RDWR)
	if errors.Is(err, ErrNotFound) {
		return fmt.Errorf("image of volume %s is missing: %w", id, ErrCorrupt)
	}
	if err != nil {
		return err
	}
	defer f.Close()
	if err := p.grow(ctx, f, size-v.SizeBytes, size); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("fsync image of %s: %w", id, err)
	}
	old := v.SizeBytes
	v.SizeBytes = size
	if err := p.WriteVolume(v); err != nil {
		v.SizeBytes = old
		return err
	}
	return nil
}

func (p *Pool) grow(ctx context.Context, f *os.File, more, size int64) error {
	unlock, err := p.lockCapacity(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	avail, err := p.Available()
	if err != nil {
		return err
	}
	if more > avail {
		return fmt.Errorf("pool %s has %d bytes available, expansion needs %d: %w", p.Name, avail, more, ErrNoSpace)
	}
	return growFile(f, size)
}

// DeleteVolume removes a volume's image, record and lock file. The caller
// holds Lock and has read the record under it and checked that nothing is
// attached. The image goes first: a crash in between leaves a record whose
// image is missing (reported as abnormal, and a retried delete finishes),
// never an image nobody knows of. Deleting a volume that does not exist is
// not an error. Whatever is in place of the image (a symlink) is unlinked,
// never followed.
func (p *Pool) DeleteVolume(id VolumeID) error {
	if err := p.own(id); err != nil {
		return err
	}
	for _, name := range []string{imageName(id), recordName(id)} {
		if err := p.vols.remove(name); err != nil {
			return fmt.Errorf("delete volume %s: %w", id, err)
		}
	}
	p.removeLockFile(id)
	return p.vols.sync()
}

// ImageSize returns the size of a volume's image file. A missing image
// wraps ErrNotFound; one that is not a regular file of the pool's owner
// with one name wraps ErrUntrusted.
func (p *Pool) ImageSize(id VolumeID) (int64, error) {
	st, err := p.imageStat(id)
	return st.Size, err
}

// ImageAllocated returns the bytes the pool's filesystem has allocated to
// a volume's image (blocks shared with snapshots or clones counted in
// full), with ImageSize's errors.
func (p *Pool) ImageAllocated(id VolumeID) (int64, error) {
	st, err := p.imageStat(id)
	return st.Blocks * 512, err
}

// imageStat is the checked stat of a volume's image.
func (p *Pool) imageStat(id VolumeID) (unix.Stat_t, error) {
	if err := p.own(id); err != nil {
		return unix.Stat_t{}, err
	}
	st, err := p.vols.stat(imageName(id))
	if errors.Is(err, fs.ErrNotExist) {
		return unix.Stat_t{}, fmt.Errorf("image of volume %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return unix.Stat_t{}, err
	}
	if err := p.vols.check(imageName(id), &st); err != nil {
		return unix.Stat_t{}, err
	}
	return st, nil
}

// ListVolumeIDs returns the IDs of the volumes that have a record, sorted.
// Only the names are listed: what each entry is, is for its reader to check.
func (p *Pool) ListVolumeIDs() ([]VolumeID, error) {
	names, err := p.vols.names()
	if err != nil {
		return nil, fmt.Errorf("pool %s: list volumes: %w", p.Name, err)
	}
	var ids []VolumeID
	for _, name := range names {
		hash, ok := strings.CutSuffix(name, recordSuffix)
		if !ok || !hashRE.MatchString(hash) {
			continue
		}
		ids = append(ids, VolumeID{Pool: p.Name, Hash: hash})
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i].Hash < ids[j].Hash })
	return ids, nil
}

// CountAttachments returns how many volumes living in the pool are attached
// to node: the full records here, also of volumes moved here from another
// pool (which keep that pool's ID); forwarding records hold no attachments.
// Records that cannot be read are skipped: they cannot be attached anywhere.
func (p *Pool) CountAttachments(node string) (int, error) {
	ids, err := p.ListVolumeIDs()
	if err != nil {
		return 0, err
	}
	n := 0
	for _, id := range ids {
		var v Volume
		if err := p.vols.readRecord(recordName(id), &v, MaxRecordBytes); err != nil || v.MovedTo != "" {
			continue
		}
		if other, err := ParseVolumeID(v.ID); err != nil || other.Hash != id.Hash {
			continue
		}
		if _, ok := v.AttachedTo(node); ok {
			n++
		}
	}
	return n, nil
}
