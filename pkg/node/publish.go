package node

import (
	"context"
	"fmt"
	"slices"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"k8s.io/klog/v2"
)

// publish implements NodePublishVolume: a bind mount of the staging path
// (mount) or of the loop device node onto a file (block) at the target path.
func (n *node) publish(ctx context.Context, a publishArgs) error {
	logger := klog.FromContext(ctx)
	_, att, err := n.usableVolume(a.id, a.cap)
	if err != nil {
		return err
	}
	dev, found, err := n.findDevice(a.id)
	if err != nil {
		return err
	}
	if !found {
		return kindf(errNotStaged, "volume %s has no loop device on node %s (NodeStageVolume first)", a.id, n.NodeID)
	}
	readOnly := a.readOnly || att.ReadOnly || a.cap.readOnly()

	mp, mounted, err := n.mountAt(a.target)
	if err != nil {
		return err
	}
	if mounted {
		if !n.mountedFrom(mp, dev) {
			return kindf(errConflict, "target path %s is already mounted from %s, not from volume %s", a.target, mp.Device, a.id)
		}
		if slices.Contains(mp.Opts, "ro") != readOnly {
			return kindf(errConflict, "volume %s is already published at %s with read-only %t", a.id, a.target, !readOnly)
		}
		logger.V(4).Info("Volume was already published", "targetPath", a.target)
		return nil
	}

	if a.cap.mode == csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER {
		users, err := n.users(dev, a.staging)
		if err != nil {
			return err
		}
		if len(users) > 0 {
			return kindf(errInUse, "volume %s is single-writer and already published at %v", a.id, users)
		}
	}

	// Mount options: bind, then (mount-utils does this as a remount) the
	// read-only flag and the requested mount flags.
	opts := []string{"bind"}
	if readOnly {
		opts = append(opts, "ro")
	}
	var source string
	if a.cap.block {
		if err := mkfile(a.target); err != nil {
			return err
		}
		source = dev
	} else {
		smp, staged, err := n.mountAt(a.staging)
		if err != nil {
			return err
		}
		if !staged || !n.mountedFrom(smp, dev) {
			return kindf(errNotStaged, "volume %s is not mounted on staging path %s (NodeStageVolume first)", a.id, a.staging)
		}
		if err := mkdir(a.target); err != nil {
			return err
		}
		source = a.staging
		opts = append(opts, a.cap.mountFlags...)
	}
	if n.fastBind != nil && len(a.cap.mountFlags) == 0 {
		err = n.fastBind(source, a.target, readOnly)
	} else {
		err = n.Mounter.Mount(source, a.target, "", opts)
	}
	if err != nil {
		return fmt.Errorf("volume %s: bind mount %s on %s: %w", a.id, source, a.target, err)
	}
	logger.V(2).Info("Published volume", "targetPath", a.target, "device", dev, "readOnly", readOnly)
	return nil
}

// unpublish implements NodeUnpublishVolume. It needs no volume record. A
// target mounted from something other than this volume is left alone.
func (n *node) unpublish(ctx context.Context, a unpublishArgs) error {
	logger := klog.FromContext(ctx)
	mp, mounted, err := n.mountAt(a.target)
	if err != nil {
		return err
	}
	if mounted {
		dev, found, err := n.findDevice(a.id)
		if err != nil {
			return err
		}
		if !found || !n.mountedFrom(mp, dev) {
			return kindf(errInUse, "target path %s is mounted from %s, not from volume %s: not unmounting it", a.target, mp.Device, a.id)
		}
	}
	if err := n.cleanup(a.target); err != nil {
		return fmt.Errorf("volume %s: %w", a.id, err)
	}
	if mounted {
		logger.V(2).Info("Unpublished volume", "targetPath", a.target)
	}
	return nil
}
