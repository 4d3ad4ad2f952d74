package node

import (
	"context"

	"k8s.io/klog/v2"

	"github.com/loopvol/loopvol/pkg/pool"
)

// tune gives the volume's loop device its queue settings (pkg/loop Tune:
// the I/O scheduler, writeback throttling, and no discards unless the
// volume is thin), on every stage: a device attached by an older node
// plugin, or found again after a restart, is tuned as well, and one
// already tuned is left as it is. A thin volume that
// ControllerModifyVolume makes thick while it is staged refuses discards
// from its next stage on; thick to thin needs the volume detached, so its
// next stage attaches a new device, which passes them.
//
// A failure is logged, not returned: the volume works untuned, only
// slower, and a node plugin whose /sys is read-only must still be able to
// stage.
func (n *node) tune(ctx context.Context, dev string, v *pool.Volume) {
	if err := n.Loop.Tune(dev, v.Thin); err != nil {
		klog.FromContext(ctx).Error(err, "Loop device left untuned", "device", dev)
		return
	}
	klog.FromContext(ctx).V(4).Info("Tuned loop device", "device", dev, "discards", v.Thin)
}
