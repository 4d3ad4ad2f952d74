package node

import (
	"context"

	"k8s.io/klog/v2"
)

// tune gives the volume's loop device its queue settings (pkg/loop Tune:
// the I/O scheduler and writeback throttling), on every stage: a device
// attached by an older node plugin, or found again after a restart, is
// tuned as well, and one already tuned is left as it is.
//
// A failure is logged, not returned: the volume works untuned, only
// slower, and a node plugin whose /sys is read-only must still be able to
// stage.
func (n *node) tune(ctx context.Context, dev string) {
	if err := n.Loop.Tune(dev); err != nil {
		klog.FromContext(ctx).Error(err, "Loop device left untuned", "device", dev)
		return
	}
	klog.FromContext(ctx).V(4).Info("Tuned loop device", "device", dev)
}
