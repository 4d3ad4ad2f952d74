package controller

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

	"github.com/loopvol/loopvol/pkg/pool"
	"github.com/loopvol/loopvol/pkg/volspec"
)

// Fencing on detach (issue 26; docs/fencing.md has the whole design).
//
// A ControllerUnpublishVolume that finds the node still has the volume
// staged is one the CO forced: kube-controller-manager after
// maxWaitForUnmountDuration, or at once for a node tainted
// node.kubernetes.io/out-of-service (by an operator, an automation of
// non-graceful node shutdown, or loopvol's own fencing). The node may still
// write: frozen, it resumes when thawed; cut off, it never stopped. So the
// detach fences the volume before it answers: the image is replaced by a
// reflink of itself (pool.FenceImageByReflink), which leaves the node's
// loop device on an inode no name reaches, and the node's staged record is
// broken, so the volume can be attached, staged and moved elsewhere at once.
// Whoever acts first, the second writer is kept out.
//
// Orders, against a stage that the node still runs (its record written,
// its second read of the attachment pending): the node opens the image
// before that second read (pkg/node), and the detach is durable before the
// fence lists the records. Either the node's read comes after the detach,
// and it refuses; or it came before, its image was opened before the
// detach, so before the fence's rename, and what it attaches is the old
// inode. A fence that fails after the detach leaves the node's record, and
// ControllerPublishVolume refuses another writer while it is there
// (checkFencePending), so nothing is attached elsewhere until the retried
// detach fences.
//
// What is not fenced:
//   - a volume of a local pool (served by one node): nowhere else can stage
//     it, and a dead node's local volumes are gone with it; its record stays;
//   - a volume that another node still has staged too (a multi-node
//     volume): replacing the image would take it from that node as well;
//   - a node that has it staged read-only: it writes nothing;
//   - a pool without reflink: the fence would be a full copy made while the
//     node may still write, which is no consistent image; the detach answers
//     FAILED_PRECONDITION until the node unstages or is fenced by copy once
//     it is known to have stopped (its heartbeat stale: the fencing
//     controller), and another writer is refused meanwhile.

// Fence metrics, registered by the driver with the others (Collectors).
var (
	fencedVolumes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "loopvol_fenced_volumes_total",
		Help: "Volumes fenced: their image replaced so that a node detached while it still had them staged no longer reaches them, by pool and method (reflink, copy).",
	}, []string{"pool", "method"})
	fenceSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "loopvol_fence_duration_seconds",
		Help:    "Time to fence one volume (replace its image and break the fenced node's staged record), by method.",
		Buckets: prometheus.ExponentialBuckets(0.001, 4, 10), // 1 ms … 4.4 min (a full copy)
	}, []string{"method"})
)

// Collectors returns the controller's own metrics (the fence's, and the
// abnormal volumes of healthmetrics.go), for the driver's registry.
func Collectors() []prometheus.Collector {
	return []prometheus.Collector{fencedVolumes, fenceSeconds, abnormalVolumes}
}

// writerEntry says whether a staged entry may write the image: a record
// staged read-only does not; a record that cannot be read may.
func writerEntry(e pool.StagedEntry) bool { return e.Record == nil || !e.Record.ReadOnly }

// fenceDetached fences volume id (home is its home pool, where its staged
// records are; where is the pool its image lives in) for the nodes that
// detached says were just detached from it, durably, if any of them still
// has it staged writable; see above for what is not fenced. The caller
// holds the volume's lock.
func (s *Server) fenceDetached(ctx context.Context, home, where *pool.Pool, id pool.VolumeID, detached func(node string) bool) error {
	logger := klog.FromContext(ctx)
	entries, err := home.StagedOn(id)
	if err != nil {
		return err
	}
	var fenced, others []pool.StagedEntry
	for _, e := range entries {
		switch {
		case e.Node == "":
			// not a node's record (StagedOn names it); it fences nothing
		case detached(e.Node) && writerEntry(e):
			fenced = append(fenced, e)
		case !detached(e.Node):
			others = append(others, e)
		}
	}
	if len(fenced) == 0 {
		return nil
	}
	nodes := nodesOfEntries(fenced)
	if len(others) > 0 {
		logger.Info("Not fencing a volume that other nodes have staged too: replacing its image would take it from them as well; the detached node's record stays",
			"detachedNodes", nodes, "stagedOn", nodesOfEntries(others))
		return nil
	}
	if shared, err := servedByMany(where); err != nil {
		return err
	} else if !shared {
		logger.Info("Detached a volume of a local pool that the node still has staged: local pools are never fenced (no other node can stage the volume); the node's record stays until it unstages",
			"nodes", nodes, "pool", where.Name)
		return nil
	}
	method, took, err := s.fence(ctx, home, where, id, fenced, time.Now(), false)
	if errors.Is(err, pool.ErrNeedsCopy) {
		return fmt.Errorf("volume %s was detached from node %s, which still has it staged and may still write it; pool %s has no reflink, so a fence would be a full copy, consistent only once the node has stopped writing: "+
			"it is fenced by copy once the node's heartbeat has been stale for the fencing period, or the detach completes once the node unstages it; no other node may write it meanwhile: %w",
			id, strings.Join(nodes, ", "), where.Name, err)
	}
	if err != nil {
		return err
	}
	logger.Info("Fenced volume: the detached node still had it staged, and nothing it writes from now on reaches the volume",
		"nodes", nodes, "pool", where.Name, "method", method, "duration", took)
	return nil
}

// fence replaces the image of volume id (home its home pool, where the pool
// it lives in) by a reflink of itself, or, if copyOK, by a full copy where
// the pool has no reflink (an error wrapping pool.ErrNeedsCopy otherwise),
// then breaks the staged records of entries: those of incarnations up to
// through, and those that cannot be read (of the same node: the caller
// picked them by name). The caller holds the volume's lock and has checked
// that no other node has the volume staged.
func (s *Server) fence(ctx context.Context, home, where *pool.Pool, id pool.VolumeID, entries []pool.StagedEntry, through time.Time, copyOK bool) (string, time.Duration, error) {
	logger := klog.FromContext(ctx)
	nodes := nodesOfEntries(entries)
	start := time.Now()
	method, err := home.FenceImageByReflink(ctx, id, s.peer)
	if errors.Is(err, pool.ErrNeedsCopy) && copyOK {
		last := int64(-1)
		method, err = home.FenceImage(ctx, id, s.peer, func(done, total int64) {
			if pct := done * 10 / max(total, 1); pct != last {
				last = pct
				logger.Info("Fencing volume by a full copy of its image", "volumeID", id.String(), "nodes", nodes, "doneBytes", done, "totalBytes", total)
			}
		})
	}
	if err != nil {
		return "", 0, fmt.Errorf("from node %s: %w", strings.Join(nodes, ", "), err)
	}
	for _, e := range entries {
		if e.Record == nil {
			err = home.RemoveStaged(id, e.Node)
		} else {
			_, err = home.BreakStaged(id, e.Node, through)
		}
		if err != nil {
			return "", 0, fmt.Errorf("volume %s: fenced from node %s, but its staged record stays (a retry breaks it): %w", id, e.Node, err)
		}
	}
	took := time.Since(start)
	fencedVolumes.WithLabelValues(where.Name, method).Inc()
	fenceSeconds.WithLabelValues(method).Observe(took.Seconds())
	return method, took, nil
}

// checkFencePending refuses a writable attach of volume v (home its home
// pool) to node while another node that is not attached still has it
// staged writable: a detach forced by the CO whose fence has not been done
// (a pool without reflink, a fence that failed). Multi-writer volumes are
// shared on purpose and are not checked.
func checkFencePending(home *pool.Pool, id pool.VolumeID, v *pool.Volume, node, mode string, readOnly bool) error {
	if readOnly || mode == csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER.String() {
		return nil
	}
	entries, err := home.StagedOn(id)
	if err != nil {
		return err
	}
	var pending []pool.StagedEntry
	for _, e := range entries {
		if e.Node == "" || e.Node == node || !writerEntry(e) {
			continue
		}
		if _, attached := v.AttachedTo(e.Node); !attached {
			pending = append(pending, e)
		}
	}
	if len(pending) == 0 {
		return nil
	}
	desc := make([]string, len(pending))
	for i, e := range pending {
		desc[i] = e.String()
	}
	return volspec.Errorf(volspec.ErrPrecondition, "volume %s was detached from node %s, which still has it staged and may still write it: it is attached to node %s once that node has unstaged it or has been fenced (docs/fencing.md)",
		id, strings.Join(desc, ", "), node)
}

// servedByMany says whether more than one node serves pool p: a shared
// pool, where another node could stage a volume and fencing matters.
func servedByMany(p *pool.Pool) (bool, error) {
	nodes, err := p.ListNodes()
	if err != nil {
		return false, err
	}
	return len(nodes) > 1, nil
}

func nodesOfEntries(entries []pool.StagedEntry) []string {
	nodes := make([]string, 0, len(entries))
	for _, e := range entries {
		nodes = append(nodes, e.Node)
	}
	return slices.Compact(nodes)
}
