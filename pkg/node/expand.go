package node

import (
	"context"
	"fmt"

	"k8s.io/klog/v2"
	mount "k8s.io/mount-utils"

	"github.com/loopvol/loopvol/pkg/pool"
	"github.com/loopvol/loopvol/pkg/volspec"
)

// expand implements NodeExpandVolume. The controller has grown the image
// already; the loop device learns the new size and the filesystem grows
// into it while mounted (resize2fs and xfs_growfs both work online).
func (n *node) expand(ctx context.Context, a expandArgs) (int64, error) {
	logger := klog.FromContext(ctx)
	_, v, _, err := n.attachedVolume(a.id)
	if err != nil {
		return 0, err
	}
	if a.cap != nil {
		if err := checkAccessType(v, *a.cap); err != nil {
			return 0, err
		}
	}
	dev, found, err := n.findDevice(a.id)
	if err != nil {
		return 0, err
	}
	if !found {
		return 0, volspec.Errorf(errNotStaged, "volume %s has no loop device on node %s", a.id, n.NodeID)
	}
	if err := n.Loop.Resize(dev); err != nil {
		return 0, fmt.Errorf("volume %s: %w", a.id, err)
	}
	size, err := n.Loop.Size(dev)
	if err != nil {
		return 0, fmt.Errorf("volume %s: %w", a.id, err)
	}
	if a.required > size {
		return 0, volspec.Errorf(volspec.ErrOutOfRange, "volume %s: image is %d bytes, less than the %d asked for (ControllerExpandVolume first)", a.id, size, a.required)
	}
	if v.AccessType == pool.AccessBlock {
		logger.V(2).Info("Expanded block volume", "device", dev, "sizeBytes", size)
		return size, nil
	}

	// xfs_growfs wants a mount point of the filesystem: the staging path if
	// given, else the published path. mount-utils' resize runs it with the
	// path string (xfs_growfs looks the path up in the mount table, a
	// descriptor's magic link would not be found there). That walk is a
	// second one, but xfs_growfs only grows the xfs filesystem mounted
	// there, to the size of its own device, which harms no one; resize2fs
	// gets the device.
	path := ""
	for _, p := range []string{a.staging, a.volumePath} {
		if p == "" {
			continue
		}
		mp, mounted, r, err := n.mountAtPath(p)
		if err != nil {
			return 0, err
		}
		if mounted {
			r.close()
			if n.mountedFrom(mp, dev) {
				path = r.path
				break
			}
		}
	}
	if path == "" {
		return 0, volspec.Errorf(errPathMissing, "volume %s is not mounted at %s", a.id, a.volumePath)
	}
	r := mount.NewResizeFs(n.withContext(ctx).Exec)
	need, err := r.NeedResize(dev, path)
	if err != nil {
		return 0, fmt.Errorf("volume %s: check filesystem size: %w", a.id, err)
	}
	if need {
		if _, err := r.Resize(dev, path); err != nil {
			return 0, fmt.Errorf("volume %s: %w", a.id, err)
		}
		logger.V(2).Info("Expanded filesystem", "device", dev, "path", path, "sizeBytes", size)
	}
	return size, nil
}
