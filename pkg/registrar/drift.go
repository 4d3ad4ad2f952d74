package registrar

import (
	"context"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/loopvol/loopvol/internal/kube"
)

// driftChecker compares, in ModeKubelet, the CSINode entry kubelet wrote
// with what NodeGetInfo reports now, and logs when they differ. It only
// reads (one GET of the node's CSINode per check): kubelet owns the entry,
// and a second writer would race it.
//
// Kubelet writes the entry before it confirms a registration, so a check
// runs after each confirmation, and then every interval (if set).
type driftChecker struct {
	driver   string
	node     string
	client   kube.Client
	csi      Driver
	clock    clock.WithTicker
	interval time.Duration
	kicked   chan struct{}
}

func newDriftChecker(cfg Config) *driftChecker {
	return &driftChecker{
		driver:   cfg.DriverName,
		node:     cfg.NodeName,
		client:   cfg.Client,
		csi:      cfg.Driver,
		clock:    cfg.Clock,
		interval: cfg.DriftCheckInterval,
		kicked:   make(chan struct{}, 1),
	}
}

// kick asks for a check soon.
func (d *driftChecker) kick() {
	select {
	case d.kicked <- struct{}{}:
	default:
	}
}

// run checks after each kick and every interval until ctx ends, or until
// the API refuses the read (no RBAC for it: then it says so once and
// stops).
func (d *driftChecker) run(ctx context.Context) {
	var tickC <-chan time.Time
	if d.interval > 0 {
		t := d.clock.NewTicker(d.interval)
		defer t.Stop()
		tickC = t.C()
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-d.kicked:
		case <-tickC:
		}
		if !d.check(ctx) {
			return
		}
	}
}

// check compares once; false means never again.
func (d *driftChecker) check(ctx context.Context) bool {
	logger := klog.FromContext(ctx)
	info, err := d.csi.NodeGetInfo(ctx)
	if err != nil {
		logger.V(2).Info("Could not read NodeGetInfo to check the CSINode entry", "err", err.Error())
		return true
	}
	want, _, err := desiredEntry(d.driver, info)
	if err != nil {
		logger.Info("Driver's NodeGetInfo cannot make a CSINode entry; kubelet refuses it too", "err", err.Error())
		return true
	}
	node, err := d.client.StorageV1().CSINodes().Get(ctx, d.node, metav1.GetOptions{})
	switch {
	case apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err):
		// Said without the API's message, which would look like an RBAC
		// failure of a controller that needs the permission.
		logger.Info("No permission to read CSINodes; the CSINode entry kubelet writes is not checked for drift", "csiNode", d.node)
		return false
	case apierrors.IsNotFound(err):
		logger.Info("Kubelet has written no CSINode for this node", "csiNode", d.node, "want", describeEntry(&want))
		return true
	case err != nil:
		logger.V(2).Info("Could not read the CSINode to check it for drift", "csiNode", d.node, "err", err.Error())
		return true
	}
	i := findEntry(node, d.driver)
	switch {
	case i < 0:
		logger.Info("The CSINode has no entry of the driver although kubelet registered it", "csiNode", klog.KObj(node), "want", describeEntry(&want))
	case !sameEntry(node.Spec.Drivers[i], want):
		logger.Info("The CSINode entry differs from what the driver reports; kubelet owns it and updates it only on its period or after a RESOURCE_EXHAUSTED attach",
			"csiNode", klog.KObj(node), "entry", describeEntry(&node.Spec.Drivers[i]), "driverReports", describeEntry(&want))
	default:
		logger.V(4).Info("The CSINode entry matches NodeGetInfo", "csiNode", klog.KObj(node))
	}
	return true
}
