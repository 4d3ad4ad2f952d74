package pool

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// snapPrefix starts the file names of a snapshot (snap-<hash>.img, .json,
// .lock) and the hash part of its ID. A volume's hash part is 32 hex digits
// and nothing else, so no snapshot ID parses as a volume ID, no volume ID
// as a snapshot ID, and their files never share a name.
const snapPrefix = "snap-"

// SnapshotID names a snapshot: the pool it lives in (its source volume's)
// and a hash derived from its CSI name. Its string form is
// "<pool>.snap-<32 hex>".
type SnapshotID struct {
	Pool string
	Hash string
}

// String returns the CSI snapshot ID.
func (id SnapshotID) String() string { return id.Pool + "." + snapPrefix + id.Hash }

func (id SnapshotID) stem() string { return snapPrefix + id.Hash }

// DeriveSnapshotID returns the ID that the snapshot called name gets in
// pool. The name is hashed with a prefix of its own, so a snapshot and a
// volume of one name get different hashes too.
func DeriveSnapshotID(poolName, name string) SnapshotID {
	sum := sha256.Sum256([]byte("snapshot\x00" + name))
	return SnapshotID{Pool: poolName, Hash: hex.EncodeToString(sum[:])[:hashLen]}
}

// ParseSnapshotID parses s strictly: anything but "<pool name>.snap-<32
// lowercase hex>" wraps ErrInvalidID.
func ParseSnapshotID(s string) (SnapshotID, error) {
	i := strings.LastIndexByte(s, '.')
	if len(s) <= 63+1+len(snapPrefix)+hashLen && i > 0 {
		hash, ok := strings.CutPrefix(s[i+1:], snapPrefix)
		id := SnapshotID{Pool: s[:i], Hash: hash}
		if ok && poolNameRE.MatchString(id.Pool) && hashRE.MatchString(id.Hash) {
			return id, nil
		}
	}
	return SnapshotID{}, fmt.Errorf("snapshot ID %q is not of the form <pool>.snap-<32 hex digits>: %w", s, ErrInvalidID)
}

// Snapshot is the record of one snapshot, PATH/volumes/snap-<hash>.json: a
// read-only image beside its source volume's, which stands alone once made
// (deleting the source leaves it intact).
type Snapshot struct {
	ID             string `json:"id"`
	Name           string `json:"name"`
	SourceVolumeID string `json:"sourceVolumeID"`
	SizeBytes      int64  `json:"sizeBytes"`
	// AccessType and FsType are the source's: a restore gets the same
	// filesystem.
	AccessType string    `json:"accessType"`
	FsType     string    `json:"fsType,omitempty"`
	Created    time.Time `json:"created"`
	// ReadyToUse is false while the image is being made; a record that
	// says false and whose lock nobody holds is the remains of a crash.
	ReadyToUse bool `json:"readyToUse"`
	// Method is CopyReflink (the image shares blocks with its source
	// until they diverge) or CopyData (it owns its data blocks).
	Method string `json:"method,omitempty"`
	// Group is the ID of the group snapshot this snapshot is a member
	// of, if any; such a snapshot is deleted with its group only.
	Group      string `json:"group,omitempty"`
	Generation int64  `json:"generation"`
}

func (p *Pool) ownSnapshot(id SnapshotID) error {
	if id.Pool != p.Name {
		return fmt.Errorf("snapshot %s belongs to pool %s, not %s: %w", id, id.Pool, p.Name, ErrInvalidID)
	}
	return nil
}

// LockSnapshot takes the snapshot's lock without waiting (ErrBusy when it
// is held), as Lock does for a volume.
func (p *Pool) LockSnapshot(id SnapshotID) (Unlock, error) {
	if err := p.ownSnapshot(id); err != nil {
		return nil, err
	}
	return p.lockStem(id.stem(), "snapshot "+id.String())
}

// ReadSnapshot reads a snapshot's record: ErrNotFound without one,
// ErrCorrupt when it cannot be read, as ReadVolume.
func (p *Pool) ReadSnapshot(id SnapshotID) (*Snapshot, error) {
	if err := p.ownSnapshot(id); err != nil {
		return nil, err
	}
	var s Snapshot
	if err := p.vols.readRecord(id.stem()+recordSuffix, &s, MaxRecordBytes); err != nil {
		return nil, fmt.Errorf("snapshot %s: %w", id, err)
	}
	if s.ID != id.String() {
		return nil, fmt.Errorf("snapshot %s: record names snapshot %q: %w", id, s.ID, ErrCorrupt)
	}
	return &s, nil
}

func (p *Pool) writeSnapshot(s *Snapshot) error {
	id, err := ParseSnapshotID(s.ID)
	if err != nil {
		return err
	}
	s.Generation++
	if err := p.vols.writeRecord(id.stem()+recordSuffix, s, MaxRecordBytes); err != nil {
		s.Generation--
		return fmt.Errorf("snapshot %s: %w", id, err)
	}
	return nil
}

// CreateSnapshot makes the snapshot called name of volume src, or returns
// it if it exists already (ErrExists if it is of another volume). The
// caller holds LockSnapshot(DeriveSnapshotID(p.Name, name)) and Lock of
// src, and read src under it.
//
// Crash safety: the record is written first, saying ReadyToUse false, then
// the image is made and synced, then the record says true. A record that
// says false under a lock this call holds is therefore a crashed call's:
// its image is removed and made again. DeleteSnapshot removes a half-made
// one, so nothing is left either way.
//
// The image is a reflink of the source's where the filesystem can
// (instant, no space until the volume is written); elsewhere the source's
// data ranges are reserved under the pool lock, after a space check, and
// copied with their holes kept; the pool lock is waited for only while ctx
// lasts (ErrBusy after). progress hears of the copy.
func (p *Pool) CreateSnapshot(ctx context.Context, name string, src *Volume, progress Progress) (*Snapshot, error) {
	return p.createSnapshot(ctx, name, "", src, progress)
}

func (p *Pool) createSnapshot(ctx context.Context, name, group string, src *Volume, progress Progress) (*Snapshot, error) {
	id := DeriveSnapshotID(p.Name, name)
	srcID, err := ParseVolumeID(src.ID)
	if err != nil {
		return nil, err
	}
	if err := p.own(srcID); err != nil {
		return nil, err
	}
	old, err := p.ReadSnapshot(id)
	switch {
	case err == nil && old.SourceVolumeID != src.ID:
		return nil, fmt.Errorf("snapshot %q exists of volume %s: %w", name, old.SourceVolumeID, ErrExists)
	case err == nil && old.ReadyToUse:
		return old, nil
	case err != nil && !errors.Is(err, ErrNotFound):
		return nil, err
	}
	stem := id.stem()
	if err := p.vols.remove(stem + imageSuffix); err != nil {
		return nil, fmt.Errorf("remove unfinished snapshot image: %w", err)
	}
	s := &Snapshot{ID: id.String(), Name: name, SourceVolumeID: src.ID, SizeBytes: src.SizeBytes,
		AccessType: src.AccessType, FsType: src.FsType, Created: time.Now().UTC().Truncate(time.Second), Group: group}
	if old != nil {
		s.Created, s.Generation = old.Created, old.Generation
	}
	if err := p.writeSnapshot(s); err != nil {
		return nil, err
	}
	method, err := p.copyImage(ctx, stem, srcID.Hash, src.SizeBytes, 0, false, progress)
	if err == nil {
		s.ReadyToUse, s.Method = true, method
		err = p.writeSnapshot(s)
	}
	if err != nil {
		p.vols.remove(stem + imageSuffix)
		p.vols.remove(stem + recordSuffix)
		p.vols.sync()
		return nil, err
	}
	return s, nil
}

// copyImage makes the image dst+".img" from the image src+".img" (a
// volume's or a snapshot's) of srcSize bytes. size 0 makes a snapshot:
// read-only, sparse, owning only the source's data blocks. size > 0 makes a
// volume of that size: unless thin, the rest is allocated as for a new
// volume, so it keeps its promise.
func (p *Pool) copyImage(ctx context.Context, dst, src string, srcSize, size int64, thin bool, progress Progress) (string, error) {
	in, _, err := p.vols.open(src+imageSuffix, unix.O_RDONLY)
	if errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("image %s is missing: %w", src+imageSuffix, ErrCorrupt)
	}
	if err != nil {
		return "", err
	}
	defer in.Close()
	mode := uint32(0o600)
	if size == 0 {
		mode = 0o400
	}
	fd, err := unix.Openat(p.vols.fd(), dst+imageSuffix, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, mode)
	if err != nil {
		return "", fmt.Errorf("create image %s/%s: %w", p.vols.path, dst+imageSuffix, err)
	}
	out := os.NewFile(uintptr(fd), p.vols.path+"/"+dst+imageSuffix)
	defer out.Close()
	method, err := p.fill(ctx, out, in, srcSize, size, thin, progress)
	if err == nil {
		err = out.Sync()
	}
	if err != nil {
		p.vols.remove(dst + imageSuffix)
		return "", err
	}
	return method, nil
}

// fill makes out a copy of in (see copyImage). The space check and the
// reservation run under the pool lock; the copy itself after it, into
// blocks already reserved.
func (p *Pool) fill(ctx context.Context, out, in *os.File, srcSize, size int64, thin bool, progress Progress) (string, error) {
	unlock, err := p.lockCapacity(ctx)
	if err != nil {
		return "", err
	}
	defer func() {
		if unlock != nil {
			unlock()
		}
	}()
	before, err := p.Usage()
	if err != nil {
		return "", err
	}
	avail := before.AvailableBytes
	if size > avail {
		return "", fmt.Errorf("pool %s has %d bytes available, the volume needs %d: %w", p.Name, avail, size, ErrNoSpace)
	}
	cloned, err := reflink(out, in)
	if err != nil {
		return "", err
	}
	// A thick volume's image is allocated whole; a thin one's (and a
	// snapshot's) only where the source holds data, so the copy into it
	// cannot run out of space half-way.
	thick := size > 0 && !thin
	if cloned {
		if thick {
			if err := growFile(out, size); err != nil {
				return "", err
			}
		} else if size > 0 {
			if err := out.Truncate(size); err != nil {
				return "", fmt.Errorf("size %s: %w", out.Name(), err)
			}
		}
		// The blocks now shared must stay writable by every volume
		// that shares them (cow.go); the caller removes out on error.
		if err := p.checkSharing(before); err != nil {
			return "", err
		}
		return CopyReflink, nil
	}
	if thick {
		if err := growFile(out, size); err != nil {
			return "", err
		}
	} else {
		need, err := allocatedData(in, srcSize)
		if err != nil {
			return "", err
		}
		if need > avail {
			return "", fmt.Errorf("pool %s has %d bytes available, the copy needs %d: %w", p.Name, avail, need, ErrNoSpace)
		}
		if err := out.Truncate(max(size, srcSize)); err != nil {
			return "", fmt.Errorf("size %s: %w", out.Name(), err)
		}
		if err := reserveData(out, in, srcSize); err != nil {
			return "", err
		}
	}
	unlock()
	unlock = nil
	return CopyData, copyData(out, in, srcSize, progress)
}

// DeleteSnapshot removes a snapshot's image, record and lock file; the
// caller holds LockSnapshot. The image goes first, as for a volume. A
// snapshot that does not exist is not an error. The temporaries of its
// record that a killed call left go too: records are written under the
// snapshot's lock, which the caller holds, so none of them is live.
func (p *Pool) DeleteSnapshot(id SnapshotID) error {
	if err := p.ownSnapshot(id); err != nil {
		return err
	}
	for _, name := range []string{id.stem() + imageSuffix, id.stem() + recordSuffix} {
		if err := p.vols.remove(name); err != nil {
			return fmt.Errorf("delete snapshot %s: %w", id, err)
		}
	}
	names, err := p.vols.names()
	if err != nil {
		return fmt.Errorf("delete snapshot %s: %w", id, err)
	}
	for _, name := range names {
		if strings.HasPrefix(name, tempPrefix(id.stem()+recordSuffix)) {
			if err := p.vols.remove(name); err != nil {
				return fmt.Errorf("delete snapshot %s: %w", id, err)
			}
		}
	}
	p.vols.remove(id.stem() + lockSuffix)
	return p.vols.sync()
}

// ListSnapshotIDs returns the IDs of the snapshots that have a record,
// sorted by hash.
func (p *Pool) ListSnapshotIDs() ([]SnapshotID, error) {
	names, err := p.vols.names()
	if err != nil {
		return nil, fmt.Errorf("pool %s: list snapshots: %w", p.Name, err)
	}
	var ids []SnapshotID
	for _, name := range names {
		rest, ok := strings.CutPrefix(name, snapPrefix)
		hash, ok2 := strings.CutSuffix(rest, recordSuffix)
		if !ok || !ok2 || !hashRE.MatchString(hash) {
			continue
		}
		ids = append(ids, SnapshotID{Pool: p.Name, Hash: hash})
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i].Hash < ids[j].Hash })
	return ids, nil
}

// SnapshotImagePath is the path of a snapshot's image, for messages.
func (p *Pool) SnapshotImagePath(id SnapshotID) string {
	return p.vols.path + "/" + id.stem() + imageSuffix
}
