package node

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/loopvol/loopvol/pkg/pool"
)

// Reasons of NodeGetStorageHealth entries.
const (
	reasonPoolUnusable      = "PoolUnusable"
	reasonPoolOvercommitted = "PoolOvercommitted"
	reasonPoolNearlyFull    = "PoolNearlyFull"
)

// nearlyFullPercent: a pool whose filesystem has less free than this share
// of its size is reported degraded. New volumes may not fit, and images
// that are not fully allocated (thin volumes, snapshots sharing blocks by
// reflink) need free blocks to be written.
const nearlyFullPercent = 5

// NodeGetStorageHealth reports the health of the pools this node serves,
// the storage backends of its volumes: a pool that cannot be used (its
// directory lost its marker, is not writable, was swapped) is
// STORAGE_UNREACHABLE; one whose filesystem has less free space than its
// images were promised, or less than nearlyFullPercent free, is
// STORAGE_DEGRADED. The spec allows one entry per status and reason, so
// the pools of each are named together. It takes no lock: it only reads.
func (s *Server) NodeGetStorageHealth(ctx context.Context, _ *csi.NodeGetStorageHealthRequest) (*csi.NodeGetStorageHealthResponse, error) {
	byReason := map[string][]string{}
	for name, p := range s.node.pools {
		if reason, detail, _ := poolHealth(p); reason != "" {
			byReason[reason] = append(byReason[reason], fmt.Sprintf("%s (%s)", name, detail))
		}
	}
	resp := &csi.NodeGetStorageHealthResponse{}
	for _, reason := range []string{reasonPoolUnusable, reasonPoolOvercommitted, reasonPoolNearlyFull} {
		pools := byReason[reason]
		if len(pools) == 0 {
			continue
		}
		sort.Strings(pools)
		resp.BackendHealth = append(resp.BackendHealth, &csi.NodeGetStorageHealthResponse_StorageBackendHealth{
			Status:  poolHealthReasons[reason].status,
			Reason:  reason,
			Message: "pools " + strings.Join(pools, ", ") + ": " + poolHealthReasons[reason].hint,
		})
	}
	return resp, nil
}

// poolHealthReasons say, per reason, the status NodeGetStorageHealth gives
// and what an operator does about it.
var poolHealthReasons = map[string]struct {
	status csi.StorageHealthErrorType
	hint   string
}{
	reasonPoolUnusable: {csi.StorageHealthErrorType_STORAGE_UNREACHABLE,
		"its volumes cannot be staged here; check that the pool directory is mounted and writable and holds its .loopvol-pool marker"},
	reasonPoolOvercommitted: {csi.StorageHealthErrorType_STORAGE_DEGRADED,
		"writes to thin or sparse volumes may fail with ENOSPC; free space on the pool's filesystem or make volumes thick (preallocate: \"true\")"},
	reasonPoolNearlyFull: {csi.StorageHealthErrorType_STORAGE_DEGRADED,
		"new volumes may not fit and writes to thin volumes or reflinked snapshots need free blocks; free space or grow the pool's filesystem"},
}

// poolHealth judges one pool: reason is "" for a healthy pool, else one of
// the reasons above with detail saying why. u is the pool's use, when it
// could be read.
func poolHealth(p *pool.Pool) (reason, detail string, u pool.Usage) {
	if err := p.Check(); err != nil {
		return reasonPoolUnusable, err.Error(), u
	}
	u, err := p.Usage()
	if err != nil {
		return reasonPoolUnusable, err.Error(), u
	}
	switch {
	case u.FreeBytes < u.PromisedBytes:
		return reasonPoolOvercommitted, fmt.Sprintf("%d bytes free, %d promised to images", u.FreeBytes, u.PromisedBytes), u
	case u.TotalBytes > 0 && u.FreeBytes*100 < u.TotalBytes*nearlyFullPercent:
		return reasonPoolNearlyFull, fmt.Sprintf("%d of %d bytes free", u.FreeBytes, u.TotalBytes), u
	}
	return "", "", u
}
