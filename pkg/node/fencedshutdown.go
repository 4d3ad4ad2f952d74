package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/loopvol/loopvol/pkg/pool"
)

// Shutting down a fenced volume's filesystem (issue 26; docs/fencing.md,
// "The returning node"). A filesystem still mounted from a fenced device
// (fenced.go) writes into the orphaned inode: what its Pod writes there is
// acknowledged and then lost with the device, and the application never
// knows. Left frozen by the self-fence it is no better: its writers wait in
// the kernel (D state) and cannot be killed, so kubelet never tears the Pod
// down, and the unstage that would clean it up never comes.
//
// So the node shuts such a filesystem down (EXT4_IOC_SHUTDOWN, which is
// XFS_IOC_GOINGDOWN) without flushing its log: nothing of the old inode
// needs to be written any more. Every later I/O on it fails with EIO: the
// application sees errors instead of losing writes silently, its processes
// can exit, kubelet tears the Pod down, and NodeUnpublishVolume and
// NodeUnstageVolume unmount it and detach the device (an unmount of a
// shut-down filesystem works). A frozen one is shut down first and thawed
// after: the shutdown works on a frozen ext4 or xfs, so the writers it
// releases find the filesystem shut down and get EIO, and no write ever
// reaches the orphaned inode between a thaw and the shutdown.
//
// The node does it where it finds one:
//
//   - EndSelfFence, for a volume fenced while the node was self-fenced,
//     instead of a thaw;
//   - ThawLeftovers, for what an earlier run of this plugin left;
//   - a check every fencedCheckInterval, started by Start: a node that was
//     stopped whole (SIGSTOP, a VM paused) never self-fenced, and when it
//     runs again its Pods write into the orphaned inode without any error;
//     the check finds them.
//
// Only fenced devices (pkg/loop FindReplaced: this node's devices of a file
// that was the volume's image and was replaced there, never a device of the
// current image) of volumes of shared pools (local pools are never fenced)
// are shut down, each under its volume's lock.

// The ioctl of EXT4_IOC_SHUTDOWN and XFS_IOC_GOINGDOWN (FS_IOC_SHUTDOWN in
// newer headers), _IOR('X', 125, __u32); golang.org/x/sys/unix does not
// define it.
const ioctlFSShutdown = 0x8004587D

// fencedCheckInterval is how often the node looks for filesystems mounted
// from fenced devices (see above).
const fencedCheckInterval = 10 * time.Second

// errNoShutdown is a shutdown of a filesystem that cannot be shut down.
var errNoShutdown = errors.New("the filesystem cannot be shut down")

// shutDown shuts down the filesystem at e without flushing its log, then
// thaws it, both through one descriptor: a shut-down xfs opens nothing
// afterwards. A filesystem that opens with EIO was shut down already (by
// an earlier call, or by xfs after an error) and is left as it is.
func (f sysFreezer) shutDown(e mountEntry) (bool, error) {
	fd, err := f.open(e)
	switch {
	case errors.Is(err, unix.EIO):
		return false, nil
	case err != nil:
		return false, err
	}
	defer unix.Close(fd)
	switch err := unix.IoctlSetPointerInt(fd, ioctlFSShutdown, unix.FS_SHUTDOWN_FLAGS_NOLOGFLUSH); {
	case errors.Is(err, unix.ENOTTY), errors.Is(err, unix.EOPNOTSUPP):
		return false, fmt.Errorf("%s (%s): %w", e.path, e.fsType, errNoShutdown)
	case err != nil:
		return false, fmt.Errorf("shut down the filesystem at %s: %w", e.path, os.NewSyscallError("FS_IOC_SHUTDOWN", err))
	}
	switch err := unix.IoctlSetInt(fd, ioctlFITHAW, 0); {
	case err == nil:
		return true, nil
	case errors.Is(err, unix.EINVAL):
		return false, nil // not frozen
	default:
		return false, fmt.Errorf("thaw the shut-down filesystem at %s (thaw it with fsfreeze -u): %w", e.path, os.NewSyscallError("FITHAW", err))
	}
}

func (noFreezer) shutDown(e mountEntry) (bool, error) {
	return false, fmt.Errorf("%s: %w", e.path, errNoShutdown)
}

// shutDowns remembers the fenced devices whose filesystem the node shut
// down, so that each is logged once: the check comes back to them every
// fencedCheckInterval until they are cleaned up.
type shutDowns struct {
	mu   sync.Mutex
	devs map[string]bool
}

// first records dev and reports whether it was not recorded yet.
func (d *shutDowns) first(dev string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.devs[dev] {
		return false
	}
	if d.devs == nil {
		d.devs = map[string]bool{}
	}
	d.devs[dev] = true
	return true
}

// forget drops dev, detached: its name may be another device's next.
func (d *shutDowns) forget(dev string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.devs, dev)
}

// keepOnly drops the devices not in attached (detached by someone else
// than the node's cleanup).
func (d *shutDowns) keepOnly(attached []string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for dev := range d.devs {
		if !slices.Contains(attached, dev) {
			delete(d.devs, dev)
		}
	}
}

// shutDownFenced shuts down (and thaws) the filesystem mounted from dev if
// dev is a fenced device of volume id; the caller holds the volume's lock,
// and dev is checked again under it, since a device detached meanwhile may
// be of the current image by now. It reports whether it shut one down.
func (n *node) shutDownFenced(ctx context.Context, id pool.VolumeID, dev string) bool {
	logger := klog.FromContext(ctx).WithValues("volumeID", id.String(), "device", dev)
	fenced, err := n.fencedDevices(id)
	if err != nil {
		logger.Error(err, "Could not tell whether a volume's loop device is fenced; its filesystem is not shut down")
		return false
	}
	if !slices.Contains(fenced, dev) {
		return false
	}
	e, ok, err := n.fsMount(dev)
	if err != nil {
		logger.Error(err, "Could not find the filesystem of a fenced volume to shut it down")
		return false
	}
	if !ok {
		return false // nothing mounted writes it
	}
	thawed, err := n.freezer.shutDown(e)
	if err != nil {
		// Not thawed either: a frozen filesystem stays frozen, rather
		// than taking writes that are lost.
		logger.Error(err, "Could not shut down the filesystem of a fenced volume; what is written there is lost, and a frozen one stays frozen until NodeUnstageVolume", "mountPoint", e.path)
		return false
	}
	if n.shut.first(dev) {
		logger.Info("Shut down the filesystem of a fenced volume: its writes would be lost; the Pod gets I/O errors until it is torn down", "mountPoint", e.path, "thawed", thawed)
	}
	return true
}

// shutDownFencedLocked is shutDownFenced under volume id's lock, taken
// without waiting: a call in progress on the volume (its unstage among
// them) is left to finish, and the next check comes back to it.
func (s *Server) shutDownFencedLocked(ctx context.Context, id pool.VolumeID, dev string) bool {
	unlock, err := s.lock(id)
	if err != nil {
		klog.FromContext(ctx).V(2).Info("Left a fenced volume's filesystem to the next check: a call on the volume is in progress", "volumeID", id.String(), "device", dev)
		return false
	}
	defer unlock()
	return s.node.shutDownFenced(ctx, id, dev)
}

// checkFenced shuts down every filesystem mounted from a fenced device of a
// shared-pool volume (see above).
func (s *Server) checkFenced(ctx context.Context) {
	logger := klog.FromContext(ctx)
	devs, held, err := s.node.heldFenced(ctx)
	if err != nil {
		logger.Error(err, "Could not look for the filesystems of fenced volumes")
		return
	}
	s.node.shut.keepOnly(devs)
	if len(held) == 0 {
		return
	}
	es, err := s.node.mounts.list()
	if err != nil {
		logger.Error(err, "Could not read the mount table to find the filesystems of fenced volumes")
		return
	}
	for _, h := range held {
		if _, mounted := rootMount(es, h.dev); mounted {
			s.shutDownFencedLocked(ctx, h.id, h.dev)
		}
	}
}

// FencedVolumes counts the fenced volumes this node still holds: shared-pool
// volumes with a loop device of a replaced image, mounted or not (-1 when it
// cannot tell). The heartbeat writes it into its Lease, and the fencing
// controller keeps its out-of-service taint on the node until it is 0.
func (s *Server) FencedVolumes(ctx context.Context) int {
	_, held, err := s.node.heldFenced(ctx)
	if err != nil {
		klog.FromContext(ctx).Error(err, "Could not count the fenced volumes this node holds")
		return -1
	}
	ids := map[string]bool{}
	for _, h := range held {
		ids[h.id.String()] = true
	}
	return len(ids)
}

// heldDevice is a fenced loop device of this node's.
type heldDevice struct {
	id  pool.VolumeID
	dev string
}

// heldFenced lists this node's loop devices (devs) and, of them, the
// fenced devices of shared-pool volumes (held).
// The fence broke the node's staged record of each volume, so the devices
// are found as the start finds them (reconcileStaged): by their backing
// files. A volume whose pool or devices cannot be read is left out (logged:
// the next look finds it).
func (n *node) heldFenced(ctx context.Context) (devs []string, held []heldDevice, err error) {
	logger := klog.FromContext(ctx)
	devs, err = n.Loop.List()
	if err != nil {
		return nil, nil, fmt.Errorf("list this node's loop devices: %w", err)
	}
	fenced := map[string][]string{} // volume ID → its fenced devices (none: not shared)
	for _, dev := range devs {
		id, ok := n.volumeOfDevice(dev)
		if !ok {
			continue
		}
		of, seen := fenced[id.String()]
		if !seen {
			shared, err := n.sharedPool(id)
			switch {
			case err != nil:
				logger.Error(err, "Could not tell whether a volume's pool is shared; its fenced devices are left to the next look", "volumeID", id.String())
			case shared:
				if of, err = n.fencedDevices(id); err != nil {
					logger.Error(err, "Could not find a volume's fenced devices; left to the next look", "volumeID", id.String())
				}
			}
			fenced[id.String()] = of
		}
		if slices.Contains(of, dev) {
			held = append(held, heldDevice{id: id, dev: dev})
		}
	}
	return devs, held, nil
}

// volumeOfDevice returns the volume whose image (or a file that was it)
// loop device dev serves, if it is one of the pools this node serves.
func (n *node) volumeOfDevice(dev string) (pool.VolumeID, bool) {
	st, err := n.Loop.Status(dev)
	if err != nil {
		return pool.VolumeID{}, false
	}
	names := make([]string, 0, len(n.pools))
	for name := range n.pools {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		hash, ok := n.pools[name].ImageHash(st.BackingFile)
		if !ok {
			continue
		}
		id, ok := n.pools[name].VolumeOfImage(hash)
		if !ok || n.pools[id.Pool] == nil {
			return pool.VolumeID{}, false
		}
		return id, true
	}
	return pool.VolumeID{}, false
}

// watchFenced runs checkFenced every fencedCheckInterval until ctx ends.
func (s *Server) watchFenced(ctx context.Context) {
	tick := time.NewTicker(fencedCheckInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			s.checkFenced(ctx)
		}
	}
}
