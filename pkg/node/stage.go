package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
	mount "k8s.io/mount-utils"

	"github.com/loopvol/loopvol/pkg/loop"
	"github.com/loopvol/loopvol/pkg/pool"
	"github.com/loopvol/loopvol/pkg/volspec"
)

// formatOptions are the mkfs options per filesystem, before mount-utils'
// own (-F -m0 for ext4, -f for xfs).
//
// Never discard: on a loop device a discard punches holes into the image,
// handing back blocks the pool promised to the volume (DESIGN.md: images are
// fallocate'd), and it is slow. mkfs runs only on a blank device, and a blank
// image reads as zeroes (fallocated or sparse; a filesystem volume is never
// made from a raw block one, whose data has no signature), so ext4 is told so
// (assume_storage_prezeroed, e2fsprogs 1.47): it zeroes neither the inode
// tables nor the journal and marks the tables zeroed, so no ext4lazyinit
// thread writes them after the mount. With lazy_itable_init instead, an
// 8 GiB volume wrote 54 MiB in the 20 s after its mount, under the pod's
// first I/O; with assume_storage_prezeroed, nothing.
var formatOptions = map[string][]string{
	volspec.FsExt4: {"-E", "nodiscard,assume_storage_prezeroed=1"},
	volspec.FsXFS:  {"-K"},
}

// stage implements NodeStageVolume.
func (n *node) stage(ctx context.Context, a stageArgs) error {
	logger := klog.FromContext(ctx)
	v, att, err := n.usableVolume(a.id, a.cap)
	if err != nil {
		return err
	}
	readOnly := att.ReadOnly || a.cap.readOnly()
	fsType := a.cap.fsType
	if fsType == "" {
		fsType = v.FsType
	}
	if fsType == "" {
		fsType = volspec.DefaultFsType
	}
	if err := a.cap.mountOpts.forMount(fsType, readOnly); err != nil {
		return err
	}

	var staging *resolved
	var mp mountEntry
	var mounted bool
	if !a.cap.block {
		// Resolved once; everything below acts on the descriptors.
		if staging, err = n.resolve(a.staging, true); err != nil {
			return err
		}
		defer staging.close()
		// Look at the staging path before attaching anything, so that a
		// conflict changes nothing. Mounted from this volume: a repeated
		// call, or a plugin that restarted; done.
		if mp, mounted, err = n.mountAt(staging); err != nil {
			return err
		}
		if mounted {
			dev, ok, err := n.findDevice(a.id)
			if err != nil {
				return err
			}
			if ok && mp.path == staging.path && n.mountedFrom(mp, dev) {
				if _, err := n.recordStaged(a.id, readOnly); err != nil {
					return err
				}
				n.tune(ctx, dev, v)
				logger.V(4).Info("Volume was already staged", "stagingTargetPath", staging.path, "device", dev)
				return n.growAfterStage(ctx, v, dev, staging, readOnly) // a growth that failed before
			}
			// A fenced device of the volume (fenced.go) is cleaned up
			// below; anything else is a conflict.
			if err := n.checkFencedMount(a.id, staging, mp); err != nil {
				return err
			}
		}
	}

	// Recorded before anything is attached (staged.go): from here on a
	// move of the volume is refused until the unstage.
	wrote, err := n.stageFenced(ctx, a.id, readOnly)
	if err != nil {
		return err
	}
	// Staged here before a fence and never unstaged (fenced.go): the
	// staging path may still be mounted from the fenced device, which can
	// no longer be the volume. It goes first, or the stage is refused
	// while it is in use.
	if err := n.cleanUpFencedBeforeStage(ctx, a.id, staging, mp, mounted); err != nil {
		if wrote {
			n.dropStaged(ctx, a.id)
		}
		return err
	}
	dev, err := n.ensureDevice(ctx, a.id, readOnly)
	if err != nil {
		if wrote {
			n.dropStaged(ctx, a.id)
		}
		return err
	}
	n.tune(ctx, dev, v)
	if a.cap.block {
		logger.V(2).Info("Staged block volume", "device", dev, "readOnly", readOnly)
		return nil
	}

	created, err := mkdirTarget(staging)
	if err != nil {
		return err
	}
	start := time.Now()
	if fsType == volspec.FsExt4 {
		if err := n.growExt4BeforeMount(ctx, dev, readOnly); err != nil {
			return fmt.Errorf("volume %s: %w", a.id, err)
		}
	}
	// mount-utils makes the filesystem only when blkid finds the device
	// blank, and checks (fsck) an existing one before mounting it
	// writable; the mount itself is ours, on the resolved directory.
	err = n.formatAndMount(ctx, dev, staging, fsType, a.cap.mountOpts.withDefaults(fsType), readOnly)
	if err == nil {
		err = n.checkMounted(staging, dev)
	}
	if err != nil {
		if created {
			_ = remove(staging, false)
		}
		var me mount.MountError
		if errors.As(err, &me) && (me.Type == mount.UnformattedReadOnly || me.Type == mount.FilesystemMismatch) {
			return volspec.Errorf(errUnusable, "volume %s: %w", a.id, err)
		}
		return fmt.Errorf("volume %s: format and mount %s on %s: %w", a.id, dev, staging.path, err)
	}
	logger.V(2).Info("Staged volume", "device", dev, "stagingTargetPath", staging.path, "fsType", fsType,
		"mountFlags", a.cap.mountOpts.strings(), "readOnly", readOnly, "duration", time.Since(start))
	if err := n.growAfterStage(ctx, v, dev, staging, readOnly); err != nil {
		// Staged, but smaller than the volume: the retry finds it staged
		// and grows it again.
		return fmt.Errorf("volume %s: %w", a.id, err)
	}
	return nil
}

// ensureDevice returns the loop device of the volume's image, attaching the
// image if it has none. A read-only device that is wanted writable (the
// volume was attached read-only before) is attached again, if nothing uses it.
func (n *node) ensureDevice(ctx context.Context, id pool.VolumeID, readOnly bool) (string, error) {
	logger := klog.FromContext(ctx)
	dev, ok, err := n.findDevice(id)
	if err != nil {
		return "", err
	}
	if ok {
		st, err := n.Loop.Status(dev)
		switch {
		case errors.Is(err, loop.ErrNotAttached):
			// detached while we looked: attach anew
		case err != nil:
			return "", fmt.Errorf("volume %s: %w", id, err)
		case !st.ReadOnly || readOnly:
			return dev, nil
		default:
			users, err := n.users(dev)
			if err != nil {
				return "", err
			}
			if len(users) > 0 {
				return "", volspec.Errorf(errInUse, "volume %s: its loop device %s is read-only and in use at %v", id, dev, users)
			}
			if err := n.Loop.Detach(dev); err != nil {
				return "", fmt.Errorf("volume %s: detach read-only device %s: %w", id, dev, err)
			}
			logger.V(2).Info("Detached read-only loop device to attach it writable", "device", dev)
		}
	}
	// The pool opens the image without following symlinks and checks the
	// descriptor (a regular file of the pool's owner, one link): on a
	// shared pool anyone who can write the directory could have put a
	// symlink to a host device or file there. The loop device is bound to
	// that descriptor, never to the path again.
	p := n.residence(id)
	image := p.ImagePath(id)
	mode := os.O_RDWR
	if readOnly {
		mode = os.O_RDONLY
	}
	f, err := p.OpenImage(id, mode)
	switch {
	case errors.Is(err, pool.ErrNotFound):
		return "", volspec.Errorf(pool.ErrCorrupt, "volume %s: its image %s is missing", id, image)
	case err != nil:
		return "", volspec.Errorf(pool.ErrCorrupt, "volume %s: its image %s cannot be used: %v", id, image, err)
	}
	// Read the attachment once more, now that the image is open: a
	// detach that the CO forced (and its fence, pkg/controller/fence.go)
	// may have come since stageFenced's read. Either it is durable now
	// and this refuses, or it comes after this read, so after the open,
	// and the fence's rename replaces the file this device is bound to:
	// this node never attaches the image that replaced it.
	if _, _, _, err := n.attachedVolume(id); err != nil {
		f.Close()
		return "", err
	}
	dev, err = n.Loop.AttachFile(ctx, f, image, readOnly)
	f.Close() // the loop device holds its own reference
	if err != nil {
		return "", fmt.Errorf("volume %s: %w", id, err)
	}
	st, err := n.Loop.Status(dev)
	if err != nil {
		return "", fmt.Errorf("volume %s: %w", id, err)
	}
	if !st.DirectIO {
		logger.Info("Fell back to buffered I/O: the pool's filesystem refused direct I/O", "device", dev, "image", image)
	}
	logger.V(2).Info("Attached loop device", "device", dev, "directIO", st.DirectIO, "readOnly", readOnly)
	return dev, nil
}

// unstage implements NodeUnstageVolume. It needs no volume record, so a
// volume whose record is damaged can still be cleaned up. Only a mount of
// this volume's device (or of a fenced device of it, fenced.go) is
// unmounted, and only an empty directory removed; a staging path that leads
// through a symbolic link or is not a directory holds nothing of this
// volume, and is left alone.
func (n *node) unstage(ctx context.Context, a unstageArgs) error {
	logger := klog.FromContext(ctx)
	dev, found, err := n.findDevice(a.id)
	if err != nil {
		return err
	}
	fenced, err := n.fencedDevices(a.id)
	if err != nil {
		return err
	}
	staging, err := n.resolve(a.staging, false)
	switch {
	case errors.Is(err, errPathMissing), errors.Is(err, errNotOwn):
		staging = nil
	case err != nil:
		return err
	default:
		defer staging.close()
	}
	if staging != nil {
		mp, mounted, err := n.mountAt(staging)
		if err != nil {
			return err
		}
		fencedDev, fencedHere := n.fencedMount(mp, fenced)
		switch {
		case mounted && fencedHere && mp.path == staging.path:
			if err := n.unmountFenced(ctx, a.id, staging, fencedDev); err != nil {
				return err
			}
		case mounted:
			if !found || mp.path != staging.path || !n.mountedFrom(mp, dev) {
				return volspec.Errorf(errInUse, "staging path %s is mounted from %s, not from volume %s: not unmounting it", staging.path, mp.source, a.id)
			}
			// Unmounting the staging path while a pod's bind mount remains
			// would leave the filesystem mounted with nothing to unstage
			// it later.
			if users, err := n.users(dev, staging.path); err != nil {
				return err
			} else if len(users) > 0 {
				return volspec.Errorf(errInUse, "volume %s is still published at %v", a.id, users)
			}
			if err := n.thawBeforeUnmount(ctx, a.id, staging, mp); err != nil {
				return err
			}
			if _, err := n.unmountAll(staging, dev); err != nil {
				return fmt.Errorf("volume %s: %w", a.id, err)
			}
			logger.V(2).Info("Unmounted staging path", "stagingTargetPath", staging.path, "device", dev)
		}
		if staging.isDir() {
			if err := remove(staging, false); err != nil && !errors.Is(err, unix.ENOTEMPTY) && !errors.Is(err, unix.EEXIST) {
				return fmt.Errorf("volume %s: %w", a.id, err)
			}
		}
	}
	stagingPath := a.staging
	if staging != nil {
		stagingPath = staging.path
	}
	if err := n.detachFenced(ctx, a.id, fenced, stagingPath); err != nil {
		return err
	}
	if !found {
		// Nothing attached: what a stage or an unstage that died left
		// of the staged record goes too.
		return n.forgetStaged(ctx, a.id)
	}
	if users, err := n.users(dev); err != nil {
		return err
	} else if len(users) > 0 {
		return volspec.Errorf(errInUse, "volume %s is still in use at %v", a.id, users)
	}
	if err := n.Loop.Detach(dev); err != nil {
		return fmt.Errorf("volume %s: %w", a.id, err)
	}
	logger.V(2).Info("Unstaged volume", "device", dev)
	// Only now, with the device gone, may the volume move (staged.go).
	return n.forgetStaged(ctx, a.id)
}
