package pool

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"
)

// groupPrefix starts the file names of a group snapshot (group-<hash>.json,
// .lock) and the hash part of its ID; like snapPrefix, it keeps group IDs
// apart from volume and snapshot IDs. A group has no image of its own: its
// members are ordinary snapshots whose records name the group.
const groupPrefix = "group-"

// GroupID names a group snapshot: the pool of its members and a hash of
// its CSI name. Its string form is "<pool>.group-<32 hex>".
type GroupID struct {
	Pool string
	Hash string
}

// String returns the CSI group snapshot ID.
func (id GroupID) String() string { return id.Pool + "." + groupPrefix + id.Hash }

func (id GroupID) stem() string { return groupPrefix + id.Hash }

// DeriveGroupID returns the ID that the group snapshot called name gets in
// pool.
func DeriveGroupID(poolName, name string) GroupID {
	sum := sha256.Sum256([]byte("group\x00" + name))
	return GroupID{Pool: poolName, Hash: hex.EncodeToString(sum[:])[:hashLen]}
}

// ParseGroupID parses s strictly: anything but "<pool name>.group-<32
// lowercase hex>" wraps ErrInvalidID.
func ParseGroupID(s string) (GroupID, error) {
	i := strings.LastIndexByte(s, '.')
	if len(s) <= 63+1+len(groupPrefix)+hashLen && i > 0 {
		hash, ok := strings.CutPrefix(s[i+1:], groupPrefix)
		id := GroupID{Pool: s[:i], Hash: hash}
		if ok && poolNameRE.MatchString(id.Pool) && hashRE.MatchString(id.Hash) {
			return id, nil
		}
	}
	return GroupID{}, fmt.Errorf("group snapshot ID %q is not of the form <pool>.group-<32 hex digits>: %w", s, ErrInvalidID)
}

// MemberName is the snapshot name of a group's member of one volume. It
// starts with a NUL byte, which no CSI name may hold (the controller
// refuses non-printable names), so no snapshot a user names can collide
// with a member.
func MemberName(groupName, volumeID string) string {
	return "\x00group\x00" + groupName + "\x00" + volumeID
}

// Group is the record of one group snapshot, PATH/volumes/group-<hash>.json.
type Group struct {
	ID   string `json:"id"`
	Name string `json:"name"`
	// SourceVolumeIDs are the member volumes, in the order asked for;
	// SnapshotIDs[i] is the snapshot of SourceVolumeIDs[i].
	SourceVolumeIDs []string  `json:"sourceVolumeIDs"`
	SnapshotIDs     []string  `json:"snapshotIDs"`
	Created         time.Time `json:"created"`
	// ReadyToUse is false while the members are being made; a record that
	// says false with nobody holding its lock is the remains of a crash,
	// whose members were not all taken at one instant: the retry (or
	// Sweep) removes every member and the group starts again.
	ReadyToUse bool  `json:"readyToUse"`
	Generation int64 `json:"generation"`
}

func (p *Pool) ownGroup(id GroupID) error {
	if id.Pool != p.Name {
		return fmt.Errorf("group snapshot %s belongs to pool %s, not %s: %w", id, id.Pool, p.Name, ErrInvalidID)
	}
	return nil
}

// LockGroup takes the group snapshot's lock without waiting (ErrBusy when
// it is held), as Lock does for a volume.
func (p *Pool) LockGroup(id GroupID) (Unlock, error) {
	if err := p.ownGroup(id); err != nil {
		return nil, err
	}
	return p.lockStem(id.stem(), "group snapshot "+id.String())
}

// ReadGroup reads a group snapshot's record: ErrNotFound without one,
// ErrCorrupt when it cannot be read.
func (p *Pool) ReadGroup(id GroupID) (*Group, error) {
	if err := p.ownGroup(id); err != nil {
		return nil, err
	}
	var g Group
	if err := p.vols.readRecord(id.stem()+recordSuffix, &g, MaxRecordBytes); err != nil {
		return nil, fmt.Errorf("group snapshot %s: %w", id, err)
	}
	if g.ID != id.String() || len(g.SnapshotIDs) != len(g.SourceVolumeIDs) {
		return nil, fmt.Errorf("group snapshot %s: record names group %q with %d sources and %d snapshots: %w",
			id, g.ID, len(g.SourceVolumeIDs), len(g.SnapshotIDs), ErrCorrupt)
	}
	return &g, nil
}

// WriteGroup stores g atomically and bumps its generation; the caller holds
// LockGroup.
func (p *Pool) WriteGroup(g *Group) error {
	id, err := ParseGroupID(g.ID)
	if err != nil {
		return err
	}
	if err := p.ownGroup(id); err != nil {
		return err
	}
	g.Generation++
	if err := p.vols.writeRecord(id.stem()+recordSuffix, g, MaxRecordBytes); err != nil {
		g.Generation--
		return fmt.Errorf("group snapshot %s: %w", id, err)
	}
	return nil
}

// DeleteGroup removes a group snapshot: its members first, then its record
// and lock file, so a crash in between leaves a record whose retried
// delete finishes. The caller holds LockGroup and LockSnapshot of every
// member. A group that does not exist is not an error.
func (p *Pool) DeleteGroup(g *Group) error {
	id, err := ParseGroupID(g.ID)
	if err != nil {
		return err
	}
	if err := p.ownGroup(id); err != nil {
		return err
	}
	for _, s := range g.SnapshotIDs {
		sid, err := ParseSnapshotID(s)
		if err != nil {
			return fmt.Errorf("group snapshot %s: member %w", id, err)
		}
		if err := p.DeleteSnapshot(sid); err != nil {
			return fmt.Errorf("group snapshot %s: %w", id, err)
		}
	}
	if err := p.vols.remove(id.stem() + recordSuffix); err != nil {
		return fmt.Errorf("delete group snapshot %s: %w", id, err)
	}
	p.vols.remove(id.stem() + lockSuffix)
	return p.vols.sync()
}

// CreateGroupMember is CreateSnapshot of one member of group g: the
// snapshot's record names the group. The caller holds what CreateSnapshot
// asks for, and LockGroup.
func (p *Pool) CreateGroupMember(ctx context.Context, g GroupID, name string, src *Volume, progress Progress) (*Snapshot, error) {
	if err := p.ownGroup(g); err != nil {
		return nil, err
	}
	return p.createSnapshot(ctx, name, g.String(), src, progress)
}

// ListGroupIDs returns the IDs of the group snapshots that have a record,
// sorted.
func (p *Pool) ListGroupIDs() ([]GroupID, error) {
	names, err := p.vols.names()
	if err != nil {
		return nil, fmt.Errorf("pool %s: list group snapshots: %w", p.Name, err)
	}
	var ids []GroupID
	for _, name := range names {
		rest, ok := strings.CutPrefix(name, groupPrefix)
		hash, ok2 := strings.CutSuffix(rest, recordSuffix)
		if ok && ok2 && hashRE.MatchString(hash) {
			ids = append(ids, GroupID{Pool: p.Name, Hash: hash})
		}
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i].Hash < ids[j].Hash })
	return ids, nil
}

// sweepGroup removes a group snapshot whose CreateVolumeGroupSnapshot died
// half-way and was not retried within grace: under its lock and its
// members' locks, its record still says not ready and was last written
// longer than grace ago.
func (p *Pool) sweepGroup(r *SweepReport, id GroupID, now time.Time, grace time.Duration) {
	unlock, err := p.LockGroup(id)
	if err != nil {
		if !errors.Is(err, ErrBusy) {
			r.Errors = append(r.Errors, err)
		}
		return
	}
	defer unlock()
	g, err := p.ReadGroup(id)
	if err != nil {
		if !errors.Is(err, ErrNotFound) {
			r.Errors = append(r.Errors, err)
		}
		return
	}
	if g.ReadyToUse {
		return
	}
	st, err := p.vols.stat(id.stem() + recordSuffix)
	if err != nil || now.Sub(time.Unix(st.Mtim.Unix())) < grace {
		return
	}
	for _, s := range g.SnapshotIDs {
		sid, err := ParseSnapshotID(s)
		if err != nil {
			r.Errors = append(r.Errors, err)
			return
		}
		u, err := p.LockSnapshot(sid)
		if err != nil {
			if !errors.Is(err, ErrBusy) {
				r.Errors = append(r.Errors, err)
			}
			return
		}
		defer u()
	}
	if err := p.DeleteGroup(g); err != nil {
		r.Errors = append(r.Errors, err)
		return
	}
	r.UnfinishedGroups = append(r.UnfinishedGroups, id)
}
