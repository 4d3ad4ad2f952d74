package controller

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/loopvol/loopvol/pkg/loop"
	"github.com/loopvol/loopvol/pkg/pool"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
	"k8s.io/mount-utils"
)

// A snapshot of a mounted volume is at least crash-consistent (snapshot.go).
// When the volume is mounted on the controller's own node (one-node
// installations, --mode=all, a controller beside the node plugin) loopvol
// does better: it freezes the filesystem (FIFREEZE: dirty data is written,
// the journal is clean, new writes wait) for the clone and thaws it
// (FITHAW) right after, on every path, so the snapshot is a clean
// filesystem that mounts without recovery. Elsewhere the controller cannot
// reach the mount and the snapshot stays crash-consistent.
//
// The freeze lasts as long as the clone: nothing for a reflink, the copy's
// time on the copy path (writers of the volume wait meanwhile). Were the
// process killed while frozen, the filesystem would stay frozen: the
// deferred thaw covers every return and panic, not a SIGKILL. The restarted
// controller thaws it (thawAbandoned: the snapshot's record still says not
// ready and nobody holds its lock); until then fsfreeze -u <staging path>
// does. So the record that says not ready is written before the freeze (a
// group's, and a snapshot's: freezeSnapshotSource), and the thaw finds the
// source's image where it was frozen and where it lives now, whatever pool
// that is (imagesOf).

// The ioctls of linux/fs.h, _IOWR('X', 119, int) and _IOWR('X', 120, int);
// golang.org/x/sys/unix does not define them.
const (
	ioctlFIFREEZE = 0xC0045877
	ioctlFITHAW   = 0xC0045878
)

// freezer freezes the filesystem on a volume's image where this process
// can see it mounted.
type freezer struct {
	loop loop.Interface
	// mountInfo is the mount table read, /proc/self/mountinfo.
	mountInfo string
}

// thawFunc undoes a freeze; it is safe to call when nothing was frozen.
type thawFunc func()

// freeze freezes the filesystem on image if this process sees it mounted:
// the loop device the image is attached to, the mount of that device's
// filesystem (its root, not a bind of a subdirectory; mount-utils' reading of
// the host's mount table, as pkg/node reads it). It returns a no-op thaw
// when the image is not attached here, when the device holds no mounted
// filesystem (a raw block volume: its user's writes are its own), or when
// the filesystem cannot be frozen; those snapshots are crash-consistent.
// An error is returned only when a freeze was possible and failed.
func (f *freezer) freeze(ctx context.Context, image string) (thawFunc, error) {
	noop := func() {}
	dir, dev, ok := f.mountOf(ctx, image)
	if !ok {
		return noop, nil
	}
	return freezeAt(ctx, dir, dev)
}

// mountOf finds where the filesystem on image is mounted in this process's
// mount table: ok is false when it is not, or when that cannot be told.
func (f *freezer) mountOf(ctx context.Context, image string) (dir, dev string, ok bool) {
	if f == nil || f.loop == nil {
		return "", "", false
	}
	logger := klog.FromContext(ctx)
	dev, ok, err := f.loop.Find(image)
	if err != nil || !ok {
		if err != nil {
			logger.V(4).Info("Cannot tell whether the volume is attached here; the snapshot is crash-consistent", "image", image, "err", err)
		}
		return "", "", false
	}
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil {
		return "", "", false
	}
	mounts, err := mount.ParseMountInfo(f.mountInfo)
	if err != nil {
		logger.V(4).Info("Cannot read the mount table; the snapshot is crash-consistent", "err", err)
		return "", "", false
	}
	major, minor := int(unix.Major(st.Rdev)), int(unix.Minor(st.Rdev))
	for _, m := range mounts {
		if m.Major == major && m.Minor == minor && m.Root == "/" {
			return m.MountPoint, dev, true
		}
	}
	return "", "", false
}

// thawAbandoned thaws what a controller killed during a clone left frozen
// (the deferred thaw does not run on SIGKILL): the source volumes, mounted
// here, of every snapshot and group snapshot whose record says not ready
// while nobody holds its lock: the call that froze them is gone. It runs
// once, at Start, before the sweep (which removes such records after the
// orphan grace and with them the evidence). FITHAW of a filesystem that is
// not frozen fails with EINVAL and changes nothing; a filesystem frozen
// without such a record (an administrator's fsfreeze) is left alone.
func (s *Server) thawAbandoned(ctx context.Context) {
	if s.freezer == nil {
		return
	}
	for _, name := range s.poolNames {
		p := s.pools[name]
		var sources []string
		if ids, err := p.ListSnapshotIDs(); err == nil {
			for _, id := range ids {
				unlock, err := p.LockSnapshot(id)
				if err != nil {
					continue // busy: a live call owns it
				}
				if snap, err := p.ReadSnapshot(id); err == nil && !snap.ReadyToUse {
					sources = append(sources, snap.SourceVolumeID)
				}
				unlock()
			}
		}
		if ids, err := p.ListGroupIDs(); err == nil {
			for _, id := range ids {
				unlock, err := p.LockGroup(id)
				if err != nil {
					continue
				}
				if g, err := p.ReadGroup(id); err == nil && !g.ReadyToUse {
					sources = append(sources, g.SourceVolumeIDs...)
				}
				unlock()
			}
		}
		for _, src := range sources {
			for _, image := range s.imagesOf(p, src) {
				s.freezer.thaw(ctx, image, src)
			}
		}
	}
}

// imagesOf returns the image paths a frozen source volume src of a snapshot
// taken in pool p may be mounted from: p's (where the volume lived when it
// was frozen, and its snapshot was taken) and the one of the pool it lives
// in now, which its home pool (the one its ID names, any pool of the zone,
// not p) says. The freeze is undone wherever the volume is: a moved
// volume's ID names its home pool, not the pool its image and snapshots are
// in, and a lookup of its image by ID alone missed it.
func (s *Server) imagesOf(p *pool.Pool, src string) []string {
	vid, err := pool.ParseVolumeID(src)
	if err != nil {
		return nil
	}
	images := []string{p.ImagePath(vid)}
	if home := s.pools[vid.Pool]; home != nil {
		if now := home.Resident(vid, s.peer).ImagePath(vid); now != images[0] {
			images = append(images, now)
		}
	}
	return images
}

// freezeSnapshotSource freezes the source v (ID srcID, living in pool p) of
// the snapshot called name, if it is mounted here, after the snapshot's
// record says not ready: that record is what a restarted controller thaws
// by (thawAbandoned), so it is durable before the freeze, and a kill at any
// point after FIFREEZE leaves it. A freeze that fails takes back the record
// it wrote (fresh: there was none before).
func (s *Server) freezeSnapshotSource(ctx context.Context, p *pool.Pool, name string, v *pool.Volume, srcID pool.VolumeID, fresh bool) (thawFunc, error) {
	if err := p.BeginSnapshot(name, v); err != nil {
		return func() {}, err
	}
	thaw, err := s.freezer.freeze(ctx, p.ImagePath(srcID))
	if err != nil && fresh {
		if rmErr := p.DeleteSnapshot(pool.DeriveSnapshotID(p.Name, name)); rmErr != nil {
			klog.FromContext(ctx).Error(rmErr, "Could not remove the record of a snapshot whose source could not be frozen; Sweep removes it later", "snapshot", name)
		}
	}
	return thaw, err
}

// thaw thaws the filesystem on image if it is mounted here and frozen.
func (f *freezer) thaw(ctx context.Context, image, volumeID string) {
	dir, dev, ok := f.mountOf(ctx, image)
	if !ok {
		return
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	logger := klog.FromContext(ctx)
	switch err := unix.IoctlSetInt(fd, ioctlFITHAW, 0); {
	case err == nil:
		logger.Info("Thawed a filesystem that a killed snapshot left frozen", "volumeID", volumeID, "mountPoint", dir, "device", dev)
	case !errors.Is(err, unix.EINVAL):
		logger.Error(err, "A filesystem that a killed snapshot may have left frozen could not be thawed; thaw it with fsfreeze -u", "volumeID", volumeID, "mountPoint", dir, "device", dev)
	}
}

// freezeAt freezes the filesystem mounted at dir. EBUSY means it is frozen
// already (by an administrator or another snapshot of the same volume): it
// is consistent, and the thaw is left to whoever froze it. EOPNOTSUPP means
// the filesystem cannot be frozen.
func freezeAt(ctx context.Context, dir, dev string) (thawFunc, error) {
	logger := klog.FromContext(ctx)
	noop := func() {}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return noop, fmt.Errorf("open %s to freeze it: %w", dir, err)
	}
	err = unix.IoctlSetInt(fd, ioctlFIFREEZE, 0)
	switch {
	case errors.Is(err, unix.EBUSY):
		unix.Close(fd)
		logger.V(2).Info("Filesystem is frozen already; leaving its thaw to whoever froze it", "mountPoint", dir, "device", dev)
		return noop, nil
	case errors.Is(err, unix.EOPNOTSUPP), errors.Is(err, unix.ENOTTY):
		unix.Close(fd)
		logger.V(2).Info("Filesystem cannot be frozen; the snapshot is crash-consistent", "mountPoint", dir, "device", dev)
		return noop, nil
	case err != nil:
		unix.Close(fd)
		return noop, fmt.Errorf("freeze the filesystem at %s (%s): %w", dir, dev, os.NewSyscallError("FIFREEZE", err))
	}
	logger.V(4).Info("Froze filesystem", "mountPoint", dir, "device", dev)
	return func() {
		if err := unix.IoctlSetInt(fd, ioctlFITHAW, 0); err != nil {
			// Nothing the caller can do better than say so loudly:
			// the volume's writers wait until it is thawed.
			logger.Error(err, "Filesystem could not be thawed; thaw it by hand with fsfreeze -u", "mountPoint", dir, "device", dev)
		} else {
			logger.V(4).Info("Thawed filesystem", "mountPoint", dir, "device", dev)
		}
		unix.Close(fd)
	}, nil
}
