package pool

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// DefaultOrphanGrace is how old an orphan image (an image without a record)
// must be before Sweep reclaims it. The volume lock already keeps Sweep away
// from the image of a CreateVolume in progress; the grace is for where flock
// does not reach: an NFS pool mounted with nolock or local_lock=flock, whose
// flocks other hosts do not see. A CreateVolume takes seconds (one fallocate
// and two fsyncs; a TiB image allocates in about a second here), and the
// provisioner retries a failed one within its 5-minute maximum backoff, and
// that retry reuses the image anyway. Fifteen minutes is far beyond both, and
// short enough that the space comes back the same hour.
const DefaultOrphanGrace = 15 * time.Minute

// tempAge is how old a temporary file that no volume lock guards (of a node
// record, the marker, a probe) must be before Sweep removes it: its writer
// needs milliseconds.
const tempAge = time.Minute

// Orphan is an image without a record.
type Orphan struct {
	ID        VolumeID
	SizeBytes int64
	Age       time.Duration
	// HasData is true unless the filesystem says the image holds no data
	// at all (SEEK_DATA finds none): a fallocated image that was never
	// written. Sweep never reclaims an image with data, whatever its age:
	// it is a volume whose record was lost, not a create that died, and
	// lost data is worse than lost space. A filesystem without SEEK_DATA
	// (NFS before 4.2) reports data everywhere, so nothing is reclaimed
	// there.
	HasData bool
}

// SweepReport says what Sweep found and did.
type SweepReport struct {
	// Temporaries are the temporary files removed (their names).
	Temporaries []string
	// LockFiles are the lock files removed, of volumes that no longer exist.
	LockFiles []string
	// Orphans are the orphan images left in place: younger than the grace,
	// holding data, or locked by a CreateVolume in progress.
	Orphans []Orphan
	// Reclaimed are the orphan images removed.
	Reclaimed []Orphan
	// UnfinishedSnapshots are the snapshots removed whose record still
	// said not ready after the grace, with nobody holding their lock: a
	// CreateSnapshot killed mid-copy that nobody retried.
	UnfinishedSnapshots []SnapshotID
	// UnfinishedGroups are the group snapshots removed, with their
	// members, whose record still said not ready after the grace with
	// nobody holding their lock.
	UnfinishedGroups []GroupID
	// Errors are the entries Sweep could not handle; it went on with the
	// rest.
	Errors []error
}

// Sweep removes what killed processes left in the pool: temporary record
// files (a volume's under its lock, so never one a live writer is still
// writing), lock files of deleted volumes, and orphan images older than
// grace that hold no data, each under the volume lock after reading again
// that there is no record. A volume whose lock is held is left alone. now is
// the time ages are measured from.
func (p *Pool) Sweep(now time.Time, grace time.Duration) (SweepReport, error) {
	var r SweepReport
	names, err := p.vols.names()
	if err != nil {
		return r, fmt.Errorf("pool %s: sweep: %w", p.Name, err)
	}
	present := map[string]bool{}
	for _, name := range names {
		present[name] = true
	}
	for _, name := range names {
		switch {
		case strings.HasPrefix(name, "."):
			p.sweepTemp(&r, p.vols, name, now)
		case strings.HasSuffix(name, imageSuffix):
			hash := strings.TrimSuffix(name, imageSuffix)
			if hashRE.MatchString(hash) && !present[hash+recordSuffix] {
				p.sweepOrphan(&r, VolumeID{Pool: p.Name, Hash: hash}, now, grace)
			}
		case strings.HasPrefix(name, snapPrefix) && strings.HasSuffix(name, recordSuffix):
			hash := strings.TrimSuffix(strings.TrimPrefix(name, snapPrefix), recordSuffix)
			if hashRE.MatchString(hash) {
				p.sweepSnapshot(&r, SnapshotID{Pool: p.Name, Hash: hash}, now, grace)
			}
		case strings.HasPrefix(name, groupPrefix) && strings.HasSuffix(name, recordSuffix):
			hash := strings.TrimSuffix(strings.TrimPrefix(name, groupPrefix), recordSuffix)
			if hashRE.MatchString(hash) {
				p.sweepGroup(&r, GroupID{Pool: p.Name, Hash: hash}, now, grace)
			}
		case strings.HasSuffix(name, lockSuffix):
			hash := strings.TrimSuffix(name, lockSuffix)
			if hashRE.MatchString(hash) && !present[hash+recordSuffix] && !present[hash+imageSuffix] {
				p.sweepLock(&r, VolumeID{Pool: p.Name, Hash: hash})
			}
		}
	}
	for _, d := range []*dir{p.nodes, p.staged, p.root} {
		more, err := d.names()
		if err != nil {
			r.Errors = append(r.Errors, err)
			continue
		}
		for _, name := range more {
			if strings.HasPrefix(name, ".") && strings.Contains(name, ".tmp-") {
				p.sweepTemp(&r, d, name, now)
			}
		}
	}
	return r, nil
}

// sweepTemp removes one temporary file. A volume record's temporary is
// written under the volume lock, so it is removed under that lock, whatever
// its age; any other one once it is older than tempAge.
func (p *Pool) sweepTemp(r *SweepReport, d *dir, name string, now time.Time) {
	if d == p.vols {
		if hash, _, ok := strings.Cut(strings.TrimPrefix(name, "."), recordSuffix+".tmp-"); ok && hashRE.MatchString(hash) {
			id := VolumeID{Pool: p.Name, Hash: hash}
			unlock, err := p.Lock(id)
			if err != nil {
				return // a writer holds it: the temporary may be live
			}
			defer unlock()
			if _, err := p.ReadVolume(id); errors.Is(err, ErrGuest) {
				// The record of a volume moved here is written under
				// its home pool's lock, not this one: only an old
				// temporary is surely dead.
				if st, err := d.stat(name); err != nil || now.Sub(time.Unix(st.Mtim.Unix())) < tempAge {
					return
				}
			}
			if err := d.remove(name); err != nil {
				r.Errors = append(r.Errors, err)
				return
			}
			r.Temporaries = append(r.Temporaries, name)
			p.dropUnusedLock(r, id)
			return
		}
		if !strings.HasPrefix(name, probePrefix) && !strings.Contains(name, ".tmp-") {
			return // not ours to judge
		}
	}
	st, err := d.stat(name)
	if err != nil || now.Sub(time.Unix(st.Mtim.Unix())) < tempAge {
		return
	}
	if err := d.remove(name); err != nil {
		r.Errors = append(r.Errors, err)
		return
	}
	r.Temporaries = append(r.Temporaries, name)
}

// sweepOrphan reclaims, or reports, one image without a record.
func (p *Pool) sweepOrphan(r *SweepReport, id VolumeID, now time.Time, grace time.Duration) {
	unlock, err := p.Lock(id)
	if err != nil {
		if errors.Is(err, ErrBusy) {
			return // a CreateVolume (or a delete) is working on it
		}
		r.Errors = append(r.Errors, err)
		return
	}
	defer unlock()
	// Under the lock, read again: a CreateVolume may have finished since
	// the listing.
	if _, err := p.vols.stat(recordName(id)); err == nil {
		return
	}
	f, err := p.OpenImage(id, os.O_RDONLY)
	if errors.Is(err, ErrNotFound) {
		return
	}
	if err != nil {
		r.Errors = append(r.Errors, err)
		return
	}
	var st unix.Stat_t
	err = unix.Fstat(int(f.Fd()), &st)
	_, seekErr := unix.Seek(int(f.Fd()), 0, unix.SEEK_DATA)
	f.Close()
	if err != nil {
		r.Errors = append(r.Errors, fmt.Errorf("stat image of %s: %w", id, err))
		return
	}
	o := Orphan{ID: id, SizeBytes: st.Size, Age: now.Sub(time.Unix(st.Mtim.Unix())), HasData: !errors.Is(seekErr, unix.ENXIO)}
	if o.HasData || o.Age < grace {
		r.Orphans = append(r.Orphans, o)
		return
	}
	if err := p.vols.remove(imageName(id)); err != nil {
		r.Errors = append(r.Errors, err)
		return
	}
	p.removeLockFile(id)
	if err := p.vols.sync(); err != nil {
		r.Errors = append(r.Errors, err)
	}
	r.Reclaimed = append(r.Reclaimed, o)
}

// sweepLock removes the lock file of a volume that has neither record nor
// image, under that lock.
func (p *Pool) sweepLock(r *SweepReport, id VolumeID) {
	unlock, err := p.Lock(id)
	if err != nil {
		return
	}
	defer unlock()
	p.dropUnusedLock(r, id)
}

// dropUnusedLock removes the held lock file of id when the volume has
// neither record nor image.
func (p *Pool) dropUnusedLock(r *SweepReport, id VolumeID) {
	if p.exists(recordName(id)) || p.exists(imageName(id)) {
		return
	}
	p.removeLockFile(id)
	r.LockFiles = append(r.LockFiles, lockName(id))
}

// sweepSnapshot removes a snapshot whose CreateSnapshot died mid-copy and
// was not retried within grace: under its lock (a CreateSnapshot at work
// holds it), its record still says not ready and was last written longer
// than grace ago. A retry after that makes it again from the start, as it
// would have anyway.
func (p *Pool) sweepSnapshot(r *SweepReport, id SnapshotID, now time.Time, grace time.Duration) {
	unlock, err := p.LockSnapshot(id)
	if err != nil {
		if !errors.Is(err, ErrBusy) {
			r.Errors = append(r.Errors, err)
		}
		return
	}
	defer unlock()
	s, err := p.ReadSnapshot(id)
	if err != nil {
		if !errors.Is(err, ErrNotFound) {
			r.Errors = append(r.Errors, err)
		}
		return
	}
	if s.ReadyToUse {
		return
	}
	st, err := p.vols.stat(id.stem() + recordSuffix)
	if err != nil || now.Sub(time.Unix(st.Mtim.Unix())) < grace {
		return
	}
	if err := p.DeleteSnapshot(id); err != nil {
		r.Errors = append(r.Errors, err)
		return
	}
	r.UnfinishedSnapshots = append(r.UnfinishedSnapshots, id)
}
