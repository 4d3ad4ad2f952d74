package controller

import (
	"context"
	"maps"
	"slices"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/loopvol/loopvol/pkg/pool"
	"github.com/loopvol/loopvol/pkg/volspec"
	"k8s.io/klog/v2"
)

// Mutable parameters: the keys a VolumeAttributesClass of loopvol.csi.io may
// carry, which ControllerModifyVolume applies and CreateVolume accepts
// (CSI mutable_parameters). deploy/kubernetes/base/admission/
// volumeattributesclass-parameters.yaml checks the same rules.
const (
	// MutablePreallocate is "true" (the image fully allocated, thick) or
	// "false" (sparse, thin: blocks allocated as they are written, their
	// promise still counted in the pool's capacity).
	MutablePreallocate = "preallocate"
	// MutablePool names the pool the volume is to live in: another pool
	// of its zone moves it there, keeping its ID (pool.MoveVolume).
	MutablePool = ParameterPool
)

// notEnforced are keys users ask for (docs/snapshots.md) that loopvol does
// not apply; they are refused with the reason rather than accepted and
// ignored, since a limit that is not enforced is worse than none.
var notEnforced = map[string]string{
	"ioLimitMiBps": "an io.max limit would have to be set in the cgroup of every Pod that writes to the volume " +
		"(the kernel charges a loop device's I/O to the writer's cgroup, and io.max cannot be set at the root), which a CSI driver does not know",
	"ioLimitIOPS": "an io.max limit would have to be set in the cgroup of every Pod that writes to the volume " +
		"(the kernel charges a loop device's I/O to the writer's cgroup, and io.max cannot be set at the root), which a CSI driver does not know",
}

// mutable is what a set of mutable parameters asks for; nil and "" mean the
// key was not given.
type mutable struct {
	thin *bool
	pool string
}

// parseMutable checks mutable parameters strictly, before anything is
// changed: an unknown key or an invalid value is INVALID_ARGUMENT naming
// the key, which external-resizer reports as infeasible (it does not retry
// hot). Keys are checked in sorted order, so the same request always gets
// the same message.
func (s *Server) parseMutable(params map[string]string) (mutable, error) {
	var m mutable
	keys := make([]string, 0, len(params))
	for k := range params {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		v := params[k]
		if len(k) > maxParameterKeyLen || len(v) > maxObjectNameLength {
			return m, invalid("mutable parameter %.64q... is too long for any loopvol key or value", k)
		}
		if strings.HasPrefix(k, kubernetesPrefix) {
			// The claim's and the volume's names that external-resizer
			// (and loopvol's resizer) add with --extra-modify-metadata:
			// who asks, not what to change.
			continue
		}
		switch k {
		case MutablePreallocate:
			switch v {
			case "true", "false":
				thin := v == "false"
				m.thin = &thin
			default:
				return m, invalid("mutable parameter %q is %q; it is \"true\" (thick) or \"false\" (thin)", k, v)
			}
		case MutablePool:
			if _, ok := s.pools[v]; !ok {
				return m, invalid("mutable parameter %q: no pool %q (pools: %s)", k, v, strings.Join(s.poolNames, ", "))
			}
			m.pool = v
		default:
			if why, ok := notEnforced[k]; ok {
				return m, invalid("mutable parameter %q is not supported: loopvol cannot enforce it: %s", k, why)
			}
			return m, invalid("mutable parameter %q is not known; loopvol takes %q and %q", k, MutablePreallocate, MutablePool)
		}
	}
	return m, nil
}

// changes returns the mutable parameters that change a volume (those
// parseMutable knows), without the csi.storage.k8s.io/ names: what a
// record's Modifying keeps.
func changes(params map[string]string) map[string]string {
	kept := maps.Clone(params)
	maps.DeleteFunc(kept, func(k, _ string) bool { return strings.HasPrefix(k, kubernetesPrefix) })
	return kept
}

// ControllerModifyVolume applies a VolumeAttributesClass's mutable
// parameters to a volume.
func (s *Server) ControllerModifyVolume(ctx context.Context, req *csi.ControllerModifyVolumeRequest) (*csi.ControllerModifyVolumeResponse, error) {
	return answer(s.controllerModifyVolume(ctx, req))
}

// controllerModifyVolume: validate → lock → read → apply. Applying what the
// volume already has answers success without a write, so a retry is
// harmless; the record says what is applied (pool.SetLayout and
// pool.MoveVolume have the crash orders). withVolume settles a move that a
// crash interrupted before anything else, so a retry converges: the move
// is rolled forward (the copy was durable) or back, then made again.
//
// pool: another pool of the volume's zone moves the volume there, keeping
// its ID: only while it is detached (FAILED_PRECONDITION naming the nodes
// otherwise, which external-resizer retries), with a full copy of its data
// (time proportional to what it holds). Another zone's pool is
// INVALID_ARGUMENT: the volume's topology, and so the nodes that may use
// it, would change under its PersistentVolume. A change of preallocate is
// applied first, in the pool the volume is in; the copy keeps the layout.
func (s *Server) controllerModifyVolume(ctx context.Context, req *csi.ControllerModifyVolumeRequest) (*csi.ControllerModifyVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, invalid("volume_id is required")
	}
	m, err := s.parseMutable(req.GetMutableParameters())
	if err != nil {
		return nil, err
	}
	logger := klog.FromContext(ctx)
	err = s.withVolume(req.GetVolumeId(), func(p *pool.Pool, v *pool.Volume) error {
		id, err := pool.ParseVolumeID(v.ID)
		if err != nil {
			return err
		}
		home := s.pools[id.Pool]
		var to *pool.Pool
		if m.pool != "" && m.pool != p.Name {
			to = s.pools[m.pool]
			if to.Zone != home.Zone {
				return invalid("mutable parameter %q: volume %s is in zone %s, pool %s in zone %s; a volume moves only within its zone",
					MutablePool, v.ID, home.Zone, to.Name, to.Zone)
			}
			if len(v.Attachments) > 0 {
				return volspec.Errorf(volspec.ErrPrecondition, "mutable parameter %q: volume %s is published to %s; it moves to pool %s only once it is unpublished from every node",
					MutablePool, v.ID, strings.Join(nodesOf(v), ", "), to.Name)
			}
		}
		thin, params := m.thin, changes(req.GetMutableParameters())
		if thin == nil && to != nil && v.Modifying != nil {
			// A change of layout that a crash interrupted, asked by
			// an earlier class: finished before the move, which
			// copies only a settled image.
			want := v.Modifying[MutablePreallocate] == "false"
			thin, params = &want, v.Modifying
		}
		if err := checkUnstaged(home, id, v, thin, to); err != nil {
			return err
		}
		if thin != nil {
			was := v.Thin
			if err := p.SetLayout(ctx, v, *thin, params); err != nil {
				return err
			}
			if was != v.Thin {
				logger.V(2).Info("Modified volume", "volumeID", v.ID, "thin", v.Thin)
			}
		}
		if to == nil {
			return nil
		}
		last := int64(-1)
		progress := func(done, total int64) {
			if pct := done * 10 / max(total, 1); pct != last {
				last = pct
				logger.V(4).Info("Copying volume to its new pool", "volumeID", v.ID, "pool", to.Name, "doneBytes", done, "totalBytes", total)
			}
		}
		logger.V(2).Info("Moving volume", "volumeID", v.ID, "from", p.Name, "to", to.Name, "sizeBytes", v.SizeBytes)
		if _, err := home.MoveVolume(ctx, id, to, s.peer, pool.MoveOptions{Progress: progress, AfterStep: s.afterMoveStep}); err != nil {
			return err
		}
		logger.V(2).Info("Moved volume", "volumeID", v.ID, "from", p.Name, "to", to.Name)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &csi.ControllerModifyVolumeResponse{}, nil
}

// checkCreateMutable checks CreateVolume's mutable parameters (parsed
// already) against the rest of the request: a pool given both as a
// parameter and as a mutable parameter must be the same, and a volume made
// from a source lands in the source's pool.
func checkCreateMutable(req *csi.CreateVolumeRequest, m mutable, src *source) error {
	if m.pool == "" {
		return nil
	}
	if p, ok := req.GetParameters()[ParameterPool]; ok && p != m.pool {
		return invalid("parameter %q is %q and mutable parameter %q is %q; a volume is in one pool", ParameterPool, p, MutablePool, m.pool)
	}
	if src != nil && src.pool.Name != m.pool {
		return invalid("mutable parameter %q is %q, but the volume's source %s is in pool %s, where its copy is made", MutablePool, m.pool, src.id(), src.pool.Name)
	}
	return nil
}
