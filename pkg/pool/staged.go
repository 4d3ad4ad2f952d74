package pool

import (
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strings"
	"time"
)

// Staged records: which nodes may still write a volume's image.
//
// A volume's attachments (the record's Attachments) say what the CO wants;
// they do not say what a node does. A ControllerUnpublishVolume that the CO
// forces (kube-controller-manager after maxWaitForUnmountDuration, an
// out-of-service taint, fencing of issue 26 on purpose) removes the
// attachment while the node still has the volume staged and writes to it.
// A move (move.go) or a thinning (layout.go) of the image then would lose
// those writes. So each node plugin keeps, in the volume's home pool (the one
// its ID names: it holds the volume's record for its whole life and its lock),
// one record per node that has the volume staged:
//
//	PATH/staged/<hash>.<node ID>.json   {volumeID, node, nodeStart, staged, readOnly}
//
// and MoveVolume and SetLayout(thin) refuse (ErrInUse, naming the nodes)
// while any entry of the volume is there, under the volume's lock.
//
// Crash orders (nothing lost on a crash; a record left by a crashed node keeps
// refusing):
//
//   - NodeStageVolume writes the record (fsync'd, renamed, directory
//     fsync'd) before it attaches a loop device, then reads the volume's
//     record again and stages only if it is still attached to the node. A
//     crash before the record: nothing attached. After it: a record and
//     perhaps a device; the move refuses either way. The second read closes
//     the race with a move: the move lists the records after it read the
//     attachments empty, so either it sees this record, or this node's
//     second read comes after the detach and refuses.
//   - NodeUnstageVolume removes the record only after the loop device is
//     detached (and the filesystem unmounted), and only when the node has no
//     device of the image left in any pool. A crash before the removal leaves
//     the record; the retried unstage (which finds nothing staged) removes it.
//   - A node plugin that restarts removes its own records of volumes of
//     which it has no loop device (a stage that died before its attach, an
//     unstage that died after its detach: no RPC runs yet, so none can be
//     half-way), and writes the record of every device it has without one
//     (a device staged by a plugin older than these records).
//
// Nothing else removes a record: the controller cannot know that a node it
// cannot reach has stopped writing. A record is the node's claim, and only
// the node drops it, or, once built, fencing (issue 26), which must first
// make sure the node cannot write the image any more. The record is made for
// that: one file per node (breaking one node's claim touches no other's), and
// the node plugin's incarnation (NodeStart, the LastStart of its node record)
// in it. A fence of node N "through incarnation S" makes N's open files stop
// being the volume (its image replaced under it), then, under the volume's
// lock, removes N's records whose NodeStart is at most S (BreakStaged, to be
// added beside RemoveStaged), and leaves a record of a later incarnation (N
// came back, was attached again, and staged anew) alone. A record that cannot
// be read cannot be compared: fencing would break it only once the fence
// covers every incarnation of N.
//
// Every entry is untrusted (a shared pool is written by every node): names
// are parsed strictly, files read through the pool's helpers (no symlink
// followed, regular files of the pool's owner only, bounded reads), and an
// entry that is not a readable record of the volume still refuses the move,
// named in the message, rather than being ignored.

const stagedDir = "staged"

// Staged is the record that a node has a volume staged, in the volume's home
// pool: PATH/staged/<hash>.<node ID>.json.
type Staged struct {
	// VolumeID and Node say whose record it is; they must match its name.
	VolumeID string `json:"volumeID"`
	Node     string `json:"node"`
	// NodeStart is the incarnation of the node plugin that staged it: the
	// LastStart of its node record. Fencing breaks only the records of the
	// incarnations it fenced (see above).
	NodeStart time.Time `json:"nodeStart"`
	// Staged is when the record was written.
	Staged time.Time `json:"staged"`
	// ReadOnly says the node staged it read-only; it still reads the image
	// a move would replace, so it refuses the move too.
	ReadOnly bool `json:"readOnly,omitempty"`
}

// stagedName is the file name of node's record of volume id.
func stagedName(id VolumeID, node string) string { return id.Hash + "." + node + recordSuffix }

// homeOf checks that p is the home pool of id, where its staged records live.
func (p *Pool) homeOf(id VolumeID) error {
	if id.Pool != p.Name {
		return fmt.Errorf("volume %s: pool %s is not its home, where its staged records are: %w", id, p.Name, ErrInvalidID)
	}
	return nil
}

// WriteStaged records that rec.Node has volume rec.VolumeID staged; p is the
// volume's home pool. The record is durable when it returns (temporary,
// fsync, rename, directory fsync): the node plugin attaches the image only
// after. The node plugin calls it under its own lock of the volume: only
// that node writes the node's record.
func (p *Pool) WriteStaged(rec Staged) error {
	id, err := ParseVolumeID(rec.VolumeID)
	if err != nil {
		return err
	}
	if err := ValidateNodeID(rec.Node); err != nil {
		return err
	}
	if err := p.homeOf(id); err != nil {
		return err
	}
	if err := p.staged.writeRecord(stagedName(id, rec.Node), rec, maxSmallRecordBytes); err != nil {
		return fmt.Errorf("volume %s: record that node %s staged it: %w", id, rec.Node, err)
	}
	return nil
}

// ReadStaged reads node's record of volume id (p its home): ErrNotFound
// without one, ErrCorrupt when it is not a readable record of that volume
// and node.
func (p *Pool) ReadStaged(id VolumeID, node string) (*Staged, error) {
	if err := ValidateNodeID(node); err != nil {
		return nil, err
	}
	if err := p.homeOf(id); err != nil {
		return nil, err
	}
	var rec Staged
	if err := p.staged.readRecord(stagedName(id, node), &rec, maxSmallRecordBytes); err != nil {
		return nil, fmt.Errorf("volume %s, staged on node %s: %w", id, node, err)
	}
	if rec.VolumeID != id.String() || rec.Node != node {
		return nil, fmt.Errorf("volume %s, staged on node %s: the record names volume %.140q and node %.140q: %w",
			id, node, rec.VolumeID, rec.Node, ErrCorrupt)
	}
	return &rec, nil
}

// RemoveStaged removes node's record of volume id (p its home), durably. The
// node plugin calls it once it has no device of the volume's image left;
// nobody else may (see above). A missing record is not an error.
func (p *Pool) RemoveStaged(id VolumeID, node string) error {
	if err := ValidateNodeID(node); err != nil {
		return err
	}
	if err := p.homeOf(id); err != nil {
		return err
	}
	if _, err := p.staged.stat(stagedName(id, node)); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err := p.staged.remove(stagedName(id, node)); err != nil {
		return err
	}
	return p.staged.sync()
}

// StagedEntry is one entry of a volume's staged records, as CheckUnstaged
// found it: the node its name gives, and, if it is not a readable record of
// the volume and that node, why.
type StagedEntry struct {
	// Node is the node ID the entry's name gives ("" when the name gives
	// none: the entry is then named in Problem).
	Node string
	// Record is the record, when it could be read.
	Record *Staged
	// Problem says why the entry is not a readable record, or is "".
	Problem string
}

// String describes the entry for messages.
func (e StagedEntry) String() string {
	switch {
	case e.Problem != "" && e.Node != "":
		return fmt.Sprintf("%s (an unreadable record: %s)", e.Node, e.Problem)
	case e.Problem != "":
		return e.Problem
	case e.Record.ReadOnly:
		return fmt.Sprintf("%s (read-only, since %s)", e.Node, e.Record.Staged.Format(time.RFC3339))
	}
	return fmt.Sprintf("%s (since %s)", e.Node, e.Record.Staged.Format(time.RFC3339))
}

// StagedOn lists the entries of volume id's staged records in p, its home
// pool, sorted by name: every entry whose name starts with the volume's hash
// and a dot, whatever it is (a record, a corrupt one, a symlink, a
// directory). Temporaries (names starting with a dot) are not records yet.
func (p *Pool) StagedOn(id VolumeID) ([]StagedEntry, error) {
	if err := p.homeOf(id); err != nil {
		return nil, err
	}
	names, err := p.staged.names()
	if err != nil {
		return nil, fmt.Errorf("volume %s: list its staged records: %w", id, err)
	}
	sort.Strings(names)
	var out []StagedEntry
	for _, name := range names {
		rest, ok := strings.CutPrefix(name, id.Hash+".")
		if !ok {
			continue
		}
		node, ok := strings.CutSuffix(rest, recordSuffix)
		if !ok || ValidateNodeID(node) != nil {
			out = append(out, StagedEntry{Problem: fmt.Sprintf("an entry %s/%.200q that is not a staged record", p.staged.path, name)})
			continue
		}
		rec, err := p.ReadStaged(id, node)
		if err != nil {
			out = append(out, StagedEntry{Node: node, Problem: err.Error()})
			continue
		}
		out = append(out, StagedEntry{Node: node, Record: rec})
	}
	return out, nil
}

// CheckUnstaged answers ErrInUse, naming the nodes, while any node may still
// have volume id staged (p its home pool; see StagedOn); what says what
// waits for it ("it moves to pool fast"). The caller holds Lock(id), and read
// the volume's attachments under it before calling.
func (p *Pool) CheckUnstaged(id VolumeID, what string) error {
	entries, err := p.StagedOn(id)
	if err != nil {
		return err
	}
	if len(entries) == 0 {
		return nil
	}
	desc := make([]string, len(entries))
	for i, e := range entries {
		desc[i] = e.String()
	}
	return fmt.Errorf("volume %s is still staged on node %s, which may write it (its records are in %s): %s only once every node has unstaged it (NodeUnstageVolume); "+
		"a node that died keeps its record until it is back and cleans up, or is fenced: %w",
		id, strings.Join(desc, ", "), p.staged.path, what, ErrInUse)
}

// ListStaged returns the volumes of which node has a staged record in this
// pool (their home), sorted: the entries named like node's records, whether
// or not they can be read. The node plugin reconciles its own at start.
func (p *Pool) ListStaged(node string) ([]VolumeID, error) {
	if err := ValidateNodeID(node); err != nil {
		return nil, err
	}
	names, err := p.staged.names()
	if err != nil {
		return nil, fmt.Errorf("pool %s: list staged records: %w", p.Name, err)
	}
	var ids []VolumeID
	for _, name := range names {
		if len(name) <= hashLen+1 || name[hashLen] != '.' {
			continue
		}
		hash, rest := name[:hashLen], name[hashLen+1:]
		if hashRE.MatchString(hash) && rest == node+recordSuffix {
			ids = append(ids, VolumeID{Pool: p.Name, Hash: hash})
		}
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i].Hash < ids[j].Hash })
	return ids, nil
}

// VolumeOfImage returns the ID of the volume whose image volumes/<hash>.img
// is in this pool, as the record beside it names it: this pool's, or the
// home pool's of a volume moved here. A restarted node plugin maps the
// backing file of a loop device to its volume with it. ok is false when
// there is no full record of that hash here.
func (p *Pool) VolumeOfImage(hash string) (id VolumeID, ok bool) {
	if !hashRE.MatchString(hash) {
		return VolumeID{}, false
	}
	var v Volume
	if err := p.vols.readRecord(hash+recordSuffix, &v, MaxRecordBytes); err != nil || v.MovedTo != "" {
		return VolumeID{}, false
	}
	id, err := ParseVolumeID(v.ID)
	if err != nil || id.Hash != hash {
		return VolumeID{}, false
	}
	return id, true
}

// ImageHash returns the hash of the volume image at path if path is an image
// of this pool (PATH/volumes/<hash>.img), as a loop device's backing file
// names it.
func (p *Pool) ImageHash(path string) (string, bool) {
	rest, ok := strings.CutPrefix(path, p.Path+"/"+volumesDir+"/")
	if !ok {
		return "", false
	}
	hash, ok := strings.CutSuffix(rest, imageSuffix)
	if !ok || !hashRE.MatchString(hash) {
		return "", false
	}
	return hash, true
}
