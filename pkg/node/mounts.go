package node

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
	mount "k8s.io/mount-utils"
	utilexec "k8s.io/utils/exec"
)

// mountAt returns the mount on top of path, if path is a mount point.
func (n *node) mountAt(path string) (mount.MountPoint, bool, error) {
	mps, err := n.Mounter.List()
	if err != nil {
		return mount.MountPoint{}, false, fmt.Errorf("list mounts: %w", err)
	}
	var top mount.MountPoint
	found := false
	for _, mp := range mps {
		if mp.Path == path {
			top, found = mp, true // later entries are mounted over earlier ones
		}
	}
	return top, found, nil
}

// mountedFrom reports whether mp is a mount of device dev: a filesystem on it
// (the mount table names the device, perhaps by another node path) or a bind
// mount of the device node itself (raw block), which the mount table shows
// as a devtmpfs mount.
func (n *node) mountedFrom(mp mount.MountPoint, dev string) bool {
	if mp.Device == dev {
		return true
	}
	want, err := rdev(dev)
	if err != nil {
		return false
	}
	if strings.HasPrefix(mp.Device, "/dev/") {
		if got, err := rdev(mp.Device); err == nil && got == want {
			return true
		}
	}
	if mp.Type == "devtmpfs" {
		if got, err := rdev(mp.Path); err == nil && got == want {
			return true
		}
	}
	return false
}

// users lists the mount points that use device dev, except those in skip.
// Looked at: mounts under the kubelet directory, mounts that name a device,
// and bind mounts of device nodes (devtmpfs) anywhere on the host, since
// detaching a loop device that something still has bind-mounted would turn
// that mount into a dead node. Other mounts are skipped: stat on them (a hung
// NFS server) could block.
func (n *node) users(dev string, skip ...string) ([]string, error) {
	mps, err := n.Mounter.List()
	if err != nil {
		return nil, fmt.Errorf("list mounts: %w", err)
	}
	var paths []string
next:
	for _, mp := range mps {
		for _, s := range skip {
			if mp.Path == s {
				continue next
			}
		}
		if mp.Device != dev && !strings.HasPrefix(mp.Device, "/dev/") && mp.Type != "devtmpfs" && !strings.HasPrefix(mp.Path, n.kubeletDir+"/") {
			continue
		}
		if n.mountedFrom(mp, dev) {
			paths = append(paths, mp.Path)
		}
	}
	return paths, nil
}

// rdev returns the device number of a block device node.
func rdev(path string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFBLK {
		return 0, fmt.Errorf("%s is not a block device", path)
	}
	return st.Rdev, nil
}

// cleanup unmounts path if it is a mount point and removes it (directory or,
// for raw block, file). A path that does not exist is not an error.
func (n *node) cleanup(path string) error {
	if err := mount.CleanupMountPoint(path, n.Mounter, true); err != nil {
		return fmt.Errorf("unmount %s: %w", path, err)
	}
	// CleanupMountPoint removes directories; a raw-block target is a file.
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", path, err)
	}
	return nil
}

// mkdir makes a staging or target directory (and its parents, all under the
// kubelet directory: the path was checked).
func mkdir(path string) error {
	if err := os.MkdirAll(path, 0o750); err != nil {
		return fmt.Errorf("create %s: %w", path, err)
	}
	return nil
}

// mkfile makes the file a raw-block volume is bind-mounted onto.
func mkfile(path string) error {
	if err := mkdir(filepath.Dir(path)); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDONLY, 0o640)
	if err != nil {
		return fmt.Errorf("create %s: %w", path, err)
	}
	return f.Close()
}

// ctxExec runs every command under the request's context, so that a caller
// that gives up (kubelet's timeout) also stops a long mkfs or resize.
type ctxExec struct {
	utilexec.Interface
	ctx context.Context
}

// Command runs cmd under the context.
func (e ctxExec) Command(cmd string, args ...string) utilexec.Cmd {
	return e.Interface.CommandContext(e.ctx, cmd, args...)
}

// withContext returns the mounter with its commands bound to ctx.
func (n *node) withContext(ctx context.Context) *mount.SafeFormatAndMount {
	return &mount.SafeFormatAndMount{Interface: n.Mounter.Interface, Exec: ctxExec{Interface: n.Mounter.Exec, ctx: ctx}}
}

// bindMount bind-mounts source on target with mount(2), read-only if asked.
// mount-utils runs mount(8) twice for a bind mount (bind, then a remount),
// about 2 ms each, most of NodePublishVolume's time; with no mount flags to
// translate, two system calls do the same. Mount flags still go through
// mount-utils, which parses them.
func bindMount(source, target string, readOnly bool) error {
	if err := unix.Mount(source, target, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind mount %s on %s: %w", source, target, err)
	}
	if !readOnly {
		return nil
	}
	if err := unix.Mount("", target, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		unix.Unmount(target, 0)
		return fmt.Errorf("remount %s read-only: %w", target, err)
	}
	return nil
}
