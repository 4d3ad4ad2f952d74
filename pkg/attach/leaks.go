package attach

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/klog/v2"

	"github.com/loopvol/loopvol/pkg/csiclient"
)

// anyNode in a wanted set stands for a VolumeAttachment whose node ID is
// not known: it may want its volume on every node.
const anyNode = "*"

// publication is one volume published to one node.
type publication struct{ volumeID, nodeID string }

// leakTracker remembers since when each publication that no
// VolumeAttachment wants has been seen. An entry lives only from one
// reconcile pass to the next that still sees it.
type leakTracker struct {
	mu    sync.Mutex
	since map[publication]time.Time
}

func newLeakTracker() *leakTracker { return &leakTracker{since: map[publication]time.Time{}} }

// observe replaces the tracked set with seen (first seen now, unless
// tracked before) and returns those seen for at least grace.
func (l *leakTracker) observe(seen []publication, now time.Time, grace time.Duration) []publication {
	l.mu.Lock()
	defer l.mu.Unlock()
	next := make(map[publication]time.Time, len(seen))
	var due []publication
	for _, p := range seen {
		first, ok := l.since[p]
		if !ok {
			first = now
		}
		next[p] = first
		if now.Sub(first) >= grace {
			due = append(due, p)
		}
	}
	l.since = next
	return due
}

func (l *leakTracker) forget(p publication) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.since, p)
}

func (l *leakTracker) size() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.since)
}

// wantedSet is, for each volume ID, the node IDs VolumeAttachments want it
// on (anyNode: a node not known).
type wantedSet map[string]map[string]bool

func (w wantedSet) wants(p publication) bool {
	nodes := w[p.volumeID]
	return nodes[p.nodeID] || nodes[anyNode]
}

// wanted works out which publications the VolumeAttachments vas of the
// driver (of every node, live or being deleted: a detach in progress
// unpublishes by itself) may want. ok is false when one of them names a
// volume the controller cannot map to a volume ID (its PersistentVolume is
// not known): then it may want any volume, and nothing is judged leaked.
func (c *Controller) wanted(ctx context.Context, vas []*storagev1.VolumeAttachment) (w wantedSet, ok bool) {
	w = wantedSet{}
	for _, va := range vas {
		if va.Spec.Attacher != c.cfg.DriverName {
			continue
		}
		spec, _, err := c.volumeSpec(ctx, va, forReconcile)
		if err != nil || spec.CSI == nil || spec.CSI.VolumeHandle == "" {
			klog.FromContext(ctx).V(4).Info("A VolumeAttachment names no volume known here; no published volume is judged leaked in this pass",
				"volumeAttachment", klog.KObj(va), "err", err)
			return nil, false
		}
		node := anyNode
		if id, err := c.nodeID(ctx, va, forReconcile); err == nil {
			node = id
		}
		h := spec.CSI.VolumeHandle
		if w[h] == nil {
			w[h] = map[string]bool{}
		}
		w[h][node] = true
	}
	return w, true
}

// leakGrace is how long a publication must stay unwanted before the
// reconcile unpublishes it.
func (c *Controller) leakGrace() time.Duration {
	if c.cfg.LeakGrace > 0 {
		return c.cfg.LeakGrace
	}
	return 2 * c.cfg.ReconcileSync
}

// repairLeaks unpublishes volumes that the driver lists as published to a
// node while no VolumeAttachment wants them there. Such a publication is
// left by a replica that acted after it lost its Lease, or by a publish
// whose VolumeAttachment was deleted and detached before the call ended.
// The rule is conservative, since unpublishing a volume in use breaks its
// pod:
//
//   - it never touches a volume that any VolumeAttachment of the driver
//     names on that node (or whose node ID is unknown), whatever its state;
//   - nothing is judged at all while some VolumeAttachment names a volume
//     whose PersistentVolume is not known;
//   - the publication must be seen unwanted by passes at least the grace
//     period apart (twice --reconcile-sync), so a VolumeAttachment being
//     created meanwhile has reached the cache;
//   - right before unpublishing, the VolumeAttachments are listed from the
//     API server, not the cache, and the rule applied again.
func (c *Controller) repairLeaks(ctx context.Context, published map[string][]string, vas []*storagev1.VolumeAttachment) {
	logger := klog.FromContext(ctx)
	w, ok := c.wanted(ctx, vas)
	if !ok {
		c.leaks.observe(nil, c.clock.Now(), 0)
		return
	}
	var unwanted []publication
	for vol, nodes := range published {
		for _, n := range nodes {
			if p := (publication{volumeID: vol, nodeID: n}); !w.wants(p) {
				unwanted = append(unwanted, p)
			}
		}
	}
	due := c.leaks.observe(unwanted, c.clock.Now(), c.leakGrace())
	if len(unwanted) > 0 {
		logger.V(2).Info("Volumes published with no VolumeAttachment that wants them", "count", len(unwanted), "due", len(due), "grace", c.leakGrace())
	}
	if len(due) == 0 {
		return
	}
	// Confirm with the API server's view, not the cache's.
	list, err := c.client.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
	c.api.Observe(err)
	if err != nil {
		logger.Error(err, "Listing VolumeAttachments to confirm leaked publications failed; repair skipped")
		return
	}
	live := make([]*storagev1.VolumeAttachment, 0, len(list.Items))
	for i := range list.Items {
		live = append(live, &list.Items[i])
	}
	if w, ok = c.wanted(ctx, live); !ok {
		return
	}
	for _, p := range due {
		if w.wants(p) {
			c.leaks.forget(p)
			continue
		}
		if err := c.unpublishLeak(ctx, p); err != nil {
			logger.Error(err, "Unpublishing a volume no VolumeAttachment wants failed; trying again at the next pass", "volumeID", p.volumeID, "nodeID", p.nodeID)
			continue
		}
		c.leaks.forget(p)
		c.metrics.leaksRepaired.Inc()
		logger.Info("Unpublished a volume that the driver had published to a node while no VolumeAttachment wanted it",
			"volumeID", p.volumeID, "nodeID", p.nodeID, "grace", c.leakGrace())
	}
}

// unpublishLeak calls ControllerUnpublishVolume for p, with the publish
// secrets of the volume's PersistentVolume if the cache has one.
func (c *Controller) unpublishLeak(ctx context.Context, p publication) error {
	var secrets map[string]string
	pvs, err := c.pvLister.List(labels.Everything())
	if err != nil {
		return err
	}
	for _, pv := range pvs {
		if src := pv.Spec.CSI; src != nil && src.Driver == c.cfg.DriverName && src.VolumeHandle == p.volumeID {
			if secrets, err = c.publishSecrets(ctx, src.ControllerPublishSecretRef); err != nil {
				return err
			}
			break
		}
	}
	if err := c.stillLeading(ctx); err != nil {
		return err
	}
	err = c.csi.ControllerUnpublish(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: p.volumeID, NodeId: p.nodeID, Secrets: secrets})
	if code, ok := csiclient.Code(err); ok && code == codes.NotFound {
		return nil // the volume is gone, and its publication with it
	}
	if err != nil {
		return fmt.Errorf("unpublish volume %q from node %q: %w", p.volumeID, p.nodeID, err)
	}
	return nil
}
