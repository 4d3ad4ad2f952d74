package node

import (
	"context"
	"errors"
	"fmt"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/loopvol/loopvol/pkg/pool"
	"github.com/loopvol/loopvol/pkg/volspec"
)

// publish implements NodePublishVolume: a bind mount of the staging path
// (mount) or of the loop device node onto a file (block) at the target path.
// Both paths are resolved once, and the bind goes from the one descriptor to
// the other.
func (n *node) publish(ctx context.Context, a publishArgs) error {
	logger := klog.FromContext(ctx)
	v, att, err := n.usableVolume(a.id, a.cap)
	if err != nil {
		return err
	}
	dev, found, err := n.findDevice(a.id)
	if err != nil {
		return err
	}
	if !found {
		return volspec.Errorf(errNotStaged, "volume %s has no loop device on node %s (NodeStageVolume first)", a.id, n.NodeID)
	}
	// Read-only is decided here, by the request and the attachment; a
	// mount flag can neither clear it nor set it (forMount refuses both).
	readOnly := a.readOnly || att.ReadOnly || a.cap.readOnly()
	if err := a.cap.mountOpts.forMount(v.FsType, readOnly); err != nil {
		return err
	}

	target, err := n.resolve(a.target, true)
	if err != nil {
		return err
	}
	defer target.close()
	mp, mounted, err := n.mountAt(target)
	if err != nil {
		return err
	}
	if mounted {
		if mp.path != target.path || !n.mountedFrom(mp, dev) {
			return volspec.Errorf(errConflict, "target path %s is already mounted from %s, not from volume %s", target.path, mp.source, a.id)
		}
		if mp.readOnly() != readOnly {
			return volspec.Errorf(errConflict, "volume %s is already published at %s with read-only %t", a.id, target.path, !readOnly)
		}
		logger.V(4).Info("Volume was already published", "targetPath", target.path)
		return nil
	}

	src := bindSource{dev: dev}
	if !a.cap.block {
		staging, err := n.resolve(a.staging, false)
		if errors.Is(err, errPathMissing) || errors.Is(err, errNotOwn) {
			return volspec.Errorf(errNotStaged, "volume %s is not mounted on staging path %s (NodeStageVolume first): %w", a.id, a.staging, err)
		}
		if err != nil {
			return err
		}
		defer staging.close()
		smp, staged, err := n.mountAt(staging)
		if err != nil {
			return err
		}
		if !staged || smp.path != staging.path || !n.mountedFrom(smp, dev) {
			return volspec.Errorf(errNotStaged, "volume %s is not mounted on staging path %s (NodeStageVolume first)", a.id, staging.path)
		}
		src.staging = staging
	}

	if a.cap.mode == csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER {
		users, err := n.users(dev, n.canonical(a.staging))
		if err != nil {
			return err
		}
		if len(users) > 0 {
			return volspec.Errorf(errInUse, "volume %s is single-writer and already published at %v", a.id, users)
		}
	}

	var created bool
	if a.cap.block {
		created, err = mkfileTarget(target)
	} else {
		created, err = mkdirTarget(target)
	}
	if err != nil {
		return err
	}
	err = n.mounts.bind(src, target, a.cap.mountOpts, readOnly)
	if err == nil {
		err = n.checkMounted(target, dev)
	}
	if err != nil {
		// Only what this call made goes again.
		if created {
			_ = remove(target, a.cap.block)
		}
		return fmt.Errorf("volume %s: publish at %s: %w", a.id, target.path, err)
	}
	logger.V(2).Info("Published volume", "targetPath", target.path, "device", dev, "readOnly", readOnly)
	return nil
}

// unpublish implements NodeUnpublishVolume. It needs no volume record, and
// acts only on what is the volume's own: it unmounts a mount at the target
// that is of this volume's device (the staging mount's filesystem or, for
// block, the device node), and then removes the target, an empty directory
// or the file the mount was on. A target that is gone is success; one that
// leads through a symbolic link, or is a plain file or directory with no
// mount, holds nothing of this volume and is left as it is (success: the
// volume is not published there). A mount of something else at the target
// is FAILED_PRECONDITION. A volume of which nothing is known here (no record,
// no device) is NOT_FOUND.
func (n *node) unpublish(ctx context.Context, a unpublishArgs) error {
	logger := klog.FromContext(ctx)
	dev, found, err := n.findDevice(a.id)
	if err != nil {
		return err
	}
	if !found {
		if _, _, err := n.volume(a.id); errors.Is(err, pool.ErrNotFound) {
			return err
		}
	}
	target, err := n.resolve(a.target, false)
	switch {
	case errors.Is(err, errPathMissing):
		return nil
	case errors.Is(err, errNotOwn):
		logger.Info("Left the target path alone: it leads through a symbolic link or a non-directory", "targetPath", a.target, "err", err.Error())
		return nil
	case err != nil:
		return err
	}
	defer target.close()
	mp, mounted, err := n.mountAt(target)
	if err != nil {
		return err
	}
	if !mounted {
		switch {
		case !target.exists():
			return nil
		case target.isDir():
			// An empty directory: ours from a publish whose mount is gone
			// (or kubelet's); rmdir takes nothing else.
			if err := remove(target, false); err != nil && !errors.Is(err, unix.ENOTEMPTY) && !errors.Is(err, unix.EEXIST) {
				return fmt.Errorf("volume %s: %w", a.id, err)
			}
			return nil
		default:
			logger.Info("Left the target path alone: it is not mounted and not a directory", "targetPath", target.path, "type", fileType(target.mode))
			return nil
		}
	}
	fencedHere := false
	if !found && mp.path == target.path {
		// Published before a fence (fenced.go): the Pod's mount of the
		// fenced device goes as the volume's would, so that the unstage
		// can clean up the rest.
		fenced, err := n.fencedDevices(a.id)
		if err != nil {
			return err
		}
		dev, found = n.fencedMount(mp, fenced)
		fencedHere = found
	}
	if !found || mp.path != target.path || !n.mountedFrom(mp, dev) {
		return volspec.Errorf(errInUse, "target path %s is mounted from %s, not from volume %s: not unmounting it", target.path, mp.source, a.id)
	}
	file := target.isFile() || target.mode == unix.S_IFBLK
	if _, err := n.unmountAll(target, dev); err != nil {
		return fmt.Errorf("volume %s: %w", a.id, err)
	}
	// What the mount was on: the directory, or the file of a raw-block
	// publish (a regular file once the device node's bind is gone).
	if file && !target.isFile() {
		logger.Info("Left the target path alone after unmounting: it is no regular file", "targetPath", target.path, "type", fileType(target.mode))
	} else if err := remove(target, file); err != nil && !errors.Is(err, unix.ENOTEMPTY) && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("volume %s: %w", a.id, err)
	}
	if fencedHere {
		logger.Info("Unpublished a fenced volume; what was written there since the fence was never part of the volume", "targetPath", target.path, "device", dev)
		return nil
	}
	logger.V(2).Info("Unpublished volume", "targetPath", target.path)
	return nil
}
