package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/loopvol/loopvol/pkg/loop"
	"github.com/loopvol/loopvol/pkg/pool"
	"github.com/loopvol/loopvol/pkg/statusapi"
)

var _ statusapi.StatusServer = (*Server)(nil)

// NodeStatus reports what this node serves: its pools and their use and
// health, every volume it has a staged record of or a loop device of (with
// the device, the staging and target mounts and the volume's health as
// NodeGetVolumeHealth finds it), and its loop devices that belong to none
// of them (stray: left by a crash, or fenced). It is what `kubectl loopvol`
// shows of a node. It takes no lock: it only reads, and a volume changing
// meanwhile is shown as it was just before or just after.
func (s *Server) NodeStatus(ctx context.Context, _ *statusapi.NodeStatusRequest) (*statusapi.NodeStatus, error) {
	n := s.node
	st := &statusapi.NodeStatus{
		NodeID:           n.NodeID,
		Zone:             n.Zone,
		Version:          n.Version,
		Started:          n.started,
		KubeletDir:       n.kubeletDir,
		KubeletDirHasPod: n.kubeletDirHasPod(),
		MaxVolumes:       n.MaxVolumes,
		SelfFenced:       s.SelfFenced(),
		Pools:            []statusapi.PoolStatus{},
		Volumes:          []statusapi.VolumeStatus{},
	}
	names := make([]string, 0, len(n.pools))
	for name := range n.pools {
		names = append(names, name)
	}
	sort.Strings(names)

	ids := map[pool.VolumeID]bool{}
	for _, name := range names {
		p := n.pools[name]
		ps := statusapi.PoolStatus{Name: name, Path: p.Path, Health: statusapi.HealthOK}
		reason, detail, u := poolHealth(p)
		if reason != "" {
			ps.Health, ps.Message = reason, detail
		}
		ps.TotalBytes, ps.FreeBytes, ps.PromisedBytes = u.TotalBytes, u.FreeBytes, u.PromisedBytes
		ps.CowReserveBytes, ps.AvailableBytes = u.CowReserveBytes, u.AvailableBytes
		ps.OrphanImages, ps.OrphanBytes = u.OrphanImages, u.OrphanBytes
		if vols, err := p.ListVolumeIDs(); err == nil {
			ps.Volumes = len(vols)
		}
		if nodes, err := p.ListNodes(); err == nil {
			ps.Shared = len(nodes) > 1
		}
		st.Pools = append(st.Pools, ps)
		if staged, err := p.ListStaged(n.NodeID); err == nil {
			for _, id := range staged {
				ids[id] = true
			}
		}
	}

	// The devices this node's plugin attached, by image.
	devs, err := n.Loop.List()
	if err != nil {
		return nil, toStatus(err)
	}
	devStatus := map[string]loop.Status{}
	for _, dev := range devs {
		ls, err := n.Loop.Status(dev)
		if err != nil {
			continue // detached meanwhile
		}
		devStatus[dev] = ls
		if ls.Deleted {
			continue
		}
		for _, name := range names {
			if hash, ok := n.pools[name].ImageHash(ls.BackingFile); ok {
				if id, ok := n.pools[name].VolumeOfImage(hash); ok && n.pools[id.Pool] != nil {
					ids[id] = true
				}
				break
			}
		}
	}

	mounts, err := n.mounts.list()
	if err != nil {
		return nil, toStatus(err)
	}
	used := map[string]bool{}
	sorted := make([]pool.VolumeID, 0, len(ids))
	for id := range ids {
		sorted = append(sorted, id)
	}
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].String() < sorted[j].String() })
	for _, id := range sorted {
		vs := n.volumeStatus(ctx, id, mounts)
		if vs.Device != "" {
			used[vs.Device] = true
		}
		st.Volumes = append(st.Volumes, vs)
	}
	for _, dev := range devs {
		if ls, ok := devStatus[dev]; ok && !used[dev] {
			st.StrayDevices = append(st.StrayDevices, statusapi.LoopDevice{Device: dev, Image: ls.BackingFile, Deleted: ls.Deleted})
		}
	}
	return st, nil
}

// volumeStatus is NodeStatus of one volume, given the mount table.
func (n *node) volumeStatus(ctx context.Context, id pool.VolumeID, mounts []mountEntry) statusapi.VolumeStatus {
	home, p := n.pools[id.Pool], n.residence(id)
	vs := statusapi.VolumeStatus{VolumeID: id.String(), Pool: p.Name, Image: p.ImagePath(id), Health: statusapi.HealthOK}
	if rec, err := home.ReadStaged(id, n.NodeID); err == nil {
		vs.Staged, vs.ReadOnly = rec.Staged, rec.ReadOnly
	}
	if _, v, err := n.volume(id); err == nil {
		vs.SizeBytes, vs.FsType = v.SizeBytes, v.FsType
		vs.Block = v.AccessType == pool.AccessBlock
		_, vs.Attached = v.AttachedTo(n.NodeID)
	}
	if allocated, err := p.ImageAllocated(id); err == nil {
		vs.AllocatedBytes = allocated
	}
	if dev, ok, err := n.findDevice(id); err == nil && ok {
		vs.Device = dev
		vs.StagingPath, vs.TargetPaths, vs.MountOptions = n.volumeMounts(dev, vs.Block, mounts)
	}
	a := healthArgs{id: id, staging: vs.StagingPath}
	if len(vs.TargetPaths) > 0 {
		a.publish = vs.TargetPaths[0]
	}
	h, err := n.health(ctx, a)
	switch {
	case errors.Is(err, pool.ErrNotFound):
		vs.Conditions = []statusapi.Condition{{Reason: "NotFound", Message: err.Error()}}
	case err != nil:
		vs.Conditions = []statusapi.Condition{{Reason: "Unknown", Message: err.Error()}}
	default:
		for _, e := range h.GetVolumeHealth().GetHealthStatuses() {
			vs.Conditions = append(vs.Conditions, statusapi.Condition{Reason: e.GetReason(), Message: e.GetMessage()})
		}
	}
	if len(vs.Conditions) > 0 {
		vs.Health = vs.Conditions[0].Reason
	}
	return vs
}

// volumeMounts finds, in the mount table, where the volume on device dev is
// mounted under kubelet's directory: a filesystem's staging mount (the one
// outside kubelet's pods directory, where kubelet asks for its target
// paths) with its options, and the target paths, sorted. A raw block volume
// has no staging mount; its targets are binds of the device node.
func (n *node) volumeMounts(dev string, block bool, mounts []mountEntry) (staging string, targets, opts []string) {
	d := deviceOf(dev)
	pods := filepath.Join(n.kubeletDir, "pods") + "/"
	for _, e := range mounts {
		if !d.holds(e) || !n.underKubelet(e.path) {
			continue
		}
		if !block && staging == "" && !strings.HasPrefix(e.path, pods) {
			staging = e.path
			// The mount's options, then the filesystem's: "rw" may be in both.
			for _, o := range e.opts {
				if !slices.Contains(opts, o) {
					opts = append(opts, o)
				}
			}
			continue
		}
		targets = append(targets, e.path)
	}
	sort.Strings(targets)
	return staging, targets, opts
}

// underKubelet reports whether a mount point lies in kubelet's directory
// (as given, or with its symbolic links resolved).
func (n *node) underKubelet(path string) bool {
	for _, dir := range []string{n.kubeletDir, n.kubeletReal} {
		if strings.HasPrefix(path, dir+"/") {
			return true
		}
	}
	return false
}

// podUID is a Pod's UID as kubelet names its directory: a UUID the API
// server made, or a static Pod's hash in hex. It becomes a path element,
// so nothing but letters, digits and inner dashes is accepted.
var podUID = regexp.MustCompile(`^[0-9a-zA-Z][0-9a-zA-Z-]{0,63}$`)

// ValidatePodUID accepts an empty UID (not given) or one podUID matches.
func ValidatePodUID(uid string) error {
	if uid != "" && !podUID.MatchString(uid) {
		return fmt.Errorf("pod UID %q is not a Pod's UID (the Downward API's metadata.uid: letters, digits and dashes)", uid)
	}
	return nil
}

// kubeletDirHasPod says whether kubelet keeps the plugin's own Pod directory
// (pods/<PodUID>) under the kubelet directory the plugin was given, as it
// does under its --root-dir for every Pod it runs; nil without a PodUID.
// The directory itself is not followed if it is a symbolic link.
func (n *node) kubeletDirHasPod() *bool {
	if n.PodUID == "" {
		return nil
	}
	fi, err := os.Lstat(filepath.Join(n.kubeletDir, "pods", n.PodUID))
	has := err == nil && fi.IsDir()
	return &has
}
