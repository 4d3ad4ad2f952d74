package node

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"k8s.io/klog/v2"

	"github.com/loopvol/loopvol/pkg/pool"
)

// The node's staged records (pool/staged.go has the design and the crash
// orders): NodeStageVolume writes this node's record of the volume, in the
// volume's home pool, before it attaches the image, and NodeUnstageVolume
// removes it once the node has no loop device of the image left. The
// controller refuses to move a volume (or to free its blocks) while any node
// has a record of it: a ControllerUnpublishVolume forced by the CO leaves the
// node writing, and only the node knows when it stopped.

// recordStaged makes sure this node's staged record of volume id is in the
// volume's home pool, durably, before anything of the volume is attached
// here. wrote says it was written now (there was none): a stage that then
// fails before it attached anything takes it back (dropStaged).
func (n *node) recordStaged(id pool.VolumeID, readOnly bool) (wrote bool, err error) {
	home := n.pools[id.Pool]
	rec, err := home.ReadStaged(id, n.NodeID)
	switch {
	case err == nil && rec.ReadOnly == readOnly:
		return false, nil
	case err != nil && !errors.Is(err, pool.ErrNotFound) && !errors.Is(err, pool.ErrCorrupt):
		return false, fmt.Errorf("volume %s: %w", id, err)
	}
	// Missing, unreadable (replaced atomically by a good one) or of the
	// other mode.
	err = home.WriteStaged(pool.Staged{VolumeID: id.String(), Node: n.NodeID, NodeStart: n.started,
		Staged: time.Now().UTC().Truncate(time.Second), ReadOnly: readOnly})
	if err != nil {
		return false, fmt.Errorf("volume %s: it is not staged: %w", id, err)
	}
	return rec == nil, nil
}

// stageFenced writes the staged record, then reads the volume's record again
// and checks that it is still attached to this node. The second read is what
// makes the record a fence against a move (pool/staged.go): a move lists the
// records only after it found the volume detached, so a record it did not
// see was written after that, and this read then finds the volume detached
// and refuses.
func (n *node) stageFenced(ctx context.Context, id pool.VolumeID, readOnly bool) (wrote bool, err error) {
	if wrote, err = n.recordStaged(id, readOnly); err != nil {
		return false, err
	}
	if _, _, _, err := n.attachedVolume(id); err != nil {
		if wrote {
			n.dropStaged(ctx, id)
		}
		return false, err
	}
	return wrote, nil
}

// dropStaged removes the record a failed stage wrote, if it attached nothing;
// a failure to remove it only keeps refusing moves until NodeUnstageVolume or
// a restart removes it.
func (n *node) dropStaged(ctx context.Context, id pool.VolumeID) {
	if err := n.forgetStaged(ctx, id); err != nil {
		klog.FromContext(ctx).Error(err, "Could not remove the staged record of a stage that failed; NodeUnstageVolume or the plugin's restart removes it", "volumeID", id.String())
	}
}

// forgetStaged removes this node's staged record of volume id once the node
// has no loop device of its image in any pool; with one left, the record
// stays (the device may still be written), and that is no error.
func (n *node) forgetStaged(ctx context.Context, id pool.VolumeID) error {
	has, err := n.hasDevice(id)
	if err != nil {
		return err
	}
	if has {
		// Attached at another path of the image (before a move that an
		// older controller made under it): still written, so the record
		// stays; the unstage itself is done.
		klog.FromContext(ctx).Info("Kept the staged record: this node still has a loop device of the volume's image in another pool", "volumeID", id.String())
		return nil
	}
	if err := n.pools[id.Pool].RemoveStaged(id, n.NodeID); err != nil {
		return fmt.Errorf("volume %s: remove the record that it is staged here: %w", id, err)
	}
	klog.FromContext(ctx).V(4).Info("Removed staged record", "volumeID", id.String())
	return nil
}

// hasDevice reports whether this node has a loop device of volume id's image
// in any pool it serves: where it lives, and where it lived before a move
// (a device attached then keeps the old path). A fenced device (fenced.go)
// does not count: it no longer writes the image, so a move loses nothing of
// it, and the record it kept would refuse moves for a node the controller
// fenced on purpose (pkg/loop Find passes over it).
func (n *node) hasDevice(id pool.VolumeID) (bool, error) {
	for _, p := range n.pools {
		_, ok, err := n.Loop.Find(p.ImagePath(id))
		if err != nil {
			return false, fmt.Errorf("find loop device of volume %s: %w", id, err)
		}
		if ok {
			return true, nil
		}
	}
	return false, nil
}

// reconcileStaged brings this node's staged records in line with its loop
// devices when the plugin starts, before it serves: no RPC runs, so none is
// half-way. A record without a device (a stage that died before its attach,
// an unstage after its detach) is removed; a device without a record (staged
// by a plugin older than the records) gets one, unless it is a fenced device
// (fenced.go): the fence broke its record on purpose, and NodeUnstageVolume
// cleans it up. What cannot be told is left as it is: a record stays, which
// keeps refusing moves.
func (n *node) reconcileStaged(ctx context.Context) {
	logger := klog.FromContext(ctx)
	names := make([]string, 0, len(n.pools))
	for name := range n.pools {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		p := n.pools[name]
		ids, err := p.ListStaged(n.NodeID)
		if err != nil {
			logger.Error(err, "Could not list this node's staged records; they stay", "pool", p.Name)
			continue
		}
		for _, id := range ids {
			has, err := n.hasDevice(id)
			if err != nil || has {
				continue
			}
			if err := p.RemoveStaged(id, n.NodeID); err != nil {
				logger.Error(err, "Could not remove a staged record of a volume this node no longer has", "volumeID", id.String())
				continue
			}
			logger.Info("Removed the staged record of a volume this node no longer has attached", "volumeID", id.String())
		}
	}
	devs, err := n.Loop.List()
	if err != nil {
		logger.Error(err, "Could not list this node's loop devices; volumes staged by an older plugin get no staged record")
		return
	}
	replaced := map[string][]string{} // image → this node's fenced devices of it
	for _, dev := range devs {
		st, err := n.Loop.Status(dev)
		if err != nil {
			continue
		}
		for _, name := range names {
			hash, ok := n.pools[name].ImageHash(st.BackingFile)
			if !ok {
				continue
			}
			id, ok := n.pools[name].VolumeOfImage(hash)
			if !ok || n.pools[id.Pool] == nil {
				break
			}
			// Deleted, or (NFS marks nothing) another file by device and
			// inode: a fenced device when a file is at the path again.
			fenced, ok := replaced[st.BackingFile]
			if !ok {
				if fenced, err = n.Loop.FindReplaced(st.BackingFile); err != nil {
					logger.Error(err, "Could not tell whether a loop device is fenced; it gets no staged record", "volumeID", id.String(), "device", dev)
					break
				}
				replaced[st.BackingFile] = fenced
			}
			if slices.Contains(fenced, dev) {
				logger.Info("Found a fenced volume; NodeUnstageVolume cleans it up", "volumeID", id.String(), "device", dev)
				break
			}
			if st.Deleted {
				break
			}
			if _, err := n.pools[id.Pool].ReadStaged(id, n.NodeID); errors.Is(err, pool.ErrNotFound) {
				if _, err := n.recordStaged(id, st.ReadOnly); err != nil {
					logger.Error(err, "Could not record a volume staged here", "volumeID", id.String(), "device", dev)
				} else {
					logger.Info("Recorded a volume staged here without a staged record", "volumeID", id.String(), "device", dev)
				}
			}
			break
		}
	}
}

// Start reconciles this node's staged records with its loop devices (see
// reconcileStaged), and starts the check that shuts down the filesystems of
// fenced volumes every fencedCheckInterval (fencedshutdown.go) until ctx
// ends. The caller runs it once, before it serves.
func (s *Server) Start(ctx context.Context) {
	s.node.reconcileStaged(ctx)
	go s.watchFenced(ctx)
}
