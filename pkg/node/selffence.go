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

// Self-fence (issue 26; docs/fencing.md, "Self-fence: a live node that
// cannot renew"). The controller fences a node, replacing the images of the
// shared-pool volumes it has staged, once the node's heartbeat Lease went
// unrenewed for the fencing period and its kubelet is not Ready. A node that
// is cut off from the API server but alive renews nothing, while its Pods go
// on writing: without more, they would have writes acknowledged right up to
// the fence that the volume then never holds, and a fence by copy (a pool
// without reflink) would copy a filesystem being written, a torn image. So
// the node stops that I/O itself before the period ends: the heartbeat's
// Renewer calls SelfFence once no renewal succeeded for its self-fence
// period (pkg/heartbeat has the arithmetic that puts this before anyone may
// fence the node), and SelfFence freezes (FIFREEZE) the filesystem of every
// volume this node has staged from a shared pool. A frozen filesystem has
// written its dirty data and a clean journal, and every new write waits in
// the kernel: the Pods block instead of being told that data is safe, and
// any fence sees a clean filesystem.
//
// Local pools (one node record) are never fenced, so they are never
// self-fenced either: nobody else can take their volumes, and stopping them
// would only stop the node's own work.
//
// Raw block volumes cannot be frozen: no filesystem stands between their
// user and the loop device. They rely on the storage-side fence alone: what
// they write after it goes to the orphaned inode and never reaches the
// volume, and the controller never fences one by copy (which could be torn),
// only by reflink.
//
// When a renewal succeeds again, EndSelfFence thaws what SelfFence froze,
// except a volume fenced meanwhile (its loop device is of a replaced image,
// fenced.go): its writes would go nowhere, and frozen its writers could not
// even be killed, so its filesystem is shut down first and then thawed
// (fencedshutdown.go): its Pods get I/O errors until NodeUnstageVolume
// cleans it up. Every unstage thaws (FITHAW) before the unmount, since an
// unmount of a frozen filesystem blocks. While the node is self-fenced, NodeStageVolume and
// NodePublishVolume of shared-pool volumes are refused with UNAVAILABLE, so
// that nothing new starts writing; a stage already under way when the
// self-fence began freezes what it mounted before it answers.
//
// What was frozen is kept in memory only. A node plugin restarted while its
// previous run had filesystems frozen does not know which; it thaws every
// shared-pool filesystem it has staged (ThawLeftovers) once it knows it
// holds its heartbeat, at its first successful renewal (or at once when it
// runs without one, since then nothing of it freezes). A fenced device is
// never among them: pkg/loop Find passes over it, and the fence removed its
// staged record; ThawLeftovers shuts its filesystem down and thaws it.
//
// A filesystem that is frozen already when SelfFence comes to it (FIFREEZE
// answers EBUSY) counts as frozen by it: it may be what a previous run left,
// and the self-fence needs it frozen. Were it a snapshot's freeze
// (pkg/controller/freeze.go, a controller on this node), that snapshot's own
// thaw would let the volume's writers go on; the freezes of snapshots last a
// reflink's time, and a controller cut off with its node has no new
// snapshots to take.

// The ioctls of linux/fs.h, _IOWR('X', 119, int) and _IOWR('X', 120, int);
// golang.org/x/sys/unix does not define them.
const (
	ioctlFIFREEZE = 0xC0045877
	ioctlFITHAW   = 0xC0045878
)

// selfFenceRetry is how often SelfFence comes back to volumes whose lock
// another call holds.
const selfFenceRetry = 50 * time.Millisecond

// errNotFreezable is a freeze of a filesystem that cannot be frozen.
var errNotFreezable = errors.New("the filesystem cannot be frozen")

// fsFreezer freezes and thaws the filesystem of a mount: the kernel's
// (sysFreezer), or a fake's in the unit tests.
type fsFreezer interface {
	// freeze freezes the filesystem mounted at e; already says it was
	// frozen before (EBUSY). errNotFreezable: it cannot be frozen.
	freeze(e mountEntry) (already bool, err error)
	// thaw thaws it, through fd when it is not -1 (a resolved descriptor,
	// O_PATH, of the mount's root), else through e's path; thawed is false
	// when it was not frozen (EINVAL).
	thaw(e mountEntry, fd int) (thawed bool, err error)
	// shutDown shuts the filesystem mounted at e down without flushing
	// its log, then thaws it (fencedshutdown.go); thawed says it was
	// frozen. errNoShutdown: it cannot be shut down (and is not thawed).
	shutDown(e mountEntry) (thawed bool, err error)
}

// sysFreezer freezes with the ioctls, on a descriptor of the mount point
// that is checked to be on the entry's filesystem: the mount table's path is
// opened again by name, and a path changed since must not make it freeze
// another filesystem.
type sysFreezer struct{}

func (sysFreezer) open(e mountEntry) (int, error) {
	fd, err := unix.Open(e.path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open %s: %w", e.path, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("stat %s: %w", e.path, err)
	}
	if uint64(st.Dev) != e.dev {
		unix.Close(fd)
		return -1, fmt.Errorf("%s is no longer on the filesystem of device %d:%d", e.path, unix.Major(e.dev), unix.Minor(e.dev))
	}
	return fd, nil
}

func (f sysFreezer) freeze(e mountEntry) (bool, error) {
	fd, err := f.open(e)
	if err != nil {
		return false, err
	}
	defer unix.Close(fd)
	switch err := unix.IoctlSetInt(fd, ioctlFIFREEZE, 0); {
	case err == nil:
		return false, nil
	case errors.Is(err, unix.EBUSY):
		return true, nil
	case errors.Is(err, unix.EOPNOTSUPP), errors.Is(err, unix.ENOTTY):
		return false, fmt.Errorf("%s (%s): %w", e.path, e.fsType, errNotFreezable)
	default:
		return false, fmt.Errorf("freeze the filesystem at %s: %w", e.path, os.NewSyscallError("FIFREEZE", err))
	}
}

func (f sysFreezer) thaw(e mountEntry, fd int) (bool, error) {
	var err error
	if fd < 0 {
		fd, err = f.open(e)
	} else {
		// An O_PATH descriptor takes no ioctl: it is opened for real
		// through its magic link, with no walk of the path.
		fd, err = unix.Open(procFd(fd), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	}
	switch {
	case errors.Is(err, unix.EIO):
		// A filesystem shut down after an I/O error (xfs) opens
		// nothing; it writes nothing either, and its unmount does
		// not wait on a freeze.
		return false, nil
	case err != nil:
		return false, fmt.Errorf("thaw %s: %w", e.path, err)
	}
	defer unix.Close(fd)
	switch err := unix.IoctlSetInt(fd, ioctlFITHAW, 0); {
	case err == nil:
		return true, nil
	case errors.Is(err, unix.EINVAL):
		return false, nil // not frozen
	default:
		return false, fmt.Errorf("thaw the filesystem at %s (thaw it with fsfreeze -u): %w", e.path, os.NewSyscallError("FITHAW", err))
	}
}

// noFreezer is the freezer of a fake mount table without one of its own:
// nothing there can be frozen, nothing is.
type noFreezer struct{}

func (noFreezer) freeze(e mountEntry) (bool, error) {
	return false, fmt.Errorf("%s: %w", e.path, errNotFreezable)
}
func (noFreezer) thaw(mountEntry, int) (bool, error) { return false, nil }

// selfFence is the node's self-fence state.
type selfFence struct {
	// op runs SelfFence, EndSelfFence and ThawLeftovers one at a time.
	op sync.Mutex
	// mu guards what follows. Every freeze holds it from its check of
	// active to its record in frozen, so that EndSelfFence, which clears
	// active and takes frozen under it, misses none.
	mu     sync.Mutex
	active bool
	frozen map[string]frozenFS // by volume ID
}

// frozenFS is a filesystem the self-fence froze: volume id's, on dev.
type frozenFS struct {
	id  pool.VolumeID
	dev string
}

// errSelfFenced is the error of a stage or a publish of a shared-pool
// volume while the node is self-fenced (UNAVAILABLE: retried, and served
// once the heartbeat is back).
var errSelfFenced = errors.New("this node cannot renew its heartbeat; it has stopped I/O to shared-pool volumes")

// Incarnation is when this node plugin started: the NodeStart of its staged
// records and the LastStart of its node records. The heartbeat writes it
// into its Lease, so that the fencing controller tells a restarted plugin
// from the one it fenced.
func (s *Server) Incarnation() time.Time { return s.node.started }

// SelfFenced reports whether the node is self-fenced (SelfFence was called
// and EndSelfFence not since).
func (s *Server) SelfFenced() bool {
	s.node.sf.mu.Lock()
	defer s.node.sf.mu.Unlock()
	return s.node.sf.active
}

// SelfFence stops the I/O of this node to its shared-pool volumes: it
// freezes the filesystem of each one it has staged (see above), each under
// the volume's lock, coming back to those another call holds until it has
// them all or ctx ends. From its start until EndSelfFence, stages and
// publishes of shared-pool volumes are refused. Failures are logged: a
// volume it cannot freeze is left to the storage-side fence.
func (s *Server) SelfFence(ctx context.Context) {
	n := s.node
	n.sf.op.Lock()
	defer n.sf.op.Unlock()
	logger := klog.FromContext(ctx)
	n.sf.mu.Lock()
	n.sf.active = true
	n.sf.mu.Unlock()
	pending := n.sharedStaged(ctx)
	logger.Info("Self-fencing: this node cannot renew its heartbeat, so it freezes the filesystems of its shared-pool volumes before it may be fenced", "volumes", len(pending))
	frozen := 0
	for {
		var busy []pool.VolumeID
		for _, id := range pending {
			unlock, err := s.lock(id)
			if err != nil {
				busy = append(busy, id)
				continue
			}
			if n.freezeVolume(ctx, id) {
				frozen++
			}
			unlock()
		}
		if len(busy) == 0 {
			break
		}
		logger.V(2).Info("Waiting for calls in progress on shared-pool volumes to freeze them", "volumes", len(busy))
		pending = busy
		select {
		case <-ctx.Done():
			logger.Info("Stopped self-fencing before every shared-pool volume was frozen: the plugin is stopping", "left", len(busy))
			return
		case <-time.After(selfFenceRetry):
		}
	}
	logger.Info("Self-fenced: new writes to this node's shared-pool filesystems wait until the heartbeat is renewed", "frozen", frozen)
}

// EndSelfFence ends the self-fence: it thaws what SelfFence (or a stage
// under it) froze, except a volume fenced meanwhile, whose filesystem it
// shuts down before it thaws it (fencedshutdown.go), and serves stages and
// publishes of shared-pool volumes again.
func (s *Server) EndSelfFence(ctx context.Context) {
	n := s.node
	n.sf.op.Lock()
	defer n.sf.op.Unlock()
	n.sf.mu.Lock()
	was := n.sf.active
	n.sf.active = false
	frozen := n.sf.frozen
	n.sf.frozen = map[string]frozenFS{}
	n.sf.mu.Unlock()
	if !was {
		return
	}
	keys := make([]string, 0, len(frozen))
	for k := range frozen {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	thawed, shut := 0, 0
	for _, k := range keys {
		f := frozen[k]
		switch ok, fenced := n.thawSelfFenced(ctx, f); {
		case ok:
			thawed++
		case fenced && s.shutDownFencedLocked(ctx, f.id, f.dev):
			shut++
		}
	}
	klog.FromContext(ctx).Info("Ended the self-fence: the heartbeat is renewed again", "thawed", thawed, "shutDown", shut, "frozen", len(frozen))
}

// ThawLeftovers shuts down (and thaws) the filesystems of fenced volumes
// (fencedshutdown.go), then thaws every shared-pool filesystem this node
// has staged, in case an earlier run of this plugin left it frozen (see
// above), unless the node is self-fenced now (EndSelfFence thaws them
// then: SelfFence counted those frozen already as its own). The caller
// runs it once the node holds its heartbeat: at the first successful
// renewal, or at start when it runs without one.
func (s *Server) ThawLeftovers(ctx context.Context) {
	n := s.node
	n.sf.op.Lock()
	defer n.sf.op.Unlock()
	// Self-fenced or not: a fenced volume's writes are lost either way,
	// and once its filesystem is shut down its writers can exit.
	s.checkFenced(ctx)
	if s.SelfFenced() {
		return
	}
	logger := klog.FromContext(ctx)
	for _, id := range n.sharedStaged(ctx) {
		dev, ok, err := n.findDevice(id)
		if err != nil || !ok {
			continue // nothing attached, or a fenced device (Find passes over it)
		}
		e, ok, err := n.fsMount(dev)
		if err != nil || !ok {
			continue
		}
		thawed, err := n.freezer.thaw(e, -1)
		switch {
		case err != nil:
			logger.Error(err, "Could not thaw a shared-pool volume an earlier run of this plugin may have left frozen", "volumeID", id.String(), "device", dev, "mountPoint", e.path)
		case thawed:
			logger.Info("Thawed a shared-pool volume an earlier run of this plugin left frozen", "volumeID", id.String(), "device", dev, "mountPoint", e.path)
		}
	}
}

// sharedStaged lists the volumes this node has a staged record of (in
// their home pools) that live in a shared pool, in a stable order.
func (n *node) sharedStaged(ctx context.Context) []pool.VolumeID {
	logger := klog.FromContext(ctx)
	names := make([]string, 0, len(n.pools))
	for name := range n.pools {
		names = append(names, name)
	}
	sort.Strings(names)
	var out []pool.VolumeID
	for _, name := range names {
		ids, err := n.pools[name].ListStaged(n.NodeID)
		if err != nil {
			logger.Error(err, "Could not list this node's staged records; their volumes are left to the storage-side fence", "pool", name)
			continue
		}
		for _, id := range ids {
			if n.pools[id.Pool] == nil {
				continue
			}
			shared, err := n.sharedPool(id)
			if err != nil {
				// Counted as shared: a volume stopped for nothing is
				// less harm than one written under a fence.
				logger.Error(err, "Could not tell whether a volume's pool is shared; treating it as shared", "volumeID", id.String())
			}
			if shared || err != nil {
				out = append(out, id)
			}
		}
	}
	return out
}

// sharedPool reports whether the pool volume id lives in is served by more
// than one node: a pool where another node could stage the volume, and
// where the controller fences (pkg/controller servedByMany).
func (n *node) sharedPool(id pool.VolumeID) (bool, error) {
	p := n.residence(id)
	nodes, err := p.ListNodes()
	if err != nil {
		return false, fmt.Errorf("volume %s: %w", id, err)
	}
	return len(nodes) > 1, nil
}

// fsMount returns a mount of the root of the filesystem on device dev: a
// raw-block bind of the device node is none.
func (n *node) fsMount(dev string) (mountEntry, bool, error) {
	es, err := n.mounts.list()
	if err != nil {
		return mountEntry{}, false, err
	}
	e, ok := rootMount(es, dev)
	return e, ok, nil
}

// rootMount is fsMount in the mount table es.
func rootMount(es []mountEntry, dev string) (mountEntry, bool) {
	d := deviceOf(dev)
	for _, e := range es {
		if d.holds(e) && e.fsType != "devtmpfs" && (!e.real || e.root == "/") {
			return e, true
		}
	}
	return mountEntry{}, false
}

// freezeVolume freezes the filesystem of volume id (the caller holds its
// lock) if the node is self-fenced, and remembers it; it reports whether
// the filesystem is frozen now.
func (n *node) freezeVolume(ctx context.Context, id pool.VolumeID) bool {
	n.sf.mu.Lock()
	defer n.sf.mu.Unlock()
	if !n.sf.active {
		return false
	}
	logger := klog.FromContext(ctx).WithValues("volumeID", id.String())
	dev, ok, err := n.findDevice(id)
	if err != nil {
		logger.Error(err, "Could not find the loop device of a shared-pool volume to freeze it; it is left to the storage-side fence")
		return false
	}
	if !ok {
		return false // nothing attached here writes it
	}
	e, ok, err := n.fsMount(dev)
	if err != nil {
		logger.Error(err, "Could not find the filesystem of a shared-pool volume to freeze it; it is left to the storage-side fence", "device", dev)
		return false
	}
	if !ok {
		if _, v, err := n.volume(id); err == nil && v.AccessType == pool.AccessBlock {
			logger.Info("Not freezing a raw block volume: it cannot be frozen, and relies on the storage-side fence alone", "device", dev)
		} else {
			logger.V(2).Info("Shared-pool volume has no filesystem mounted here; nothing to freeze", "device", dev)
		}
		return false
	}
	already, err := n.freezer.freeze(e)
	switch {
	case errors.Is(err, errNotFreezable):
		logger.Info("Shared-pool volume's filesystem cannot be frozen; it relies on the storage-side fence alone", "device", dev, "mountPoint", e.path, "err", err.Error())
		return false
	case err != nil:
		logger.Error(err, "Could not freeze a shared-pool volume; it is left to the storage-side fence", "device", dev, "mountPoint", e.path)
		return false
	}
	if n.sf.frozen == nil {
		n.sf.frozen = map[string]frozenFS{}
	}
	n.sf.frozen[id.String()] = frozenFS{id: id, dev: dev}
	logger.Info("Froze a shared-pool volume: its writes wait until the heartbeat is renewed", "device", dev, "mountPoint", e.path, "frozenAlready", already)
	return true
}

// thawSelfFenced thaws f, unless its volume was fenced meanwhile (f's device
// is of a replaced image: fenced, for the caller to shut it down) or f's
// device is not the volume's any more; it reports whether it thawed.
func (n *node) thawSelfFenced(ctx context.Context, f frozenFS) (thawed, fenced bool) {
	logger := klog.FromContext(ctx).WithValues("volumeID", f.id.String(), "device", f.dev)
	devs, err := n.fencedDevices(f.id)
	if err != nil {
		logger.Error(err, "Could not tell whether a frozen volume was fenced; leaving it frozen, for the check of fenced volumes or NodeUnstageVolume")
		return false, false
	}
	if slices.Contains(devs, f.dev) {
		logger.V(2).Info("Not thawing a volume fenced while this node could not renew its heartbeat: what it would write goes nowhere; its filesystem is shut down first")
		return false, true
	}
	dev, ok, err := n.findDevice(f.id)
	if err != nil || !ok || dev != f.dev {
		logger.V(2).Info("Frozen volume's device is gone; nothing to thaw")
		return false, false
	}
	e, ok, err := n.fsMount(dev)
	if err != nil || !ok {
		logger.V(2).Info("Frozen volume's filesystem is not mounted any more; nothing to thaw")
		return false, false
	}
	if _, err := n.freezer.thaw(e, -1); err != nil {
		logger.Error(err, "Could not thaw a shared-pool volume after the self-fence; its writers wait until it is thawed", "mountPoint", e.path)
		return false, false
	}
	logger.Info("Thawed a shared-pool volume: the heartbeat is renewed again", "mountPoint", e.path)
	return true, false
}

// refuseSelfFenced refuses a stage or publish of volume id while the node
// is self-fenced, if the volume lives in a shared pool (or that cannot be
// told).
func (n *node) refuseSelfFenced(id pool.VolumeID) error {
	n.sf.mu.Lock()
	active := n.sf.active
	n.sf.mu.Unlock()
	if !active {
		return nil
	}
	if shared, err := n.sharedPool(id); err == nil && !shared {
		return nil
	}
	return fmt.Errorf("volume %s lives in a pool other nodes serve: %w; retry once it renews", id, errSelfFenced)
}

// freezeAfterStage freezes what a stage of volume id mounted if the node
// self-fenced while it ran, and then refuses the stage as refuseSelfFenced
// would have: a stage that began before the self-fence must not leave a
// shared-pool filesystem writable under it.
func (n *node) freezeAfterStage(ctx context.Context, id pool.VolumeID) error {
	if err := n.refuseSelfFenced(id); err == nil {
		return nil
	}
	n.freezeVolume(ctx, id)
	return n.refuseSelfFenced(id)
}

// thawBeforeUnmount thaws the filesystem of mount e at the resolved staging
// path of volume id before an unstage unmounts it: the unmount of a frozen
// filesystem blocks. A filesystem that is not frozen is left as it is.
func (n *node) thawBeforeUnmount(ctx context.Context, id pool.VolumeID, staging *resolved, e mountEntry) error {
	n.sf.mu.Lock()
	delete(n.sf.frozen, id.String())
	n.sf.mu.Unlock()
	thawed, err := n.freezer.thaw(e, staging.fd)
	if err != nil {
		return fmt.Errorf("volume %s: thaw its filesystem before the unmount: %w", id, err)
	}
	if thawed {
		klog.FromContext(ctx).Info("Thawed a frozen filesystem to unmount it", "volumeID", id.String(), "stagingTargetPath", e.path)
	}
	return nil
}
