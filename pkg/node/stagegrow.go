package node

import (
	"context"
	"fmt"

	"golang.org/x/sys/unix"

	"k8s.io/klog/v2"
	mount "k8s.io/mount-utils"

	"github.com/loopvol/loopvol/pkg/pool"
)

// growAfterStage grows the filesystem just mounted at staging into its
// device when the device is larger. That is the case for a volume restored
// from a snapshot or cloned from a volume with a larger size than its
// source: the controller grows the image, and nobody asks the node to
// expand (Kubernetes calls NodeExpandVolume only for a resize of the
// claim), so the first stage must. ext4 is usually grown before the mount
// already (grow.go); xfs can grow only while mounted, and so can an ext4
// that growExt4BeforeMount left alone.
//
// Only volumes made from a source are checked: mkfs fills a new device,
// and a volume expanded while unstaged gets its NodeExpandVolume from
// kubelet after the stage; the check costs a process or two per stage,
// which new volumes are spared. A read-only mount cannot be grown; it is
// grown at its first writable stage.
func (n *node) growAfterStage(ctx context.Context, v *pool.Volume, dev string, staging *resolved, readOnly bool) error {
	if readOnly || v.Source == "" {
		return nil
	}
	// xfs_growfs takes the mount point's path (it looks it up in the mount
	// table); the mount there was made on the resolved directory a moment
	// ago, under the volume's lock. resize2fs gets the device.
	r := mount.NewResizeFs(n.withContext(ctx).Exec)
	need, err := r.NeedResize(dev, staging.path)
	if err != nil {
		return fmt.Errorf("check the filesystem size of %s: %w", dev, err)
	}
	if !need {
		return nil
	}
	// mount-utils' NeedResize says yes to a filesystem that is as large as
	// it can be but smaller than its device (xfs rounds to its allocation
	// groups, ext4 to its block groups), so the grow may be a no-op: the
	// size before and after tells.
	before := fsBytes(staging.path)
	if _, err := r.Resize(dev, staging.path); err != nil {
		return fmt.Errorf("grow the filesystem of %s to its device: %w", dev, err)
	}
	if after := fsBytes(staging.path); after > before {
		klog.FromContext(ctx).V(2).Info("Grew the filesystem of a restored or cloned volume to its size", "device", dev,
			"stagingTargetPath", staging.path, "source", v.Source, "fromBytes", before, "toBytes", after)
	}
	return nil
}

// fsBytes returns the size of the filesystem mounted at path, 0 if unknown.
func fsBytes(path string) int64 {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return 0
	}
	return int64(st.Blocks) * st.Bsize
}
