package controller

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"k8s.io/klog/v2"

	"github.com/loopvol/loopvol/pkg/fenceapi"
	"github.com/loopvol/loopvol/pkg/pool"
)

// FenceNode fences a node that stopped renewing its heartbeat from every
// volume it has staged in a shared pool (fenceapi has the why; fence.go the
// rules, the same as a forced detach's, and the orders). Attachments are
// left as they are: the CO detaches, and that detach then finds nothing
// staged and answers at once. Each volume is fenced under its own lock, so
// two controllers fencing one node at once fence each volume once (the
// second finds the record broken, or the lock held and retries); a
// controller killed half-way left the image replaced or not (the rename is
// the fence) and the record broken or not, and the retry finishes either.
func (s *Server) FenceNode(ctx context.Context, req *fenceapi.FenceNodeRequest) (*fenceapi.FenceNodeResponse, error) {
	return answer(s.fenceNode(ctx, req))
}

func (s *Server) fenceNode(ctx context.Context, req *fenceapi.FenceNodeRequest) (*fenceapi.FenceNodeResponse, error) {
	if err := pool.ValidateNodeID(req.NodeID); err != nil {
		return nil, invalid("nodeID: %v", err)
	}
	logger := klog.FromContext(ctx).WithValues("node", req.NodeID)
	ctx = klog.NewContext(ctx, logger)
	through := req.Through
	if through.IsZero() {
		through = time.Now()
	}
	resp := &fenceapi.FenceNodeResponse{Volumes: []fenceapi.FencedVolume{}}
	for _, name := range s.poolNames {
		home := s.pools[name]
		ids, err := home.ListStaged(req.NodeID)
		if err != nil {
			// One broken pool must not keep the node's volumes in the
			// others reachable: go on, and have the caller retry.
			logger.Error(err, "Could not list the node's staged volumes in a pool; fencing it in the other pools", "pool", name)
			resp.PoolErrors = append(resp.PoolErrors, fmt.Sprintf("pool %s: %v", name, err))
			continue
		}
		for _, id := range ids {
			fv := s.fenceStaged(ctx, home, id, req.NodeID, through, req.AllowCopy)
			resp.Volumes = append(resp.Volumes, fv)
		}
	}
	return resp, nil
}

// fenceStaged fences node from volume id (home its home pool), which the
// node has a staged record of, and says what became of it.
func (s *Server) fenceStaged(ctx context.Context, home *pool.Pool, id pool.VolumeID, node string, through time.Time, allowCopy bool) fenceapi.FencedVolume {
	logger := klog.FromContext(ctx).WithValues("volumeID", id.String())
	fv := fenceapi.FencedVolume{VolumeID: id.String(), Pool: home.Name}
	failed := func(err error) fenceapi.FencedVolume {
		fv.Error = err.Error()
		logger.Error(err, "Could not fence the node from a volume; the fencing controller retries")
		return fv
	}
	unlock, err := home.Lock(id)
	if err != nil {
		return failed(err)
	}
	defer unlock()
	where, v, err := s.settle(home, id)
	if errors.Is(err, pool.ErrNotFound) || errors.Is(err, pool.ErrGuest) {
		// No volume, so no image to reach: the record is a leftover.
		if err := home.RemoveStaged(id, node); err != nil {
			return failed(err)
		}
		fv.Fenced = true
		return fv
	}
	if err != nil {
		return failed(err)
	}
	fv.Pool = where.Name
	entries, err := home.StagedOn(id)
	if err != nil {
		return failed(err)
	}
	var mine, others []pool.StagedEntry
	for _, e := range entries {
		switch e.Node {
		case "":
		case node:
			mine = append(mine, e)
		default:
			others = append(others, e)
		}
	}
	if len(mine) == 0 {
		fv.Fenced = true // unstaged, or fenced, since the listing
		return fv
	}
	skip := func(reason string) fenceapi.FencedVolume {
		fv.Reason = reason
		logger.Info("Not fencing the node from a volume it has staged", "reason", reason)
		return fv
	}
	e := mine[0]
	switch shared, err := servedByMany(where); {
	case err != nil:
		return failed(err)
	case !shared:
		return skip(fmt.Sprintf("pool %s is local (no other node serves it): local pools are never fenced, and the node's local volumes are unusable until it is back", where.Name))
	case e.Record != nil && e.Record.NodeStart.After(through):
		return skip("staged by a later incarnation of the node's plugin, which started after the one that stopped: the node is back")
	case !writerEntry(e):
		return skip("staged read-only: the node writes nothing to it")
	case len(others) > 0:
		return skip(fmt.Sprintf("also staged on node %s: replacing its image would take it from them too", strings.Join(nodesOfEntries(others), ", ")))
	}
	method, took, err := s.fence(ctx, home, where, id, mine, through, allowCopy && v.AccessType == pool.AccessMount)
	if errors.Is(err, pool.ErrNeedsCopy) {
		if v.AccessType != pool.AccessMount {
			return skip(fmt.Sprintf("pool %s has no reflink, and a copy of a raw block volume could hold a torn image: the node cannot freeze it, so it may still be writing", where.Name))
		}
		return skip(fmt.Sprintf("pool %s has no reflink, and fencing by a full copy is not allowed (the fencing controller's --fence-by-copy)", where.Name))
	}
	if err != nil {
		return failed(err)
	}
	fv.Fenced, fv.Method, fv.Seconds = true, method, took.Seconds()
	logger.Info("Fenced the node from a volume: nothing it writes from now on reaches the volume", "pool", where.Name, "method", method, "duration", took)
	return fv
}
