package node

import (
	"context"
	"errors"
	"fmt"

	"k8s.io/klog/v2"

	"github.com/loopvol/loopvol/pkg/pool"
	"github.com/loopvol/loopvol/pkg/volspec"
)

// The returning node (issue 26). While this node did not answer, the
// controller fenced it off a volume: it renamed a copy of the image over the
// image (pool.FenceImage) and removed this node's staged record
// (pool.BreakStaged). The node's loop device still serves the old inode, which
// no name reaches: what the node wrote there since the fence was never part of
// the volume, and is lost when the device goes. pkg/loop Find no longer sees
// that device (it is not the image's), FindReplaced does: a fenced device.
//
// What the node does with one:
//
//   - NodeUnstageVolume unmounts the staging path from it and detaches it,
//     once no Pod's bind mount uses it, as for the volume's own device, and
//     forgets the staged record. Nothing of the image is touched.
//   - NodeStageVolume, for a volume attached here again while a fenced device
//     of it is left (staged before the fence, never unstaged), first cleans
//     the fenced device up the same way; while it is in use the stage is
//     refused (FAILED_PRECONDITION), since the staging path cannot hold the
//     volume and the old device at once.
//   - A filesystem still mounted from it is shut down (fencedshutdown.go):
//     its Pods get I/O errors instead of writes that are lost, and can be
//     torn down.
//   - NodeGetVolumeStats and NodeGetVolumeHealth say the volume was fenced.
//   - A fenced device never counts as the node's device of the volume: it
//     neither keeps a staged record (hasDevice) nor gets one at start
//     (reconcileStaged), since it no longer writes the image, and a move of
//     the volume loses nothing of it.

// fencedDevices returns this node's fenced loop devices of volume id: its
// devices of a file that was the image where the volume lives and was
// replaced there (pkg/loop FindReplaced), never a device of the image.
func (n *node) fencedDevices(id pool.VolumeID) ([]string, error) {
	devs, err := n.Loop.FindReplaced(n.residence(id).ImagePath(id))
	if err != nil {
		return nil, fmt.Errorf("find fenced loop devices of volume %s: %w", id, err)
	}
	return devs, nil
}

// fencedMount returns the device of devs (fencedDevices) that mount e is
// of.
func (n *node) fencedMount(e mountEntry, devs []string) (string, bool) {
	for _, dev := range devs {
		if n.mountedFrom(e, dev) {
			return dev, true
		}
	}
	return "", false
}

// fencedMessage says what a fence means for this node; the messages of
// errors and health entries about fenced devices start with it.
func fencedMessage(id pool.VolumeID, dev string) string {
	return fmt.Sprintf("volume %s was fenced (its image was replaced because this node stopped answering): what is written here on loop device %s no longer reaches the volume", id, dev)
}

// unmountFenced unmounts fenced device dev from the resolved staging path,
// unless a bind mount (a Pod's publish) still uses it: unmounting under it
// would leave the filesystem mounted with nothing to unstage it.
func (n *node) unmountFenced(ctx context.Context, id pool.VolumeID, staging *resolved, dev string) error {
	users, err := n.users(dev, staging.path)
	if err != nil {
		return err
	}
	if len(users) > 0 {
		return volspec.Errorf(errInUse, "%s, and it is still published at %v: stop the Pods that use it, then unstage it", fencedMessage(id, dev), users)
	}
	// Self-fenced before the fence, it may be frozen still (selffence.go),
	// unless its shutdown thawed it (fencedshutdown.go).
	if mp, ok, err := n.mountAt(staging); err != nil {
		return err
	} else if ok && mp.path == staging.path {
		if err := n.thawBeforeUnmount(ctx, id, staging, mp); err != nil {
			return err
		}
	}
	if _, err := n.unmountAll(staging, dev); err != nil {
		return fmt.Errorf("volume %s: unmount its fenced device: %w", id, err)
	}
	klog.FromContext(ctx).V(2).Info("Unmounted the staging path of a fenced volume", "stagingTargetPath", staging.path, "device", dev)
	return nil
}

// detachFenced detaches the fenced devices devs of volume id, each once
// nothing uses it any more; stagingPath only names the staging path in the
// log. What they hold since the fence goes with them: it was never the
// volume's.
func (n *node) detachFenced(ctx context.Context, id pool.VolumeID, devs []string, stagingPath string) error {
	for _, dev := range devs {
		users, err := n.users(dev)
		if err != nil {
			return err
		}
		if len(users) > 0 {
			return volspec.Errorf(errInUse, "%s, and it is still in use at %v: unmount it there, then unstage the volume", fencedMessage(id, dev), users)
		}
		if err := n.Loop.Detach(dev); err != nil {
			return fmt.Errorf("volume %s: detach its fenced device: %w", id, err)
		}
		n.shut.forget(dev)
		klog.FromContext(ctx).Info("Cleaned up a fenced volume; what this node wrote to it since the fence was never part of the volume",
			"volumeID", id.String(), "device", dev, "stagingTargetPath", stagingPath)
	}
	return nil
}

// checkFencedMount checks, before a stage changes anything, that mount mp at
// the resolved staging path is of a fenced device of volume id, which the
// stage cleans up (cleanUpFencedBeforeStage); anything else mounted there is
// a conflict (errConflict).
func (n *node) checkFencedMount(id pool.VolumeID, staging *resolved, mp mountEntry) error {
	devs, err := n.fencedDevices(id)
	if err != nil {
		return err
	}
	if _, ok := n.fencedMount(mp, devs); !ok || mp.path != staging.path {
		return volspec.Errorf(errConflict, "staging path %s is already mounted from %s, not from volume %s", staging.path, mp.source, id)
	}
	return nil
}

// cleanUpFencedBeforeStage removes what a fenced volume left on this node
// before it is staged again (see above): its mount at the staging path (mp,
// when mounted is true, is the mount there, which checkFencedMount passed)
// and its fenced devices. It fails with errInUse while any of them is in
// use.
func (n *node) cleanUpFencedBeforeStage(ctx context.Context, id pool.VolumeID, staging *resolved, mp mountEntry, mounted bool) error {
	devs, err := n.fencedDevices(id)
	if err != nil {
		return err
	}
	if mounted {
		dev, ok := n.fencedMount(mp, devs)
		if !ok || mp.path != staging.path {
			return volspec.Errorf(errConflict, "staging path %s is already mounted from %s, not from volume %s", staging.path, mp.source, id)
		}
		if err := n.unmountFenced(ctx, id, staging, dev); err != nil {
			return err
		}
	}
	path := ""
	if staging != nil {
		path = staging.path
	}
	return n.detachFenced(ctx, id, devs, path)
}

// errFencedHere is the NodeGetVolumeStats error of a path that a fenced
// device of the volume is mounted on: no volume is there any more.
func errFencedHere(id pool.VolumeID, dev, path string) error {
	return volspec.Errorf(errPathMissing, "%s: volume %s is not at %s any more; NodeUnstageVolume cleans it up", fencedMessage(id, dev), id, path)
}

// fencedRecordGone reports whether this node's staged record of volume id is
// gone: with a fenced device left, the controller's fence broke it, which
// tells a fence from an image replaced by someone else.
func (n *node) fencedRecordGone(id pool.VolumeID) bool {
	_, err := n.pools[id.Pool].ReadStaged(id, n.NodeID)
	return errors.Is(err, pool.ErrNotFound)
}
