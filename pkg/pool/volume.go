package pool

import (
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
	// Generation counts the writes of this record.
	Generation int64 `json:"generation"`
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
}

// ReadVolume reads a volume's record. A volume without a record wraps
// ErrNotFound; an unreadable record wraps ErrCorrupt.
func (p *Pool) ReadVolume(id VolumeID) (*Volume, error) {
	if err := p.own(id); err != nil {
		return nil, err
	}
	var v Volume
	if err := readRecord(p.recordPath(id), &v); err != nil {
		if errors.Is(err, ErrNotFound) {
			return nil, fmt.Errorf("volume %s: %w", id, ErrNotFound)
		}
		return nil, fmt.Errorf("volume %s: %w", id, err)
	}
	if v.ID != id.String() {
		return nil, fmt.Errorf("volume %s: record names volume %q: %w", id, v.ID, ErrCorrupt)
	}
	return &v, nil
}

// CreateVolume makes the image and record of a new volume. The caller holds
// Lock(id) and has checked that no record exists. An image without a record
// is the remains of a CreateVolume that crashed before it finished: it is
// replaced. The record is written last, so a volume exists only once its image
// is complete.
func (p *Pool) CreateVolume(spec VolumeSpec) (*Volume, error) {
	id := DeriveVolumeID(p.Name, spec.Name)
	if spec.SizeBytes <= 0 || spec.SizeBytes%512 != 0 {
		return nil, fmt.Errorf("volume size %d is not a positive multiple of 512", spec.SizeBytes)
	}
	img := p.ImagePath(id)
	if err := os.Remove(img); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("remove unfinished image %s: %w", img, err)
	}
	avail, err := p.Available()
	if err != nil {
		return nil, err
	}
	if spec.SizeBytes > avail {
		return nil, fmt.Errorf("pool %s has %d bytes available, volume needs %d: %w", p.Name, avail, spec.SizeBytes, ErrNoSpace)
	}
	if err := allocateImage(img, spec.SizeBytes); err != nil {
		os.Remove(img)
		return nil, err
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
	}
	if err := p.WriteVolume(v); err != nil {
		os.Remove(img)
		return nil, err
	}
	return v, nil
}

// allocateImage creates the image file and reserves its blocks, so that a
// volume never runs out of the space it was promised. Filesystems without
// fallocate (some NFS servers) get a sparse file; Available then counts the
// unallocated rest as promised.
func allocateImage(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("create image %s: %w", path, err)
	}
	defer f.Close()
	if err := growFile(f, size); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("fsync image %s: %w", path, err)
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
// Lock for the volume.
func (p *Pool) WriteVolume(v *Volume) error {
	id, err := ParseVolumeID(v.ID)
	if err != nil {
		return err
	}
	if err := p.own(id); err != nil {
		return err
	}
	v.Generation++
	if err := writeRecord(p.recordPath(id), v); err != nil {
		v.Generation--
		return fmt.Errorf("volume %s: %w", id, err)
	}
	return nil
}

// ExpandVolume grows the image of v to size bytes and records the new size.
// The caller holds Lock. Shrinking is refused; the same size is a no-op.
func (p *Pool) ExpandVolume(v *Volume, size int64) error {
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
	avail, err := p.Available()
	if err != nil {
		return err
	}
	if size-v.SizeBytes > avail {
		return fmt.Errorf("pool %s has %d bytes available, expansion needs %d: %w", p.Name, avail, size-v.SizeBytes, ErrNoSpace)
	}
	f, err := os.OpenFile(p.ImagePath(id), os.O_RDWR, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("image of volume %s is missing: %w", id, ErrCorrupt)
	}
	if err != nil {
		return fmt.Errorf("open image of %s: %w", id, err)
	}
	defer f.Close()
	if err := growFile(f, size); err != nil {
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

// DeleteVolume removes a volume's image, record and lock file. The caller
// holds Lock and has checked that nothing is attached. The image goes first:
// a crash in between leaves a record whose image is missing (reported as
// abnormal, and a retried delete finishes), never an image nobody knows of.
// Deleting a volume that does not exist is not an error.
func (p *Pool) DeleteVolume(id VolumeID) error {
	if err := p.own(id); err != nil {
		return err
	}
	for _, path := range []string{p.ImagePath(id), p.recordPath(id)} {
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("delete volume %s: %w", id, err)
		}
	}
	p.removeLockFile(id)
	return syncDir(p.volumesPath())
}

// ImageSize returns the size of a volume's image file.
func (p *Pool) ImageSize(id VolumeID) (int64, error) {
	st, err := os.Stat(p.ImagePath(id))
	if errors.Is(err, fs.ErrNotExist) {
		return 0, fmt.Errorf("image of volume %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return 0, err
	}
	return st.Size(), nil
}

// ListVolumeIDs returns the IDs of the volumes that have a record, sorted.
func (p *Pool) ListVolumeIDs() ([]VolumeID, error) {
	entries, err := os.ReadDir(p.volumesPath())
	if err != nil {
		return nil, fmt.Errorf("pool %s: list volumes: %w", p.Name, err)
	}
	var ids []VolumeID
	for _, e := range entries {
		hash, ok := strings.CutSuffix(e.Name(), recordSuffix)
		if !ok || !hashRE.MatchString(hash) {
			continue
		}
		ids = append(ids, VolumeID{Pool: p.Name, Hash: hash})
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i].Hash < ids[j].Hash })
	return ids, nil
}

// CountAttachments returns how many volumes of the pool are attached to node.
// Records that cannot be read are skipped: they cannot be attached anywhere.
func (p *Pool) CountAttachments(node string) (int, error) {
	ids, err := p.ListVolumeIDs()
	if err != nil {
		return 0, err
	}
	n := 0
	for _, id := range ids {
		v, err := p.ReadVolume(id)
		if err != nil {
			continue
		}
		if _, ok := v.AttachedTo(node); ok {
			n++
		}
	}
	return n, nil
}

func (p *Pool) volumesPath() string { return p.Path + "/" + volumesDir }
