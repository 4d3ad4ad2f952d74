package pool

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// Fencing, the storage side (issue 26; the detection of a dead node and the
// controller's part build on it).
//
// A node that stopped answering may still write: frozen, it resumes where
// it stopped when it is thawed; cut off, it never stopped. Nothing can be
// asked of it. What the pool can do alone is change which file is the
// volume: FenceImage makes a new file with the image's data (a reflink
// where the filesystem has them: a point-in-time copy that xfs makes under
// the inode's lock after flushing its dirty pages, so every write
// acknowledged before it is in it) and renames it over the image. The
// fenced node's loop device, and any descriptor it holds, keeps the old
// inode, which no name reaches any more: what it writes after the rename
// goes there and is lost with it when it lets go. Over NFS the server
// unlinks the old inode at the rename, and the node's handle of it goes
// stale (ESTALE) at its next write.
//
// Every holder of the old inode loses the volume, not only the fenced
// node: the caller fences only while no other node may have the volume
// staged (its staged records name the fenced nodes only), under the
// volume's lock, and then breaks the fenced node's staged record
// (BreakStaged) so that the volume can be staged elsewhere and moved.
//
// Crash orders: the copy is made under a temporary name (Sweep removes it
// after tempAge when a crash leaves it); the rename is the fence, atomic;
// the staged record is broken after it. A crash before the rename leaves
// the old image the volume (retried, the fence copies again); after it, the
// volume is fenced and the retry copies once more, harmless; a record not
// yet broken keeps refusing the move until the retry breaks it.
//
// Without reflink the new file is a full copy of the image's data: the
// volume's writers wait for it (the caller holds the volume's lock, no node
// stages it meanwhile) and it needs the space of the data once more, which
// is refused with ErrNoSpace before anything changes. A copy is consistent
// only if nothing writes the image while it is made: the caller fences by
// copy a node it knows stopped, but that node can come back during the
// copy (thawed, its link up) and write again. So the image's change and
// modification times and size are read before the copy and again after
// it is durable, and a copy during which they moved is thrown away
// (ErrWrittenDuringFence), the image left the volume: the node is back,
// and the caller, retrying, finds it serving. Every write through a loop
// device updates them (the backing file's write path does, direct I/O or
// not), and since Linux 6.13 (multigrain timestamps, ext4 and xfs) a
// change right after the first read still shows as a new time; on older
// kernels a write within the same clock tick as that read would not. A
// write after the second read and before the rename is in the old inode
// only: the fence is then the image as of that read, a point in time as
// consistent as a crash. A reflinked fence
// shares its blocks with the old inode for as long as the fenced node holds
// it, and counts as copy-on-write reserve then (cow.go); it is made even
// when the pool cannot back that reserve, since losing the fence would
// lose data for sure.

// Fence methods, as FenceImage returns them.
const (
	FenceReflink = "reflink"
	FenceCopy    = "copy"
)

// FenceImage replaces the image of volume id (p is its home pool; the
// image is where the volume lives, peers finds that pool) with a new file
// holding the same data, so that whoever has the old image open no longer
// reaches the volume (see above). The caller holds Lock(id) in p. It
// returns how the new file was made; progress hears of a full copy.
func (p *Pool) FenceImage(ctx context.Context, id VolumeID, peers Peers, progress Progress) (string, error) {
	return p.fenceImage(ctx, id, peers, progress, true)
}

// FenceImageByReflink is FenceImage where a full copy is no answer: on a
// pool without reflink it changes nothing and returns an error wrapping
// ErrNeedsCopy. A copy is made while the volume's writers go on (the lock
// keeps other callers out, not a node that still writes), so it is a
// consistent image only when the fenced node has stopped writing; a
// reflink is one whatever the node does. A caller that cannot know the
// node stopped (a ControllerUnpublishVolume the CO forced) fences with
// this.
func (p *Pool) FenceImageByReflink(ctx context.Context, id VolumeID, peers Peers) (string, error) {
	return p.fenceImage(ctx, id, peers, nil, false)
}

func (p *Pool) fenceImage(ctx context.Context, id VolumeID, peers Peers, progress Progress, allowCopy bool) (string, error) {
	if err := p.homeOf(id); err != nil {
		return "", err
	}
	q, v, err := p.Locate(id, peers)
	if err != nil {
		return "", err
	}
	if v.Move != nil {
		return "", fmt.Errorf("volume %s has an unfinished move; finish it before the fence: %w", id, ErrBusy)
	}
	name := id.Hash + imageSuffix
	in, st, err := q.vols.open(name, unix.O_RDONLY)
	if errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("volume %s: image %s/%s is missing: %w", id, q.vols.path, name, ErrCorrupt)
	}
	if err != nil {
		return "", err
	}
	defer in.Close()
	var rnd [8]byte
	rand.Read(rnd[:])
	tmp := tempPrefix(name) + hex.EncodeToString(rnd[:])
	fd, err := unix.Openat(q.vols.fd(), tmp, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, st.Mode&0o777)
	if err != nil {
		return "", fmt.Errorf("volume %s: create the fence's copy in %s: %w", id, q.vols.path, err)
	}
	out := os.NewFile(uintptr(fd), q.vols.path+"/"+tmp)
	renamed := false
	defer func() {
		out.Close()
		if !renamed {
			q.vols.remove(tmp)
		}
	}()
	var before unix.Stat_t
	if err := unix.Fstat(int(in.Fd()), &before); err != nil {
		return "", fmt.Errorf("volume %s: stat %s/%s: %w", id, q.vols.path, name, err)
	}
	method, err := q.fenceCopy(ctx, out, in, before.Size, v.Thin, progress, allowCopy)
	if err != nil {
		return "", fmt.Errorf("volume %s: fence: %w", id, err)
	}
	if err := out.Sync(); err != nil {
		return "", fmt.Errorf("volume %s: fsync the fence's copy: %w", id, err)
	}
	if method == FenceCopy {
		if err := unchangedSince(in, &before); err != nil {
			return "", fmt.Errorf("volume %s: fence by copy of %s/%s: %w", id, q.vols.path, name, err)
		}
	}
	if err := unix.Renameat(q.vols.fd(), tmp, q.vols.fd(), name); err != nil {
		return "", fmt.Errorf("volume %s: rename the fence's copy over %s/%s: %w", id, q.vols.path, name, err)
	}
	renamed = true
	if err := q.vols.sync(); err != nil {
		return "", fmt.Errorf("volume %s: fenced, but not yet durably (the retry fences again): %w", id, err)
	}
	return method, nil
}

// unchangedSince returns an error wrapping ErrWrittenDuringFence if f's
// size, modification or change time differs from before's.
func unchangedSince(f *os.File, before *unix.Stat_t) error {
	var now unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &now); err != nil {
		return err
	}
	if now.Size != before.Size || now.Mtim != before.Mtim || now.Ctim != before.Ctim {
		return fmt.Errorf("changed at %s (was %s): %w", time.Unix(now.Ctim.Unix()).UTC().Format(time.RFC3339Nano),
			time.Unix(before.Ctim.Unix()).UTC().Format(time.RFC3339Nano), ErrWrittenDuringFence)
	}
	return nil
}

// fenceCopy fills out with in's size bytes: a reflink, or a copy of the
// data ranges (all of the image allocated unless thin) after a space check
// under the pool lock; without allowCopy, ErrNeedsCopy instead of a copy.
func (p *Pool) fenceCopy(ctx context.Context, out, in *os.File, size int64, thin bool, progress Progress, allowCopy bool) (string, error) {
	cloned, err := reflink(out, in)
	if err != nil {
		return "", err
	}
	if cloned {
		return FenceReflink, nil
	}
	if !allowCopy {
		return "", fmt.Errorf("pool %s: %w", p.Name, ErrNeedsCopy)
	}
	unlock, err := p.lockCapacity(ctx)
	if err != nil {
		return "", err
	}
	need := size
	if thin {
		if need, err = allocatedData(in, size); err != nil {
			unlock()
			return "", err
		}
	}
	avail, err := p.Available()
	if err == nil && need > avail {
		err = fmt.Errorf("pool %s has no reflink, and a copy of the image needs %d bytes where %d are available: %w", p.Name, need, avail, ErrNoSpace)
	}
	if err == nil && !thin {
		err = growFile(out, size)
	} else if err == nil {
		if err = out.Truncate(size); err == nil {
			err = reserveData(out, in, size)
		}
	}
	unlock()
	if err != nil {
		return "", err
	}
	return FenceCopy, copyData(out, in, size, progress)
}

// BreakStaged removes node's staged record of volume id (p its home) when
// the incarnation that wrote it started at or before through: the node
// plugin the fence covered. A record of a later incarnation (the node came
// back, was attached again and staged anew) is left, and broken is false;
// so is a missing one. A record that cannot be read is left too, with its
// error (ErrCorrupt): it cannot be told which incarnation wrote it. The
// caller holds Lock(id) in p and has fenced the image (FenceImage).
func (p *Pool) BreakStaged(id VolumeID, node string, through time.Time) (broken bool, err error) {
	rec, err := p.ReadStaged(id, node)
	if errors.Is(err, ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if rec.NodeStart.After(through) {
		return false, nil
	}
	if err := p.RemoveStaged(id, node); err != nil {
		return false, err
	}
	return true, nil
}
