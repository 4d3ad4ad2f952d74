package pool

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Moving a volume to another pool of its zone, keeping its ID.
//
// A volume's ID names its home pool ("<home>.<hash>"): the CSI objects that
// hold the ID (PersistentVolume, VolumeAttachment) never change, so the ID
// must keep working after the volume's data has moved. The home pool keeps
// the volume's record for its whole life; after a move it is a forwarding
// record that says which pool the volume lives in (MovedTo), and that pool
// holds the image and the full record under the same file stem (<hash>.img,
// <hash>.json, whose ID still names the home pool). Lookups by ID (Locate)
// read the home record and follow at most one forwarding hop, strictly:
// the target must be another configured pool of the same zone, and its
// record must be a full record naming the same ID; anything else is
// ErrCorrupt and is never followed further.
//
// The volume lock is the home pool's lock of the ID, whatever pool the
// volume lives in; a move also takes the stem's lock in the pools it moves
// from and to, which keeps their Sweep and any CreateVolume of the same
// name (whose hash is the same) away.
//
// A move from pool R (where the volume lives) to pool T, with the home
// pool's lock held, the volume detached:
//
//  1. intent: the home record gets Move{From: R, To: T} (fsync'd, renamed);
//  2. copy: under T's pool lock, T's space is checked and reserved (the
//     image's size, or for a thin image its data, as for a clone), then the
//     image is copied into T/.<hash>.img.moving with the sparse-aware copy
//     of copy.go (copy_file_range of the data ranges, holes kept, or reads
//     and writes between two filesystems, where the kernel refuses it; a
//     reflink where R and T share a filesystem that can), fsync'd;
//  3. image: the temporary is renamed to T/<hash>.img, the directory
//     fsync'd: from here on the copy is durable and the move only goes
//     forward;
//  4. record: T/<hash>.json gets the full record (same ID), atomically
//     (skipped when T is the home pool: step 5 writes it there);
//  5. commit: the home record becomes a forwarding record to T (or, moving
//     back home, the full record) with Move{Committed: true}, atomically;
//  6. cleanup: R's image (and R's record, if R is not the home pool) are
//     removed, then the home record drops Move.
//
// What a crash leaves, and what FinishMove (run by a retried ModifyVolume,
// by any RPC that takes the volume's lock, and by Sweep once the intent is
// older than the grace) does with it:
//
//   - after 1 or during 2: Move not committed and no T/<hash>.img: roll back
//     (remove the temporary, drop Move); the volume never left R. A retried
//     ModifyVolume then copies again.
//   - after 3 or 4: Move not committed, T/<hash>.img present: roll forward
//     (4, 5, 6). The copy was fsync'd before the rename, so it is whole.
//   - after 5: Move committed: cleanup (6).
//
// Lookups before the commit find the volume in R, after it in T; the record
// is switched by one rename, so no reader ever sees it in both or neither.
// The source image is removed only after the commit, so every crash leaves
// one complete image that the record names. Capacity: T's space is taken
// by the reservation before the copy (the temporary's promise is counted by
// Usage), and the volume is T's once committed; R's space comes back at the
// cleanup.
//
// Snapshots of a volume are not moved: they stand alone in the pool they
// were taken in (restorable there, as any snapshot), and new snapshots are
// taken in the pool the volume lives in.

// moveTempSuffix ends the name of the temporary image of a move,
// .<hash>.img.moving. Pool.Sweep leaves it alone (it is not a record
// temporary): FinishMove removes it with the intent it belongs to.
const moveTempSuffix = imageSuffix + ".moving"

func moveTempName(id VolumeID) string { return "." + id.Hash + moveTempSuffix }

// Move is a move of a volume between pools, kept in its home record until
// it is finished.
type Move struct {
	// From is the pool the volume lived in when the move began, To the
	// pool it goes to.
	From string `json:"from"`
	To   string `json:"to"`
	// Committed says the volume lives in To; what is left in From is yet
	// to be removed.
	Committed bool `json:"committed,omitempty"`
}

// Peers finds a configured pool by name (nil if there is none): the pools a
// forwarding record may name.
type Peers func(name string) *Pool

// MoveStep names the steps of a move, for MoveOptions.AfterStep.
type MoveStep string

// The steps of a move, in order.
const (
	StepIntent    MoveStep = "intent"
	StepCopied    MoveStep = "copied"
	StepImage     MoveStep = "image"
	StepRecord    MoveStep = "record"
	StepCommitted MoveStep = "committed"
	StepCleaned   MoveStep = "cleaned"
)

// MoveSteps are the steps in order.
var MoveSteps = []MoveStep{StepIntent, StepCopied, StepImage, StepRecord, StepCommitted, StepCleaned}

// MoveOptions tune a move.
type MoveOptions struct {
	// Progress hears of the copy.
	Progress Progress
	// AfterStep, if set (by tests), runs after each durable step; an error
	// it returns stops the move there, as a crash would: nothing is
	// rolled back.
	AfterStep func(MoveStep) error
}

func (o MoveOptions) after(s MoveStep) error {
	if o.AfterStep == nil {
		return nil
	}
	return o.AfterStep(s)
}

// readHome reads the record of id in its home pool p, whatever its form
// (full, forwarding, with a move in progress).
func (p *Pool) readHome(id VolumeID) (*Volume, error) {
	if id.Pool != p.Name {
		return nil, fmt.Errorf("volume %s: pool %s is not its home: %w", id, p.Name, ErrInvalidID)
	}
	return p.readRecordOf(id)
}

// writeHome stores the home record hv of a volume in its home pool.
func (p *Pool) writeHome(hv *Volume) error {
	id, err := ParseVolumeID(hv.ID)
	if err != nil {
		return err
	}
	hv.Generation++
	if err := p.vols.writeRecord(recordName(id), hv, MaxRecordBytes); err != nil {
		hv.Generation--
		return fmt.Errorf("volume %s: %w", id, err)
	}
	return nil
}

// peer checks a pool name that a record of home's volume id names (a
// forwarding target, a move's end) and returns that pool: it must be
// configured and of the home pool's zone, else the record is corrupt.
func (p *Pool) peer(id VolumeID, name string, peers Peers) (*Pool, error) {
	if ValidatePoolName(name) != nil {
		return nil, fmt.Errorf("volume %s: its record names pool %.70q: %w", id, name, ErrCorrupt)
	}
	q := peers(name)
	switch {
	case q == nil:
		return nil, fmt.Errorf("volume %s: its record names pool %s, which is not configured: %w", id, name, ErrCorrupt)
	case q.Zone != p.Zone:
		return nil, fmt.Errorf("volume %s: its record names pool %s of zone %s, not of its zone %s: %w", id, name, q.Zone, p.Zone, ErrCorrupt)
	}
	return q, nil
}

// Locate finds the volume id, whose home pool is p: it reads the home
// record and, if that forwards, the record in the pool it names (one hop,
// strictly: see the design above). It returns the pool the volume lives
// in, whose methods then act on it (OpenImage, WriteVolume, ...), and the
// volume's record. A home record without a volume wraps ErrNotFound; so
// does a forwarding record whose target has no record (a DeleteVolume that
// died after removing the target's files and before the forwarding record).
// Locate takes no lock: a caller that acts on the answer holds Lock(id).
func (p *Pool) Locate(id VolumeID, peers Peers) (*Pool, *Volume, error) {
	hv, err := p.readHome(id)
	if err != nil {
		return nil, nil, err
	}
	if hv.MovedTo == "" {
		return p, hv, nil
	}
	if hv.MovedTo == p.Name {
		return nil, nil, fmt.Errorf("volume %s: its record forwards to its own pool: %w", id, ErrCorrupt)
	}
	q, err := p.peer(id, hv.MovedTo, peers)
	if err != nil {
		return nil, nil, err
	}
	v, err := q.readRecordOf(id)
	switch {
	case errors.Is(err, ErrNotFound):
		return nil, nil, fmt.Errorf("volume %s was moved to pool %s, which has no record of it: %w", id, q.Name, ErrNotFound)
	case errors.Is(err, ErrGuest):
		return nil, nil, fmt.Errorf("volume %s was moved to pool %s, whose record under its name is another volume's: %w", id, q.Name, ErrCorrupt)
	case err != nil:
		return nil, nil, fmt.Errorf("volume %s, moved to pool %s: %w", id, q.Name, err)
	case v.MovedTo != "" || v.Move != nil:
		return nil, nil, fmt.Errorf("volume %s was moved to pool %s, whose record of it forwards again (to %q) or moves: %w",
			id, q.Name, v.MovedTo, ErrCorrupt)
	}
	return q, v, nil
}

// Resident returns the pool volume id lives in (Locate without the record),
// or the home pool p when it cannot tell: the reads that follow then report
// what is wrong.
func (p *Pool) Resident(id VolumeID, peers Peers) *Pool {
	if q, _, err := p.Locate(id, peers); err == nil {
		return q
	}
	return p
}

// MoveVolume moves volume id, whose home pool is p, to pool to (see the
// design above) and returns its record there. The caller holds Lock(id) in
// p. A move that a crash interrupted is finished first (FinishMove); a
// volume in to already is left as it is. A volume attached anywhere, or
// staged on any node (staged.go), is refused (ErrInUse): the copy must see
// every write. A target without the
// space is refused with ErrNoSpace before anything changes. ctx bounds the
// wait for the target's pool lock before the copy (ErrBusy); the copy, once
// begun, runs to its end.
func (p *Pool) MoveVolume(ctx context.Context, id VolumeID, to *Pool, peers Peers, opts MoveOptions) (*Volume, error) {
	if _, err := p.FinishMove(id, peers); err != nil {
		return nil, err
	}
	from, v, err := p.Locate(id, peers)
	if err != nil {
		return nil, err
	}
	if from == to {
		return v, nil
	}
	if q := peers(to.Name); q != to || to.Zone != p.Zone {
		return nil, fmt.Errorf("volume %s of zone %s cannot move to pool %s of zone %s: %w", id, p.Zone, to.Name, to.Zone, ErrInvalidID)
	}
	if len(v.Attachments) > 0 {
		nodes := make([]string, 0, len(v.Attachments))
		for _, a := range v.Attachments {
			nodes = append(nodes, a.Node)
		}
		return nil, fmt.Errorf("volume %s is attached to %s; it moves only while detached: %w", id, strings.Join(nodes, ", "), ErrInUse)
	}
	// Detached is not enough: a node that was detached by force may still
	// have it staged and write it (staged.go).
	if err := p.CheckUnstaged(id, "it moves to pool "+to.Name); err != nil {
		return nil, err
	}
	if v.Modifying != nil {
		return nil, fmt.Errorf("volume %s has an unfinished change of its layout (%v); finish it before the move: %w", id, v.Modifying, ErrBusy)
	}
	if avail, err := to.Available(); err != nil {
		return nil, err
	} else if v.SizeBytes > avail {
		return nil, fmt.Errorf("pool %s has %d bytes available, volume %s needs %d: %w", to.Name, avail, id, v.SizeBytes, ErrNoSpace)
	}
	unlock, err := lockEnds(p, id, from, to)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := to.clearFor(id, p); err != nil {
		return nil, err
	}

	hv := v
	if from != p {
		if hv, err = p.readHome(id); err != nil {
			return nil, err
		}
	}
	hv.Move = &Move{From: from.Name, To: to.Name}
	if err := p.writeHome(hv); err != nil {
		return nil, err
	}
	if err := opts.after(StepIntent); err != nil {
		return nil, err
	}
	if err := to.copyIn(ctx, id, from, v, opts.Progress); err != nil {
		// A copy that failed (ENOSPC, EIO) is rolled back at once: the
		// volume never left from.
		if rerr := p.rollBack(hv, id, to); rerr != nil {
			err = errors.Join(err, rerr)
		}
		return nil, err
	}
	if err := opts.after(StepCopied); err != nil {
		return nil, err
	}
	if err := unix.Renameat(to.vols.fd(), moveTempName(id), to.vols.fd(), imageName(id)); err != nil {
		return nil, fmt.Errorf("volume %s: rename its copy into place in pool %s: %w", id, to.Name, err)
	}
	if err := to.vols.sync(); err != nil {
		return nil, err
	}
	if err := opts.after(StepImage); err != nil {
		return nil, err
	}
	return p.rollForward(id, hv, from, to, v, opts)
}

// clearFor makes sure this pool, the target of a move of volume id (home
// pool home), holds nothing under the volume's file names before the
// intent is written: FinishMove takes an image there for the move's own
// durable copy, so a stranger there could be taken for it and the source
// removed. An image without a record that holds no data (what a dead
// CreateVolume of the same name leaves, which Sweep would reclaim and a
// CreateVolume would replace) is removed, durably; an image with data, or
// a record (other than the home record itself), is refused: loopvol did
// not leave it there, and it is not loopvol's to destroy.
func (to *Pool) clearFor(id VolumeID, home *Pool) error {
	if to != home && to.exists(recordName(id)) {
		return fmt.Errorf("pool %s has a record %s/%s under the name of volume %s, which moves there: move it aside and retry: %w",
			to.Name, to.vols.path, recordName(id), id, ErrCorrupt)
	}
	f, _, err := to.vols.open(imageName(id), unix.O_RDONLY)
	if errors.Is(err, fs.ErrNotExist) {
		return to.vols.remove(moveTempName(id))
	}
	if err != nil {
		return fmt.Errorf("pool %s, where volume %s moves: %w", to.Name, id, err)
	}
	_, seekErr := unix.Seek(int(f.Fd()), 0, unix.SEEK_DATA)
	f.Close()
	if !errors.Is(seekErr, unix.ENXIO) {
		return fmt.Errorf("pool %s has an image %s/%s holding data under the name of volume %s, which moves there: move it aside and retry: %w",
			to.Name, to.vols.path, imageName(id), id, ErrCorrupt)
	}
	if err := to.vols.remove(imageName(id)); err != nil {
		return err
	}
	if err := to.vols.remove(moveTempName(id)); err != nil {
		return err
	}
	return to.vols.sync()
}

// lockEnds takes the stem locks of id in from and to, those that are not
// the home pool p (whose lock the caller holds), in pool-name order.
func lockEnds(p *Pool, id VolumeID, from, to *Pool) (Unlock, error) {
	ends := []*Pool{from, to}
	if to.Name < from.Name {
		ends = []*Pool{to, from}
	}
	var held []Unlock
	release := func() {
		for i := len(held) - 1; i >= 0; i-- {
			held[i]()
		}
	}
	for _, q := range ends {
		if q == p {
			continue
		}
		u, err := q.lockStem(id.Hash, "volume "+id.String()+" in pool "+q.Name)
		if err != nil {
			release()
			return nil, err
		}
		held = append(held, u)
	}
	return release, nil
}

// copyIn copies the image of volume v from pool from into this pool's
// temporary .<hash>.img.moving, fsync'd and durable in the directory. The
// space check and reservation are those of a clone (fill), under this
// pool's lock.
func (to *Pool) copyIn(ctx context.Context, id VolumeID, from *Pool, v *Volume, progress Progress) error {
	in, _, err := from.vols.open(imageName(id), unix.O_RDONLY)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("volume %s: its image in pool %s is missing: %w", id, from.Name, ErrCorrupt)
	}
	if err != nil {
		return err
	}
	defer in.Close()
	tmp := moveTempName(id)
	if err := to.vols.remove(tmp); err != nil {
		return err
	}
	fd, err := unix.Openat(to.vols.fd(), tmp, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("create %s/%s: %w", to.vols.path, tmp, err)
	}
	out := os.NewFile(uintptr(fd), to.vols.path+"/"+tmp)
	defer out.Close()
	_, err = to.fill(ctx, out, in, v.SizeBytes, v.SizeBytes, v.Thin, progress)
	if err == nil {
		err = out.Sync()
	}
	if err == nil {
		err = to.vols.sync()
	}
	if err != nil {
		to.vols.remove(tmp)
		return fmt.Errorf("volume %s: copy into pool %s: %w", id, to.Name, err)
	}
	return nil
}

// rollForward does steps 4 to 6 of a move whose image is in to already;
// hv is the home record (with the uncommitted Move), v the full record in
// from.
func (p *Pool) rollForward(id VolumeID, hv *Volume, from, to *Pool, v *Volume, opts MoveOptions) (*Volume, error) {
	full := *v
	full.Move, full.MovedTo = nil, ""
	full.Generation = max(hv.Generation, v.Generation)
	if to != p {
		if err := to.vols.writeRecord(recordName(id), &full, MaxRecordBytes); err != nil {
			return nil, fmt.Errorf("volume %s: write its record in pool %s: %w", id, to.Name, err)
		}
		if err := opts.after(StepRecord); err != nil {
			return nil, err
		}
		hv = &Volume{ID: id.String(), Name: v.Name, MovedTo: to.Name, Generation: full.Generation,
			Move: &Move{From: from.Name, To: to.Name, Committed: true}}
	} else {
		if err := opts.after(StepRecord); err != nil {
			return nil, err
		}
		back := full
		back.Move = &Move{From: from.Name, To: to.Name, Committed: true}
		hv = &back
	}
	if err := p.writeHome(hv); err != nil {
		return nil, err
	}
	if err := opts.after(StepCommitted); err != nil {
		return nil, err
	}
	if err := p.cleanup(id, hv, from, opts); err != nil {
		return nil, err
	}
	full.resident = to.Name
	if to == p {
		full = *hv
		full.resident = p.Name
	}
	return &full, nil
}

// cleanup does step 6: it removes what is left of volume id in from, then
// drops the committed Move from the home record hv.
func (p *Pool) cleanup(id VolumeID, hv *Volume, from *Pool, opts MoveOptions) error {
	names := []string{imageName(id)}
	if from != p {
		names = append(names, recordName(id))
	}
	for _, name := range names {
		if err := from.vols.remove(name); err != nil {
			return fmt.Errorf("volume %s: remove its old copy in pool %s: %w", id, from.Name, err)
		}
	}
	if err := from.vols.sync(); err != nil {
		return err
	}
	if err := opts.after(StepCleaned); err != nil {
		return err
	}
	hv.Move = nil
	return p.writeHome(hv)
}

// FinishMove finishes, or rolls back, a move of volume id (home pool p)
// that was interrupted: see the design above. The caller holds Lock(id) in
// p. It returns whether there was one. A volume without a record, or
// without a move, is left as it is.
func (p *Pool) FinishMove(id VolumeID, peers Peers) (bool, error) {
	hv, err := p.readHome(id)
	if errors.Is(err, ErrNotFound) {
		return false, nil
	}
	if err != nil || hv.Move == nil {
		return false, err
	}
	m := *hv.Move
	if m.From == m.To {
		return true, fmt.Errorf("volume %s: its record moves it from pool %s to itself: %w", id, m.From, ErrCorrupt)
	}
	from, err := p.endOfMove(id, m.From, peers)
	if err != nil {
		return true, err
	}
	to, err := p.endOfMove(id, m.To, peers)
	if err != nil {
		return true, err
	}
	// The pool the volume lives in, as the home record says, must be
	// the move's start before the commit and its end after it.
	where := p.Name
	if hv.MovedTo != "" {
		where = hv.MovedTo
	}
	if (!m.Committed && where != m.From) || (m.Committed && where != m.To) {
		return true, fmt.Errorf("volume %s: its record says it lives in pool %s and moves from %s to %s (committed %t): %w",
			id, where, m.From, m.To, m.Committed, ErrCorrupt)
	}
	unlock, err := lockEnds(p, id, from, to)
	if err != nil {
		return true, err
	}
	defer unlock()
	if m.Committed {
		return true, p.cleanup(id, hv, from, MoveOptions{})
	}
	if _, err := to.vols.stat(imageName(id)); err == nil {
		// The copy is in place and whole: go forward.
		v := hv
		if from != p {
			if _, v, err = p.Locate(id, peers); err != nil {
				return true, err
			}
		}
		_, err = p.rollForward(id, hv, from, to, v, MoveOptions{})
		return true, err
	} else if !errors.Is(err, fs.ErrNotExist) {
		return true, err
	}
	return true, p.rollBack(hv, id, to)
}

// rollBack undoes a move of volume id to pool to whose copy is not durable
// yet: the temporary goes before the intent in the home record hv, so no
// temporary outlives the record that names it. The caller holds the locks.
func (p *Pool) rollBack(hv *Volume, id VolumeID, to *Pool) error {
	if err := to.vols.remove(moveTempName(id)); err != nil {
		return err
	}
	if err := to.vols.sync(); err != nil {
		return err
	}
	hv.Move = nil
	return p.writeHome(hv)
}

// endOfMove checks a pool a move names: the home pool itself, or a peer
// of its zone.
func (p *Pool) endOfMove(id VolumeID, name string, peers Peers) (*Pool, error) {
	if name == p.Name {
		return p, nil
	}
	return p.peer(id, name, peers)
}

// MoveSweep says what SweepMoves did.
type MoveSweep struct {
	// Finished are the volumes whose interrupted move was finished or
	// rolled back.
	Finished []VolumeID
	// Errors are the volumes it could not settle.
	Errors []error
}

// SweepMoves settles the moves of this pool's volumes (p is their home)
// that were interrupted and not retried: a home record with a move whose
// last write is older than grace, whose lock nobody holds. The lock keeps
// it away from a move at work; the grace is for an NFS pool whose flocks
// other hosts do not see.
func (p *Pool) SweepMoves(now time.Time, grace time.Duration, peers Peers) MoveSweep {
	var r MoveSweep
	ids, err := p.ListVolumeIDs()
	if err != nil {
		r.Errors = append(r.Errors, err)
		return r
	}
	for _, id := range ids {
		hv, err := p.readHome(id)
		if err != nil || hv.Move == nil {
			continue // unreadable records are for the health checks
		}
		st, err := p.vols.stat(recordName(id))
		if err != nil || now.Sub(time.Unix(st.Mtim.Unix())) < grace {
			continue
		}
		unlock, err := p.Lock(id)
		if err != nil {
			continue
		}
		did, err := p.FinishMove(id, peers)
		unlock()
		if err != nil {
			r.Errors = append(r.Errors, err)
		} else if did {
			r.Finished = append(r.Finished, id)
		}
	}
	return r
}
