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

	"github.com/loopvol/loopvol/pkg/pool"
)

// node is the unlocked implementation of the Node service; Server locks.
type node struct {
	Config
	kubeletDir  string // cleaned
	kubeletReal string // with symbolic links resolved
	pools       map[string]*pool.Pool
}

// volume reads the record of a volume. A missing record is NOT_FOUND.
func (n *node) volume(id pool.VolumeID) (*pool.Pool, *pool.Volume, error) {
	p := n.pools[id.Pool]
	v, err := p.ReadVolume(id)
	if err != nil {
		return nil, nil, err
	}
	return p, v, nil
}

// attachedVolume reads the record of a volume and checks that it is attached
// to this node: this is the fence that keeps a single-node volume of a shared
// pool from being used by two nodes at once.
func (n *node) attachedVolume(id pool.VolumeID) (*pool.Pool, *pool.Volume, pool.Attachment, error) {
	p, v, err := n.volume(id)
	if err != nil {
		return nil, nil, pool.Attachment{}, err
	}
	att, ok := v.AttachedTo(n.NodeID)
	if !ok {
		return nil, nil, pool.Attachment{}, kindf(errNotAttached, "volume %s is not attached to node %s (ControllerPublishVolume first)", id, n.NodeID)
	}
	return p, v, att, nil
}

// usableVolume is attachedVolume plus checkAccessType: the volume is attached
// here and the request uses it the way it was made.
func (n *node) usableVolume(id pool.VolumeID, c capability) (*pool.Volume, pool.Attachment, error) {
	_, v, att, err := n.attachedVolume(id)
	if err != nil {
		return nil, att, err
	}
	if err := checkAccessType(v, c); err != nil {
		return nil, att, err
	}
	return v, att, nil
}

// checkAccessType checks that a request uses the volume the way it was made.
func checkAccessType(v *pool.Volume, c capability) error {
	if c.block != (v.AccessType == pool.AccessBlock) {
		want := "mount"
		if c.block {
			want = "block"
		}
		return kindf(errInvalid, "volume %s has access type %s, the request asks for %s", v.ID, v.AccessType, want)
	}
	if !c.block && c.fsType != "" && v.FsType != "" && c.fsType != v.FsType {
		return kindf(errInvalid, "volume %s has filesystem %s, the request asks for %s", v.ID, v.FsType, c.fsType)
	}
	return nil
}

// findDevice returns the loop device of a volume's image, if it has one.
func (n *node) findDevice(id pool.VolumeID) (string, bool, error) {
	dev, ok, err := n.Loop.Find(n.pools[id.Pool].ImagePath(id))
	if err != nil {
		return "", false, fmt.Errorf("find loop device of volume %s: %w", id, err)
	}
	return dev, ok, nil
}

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
// Only mounts under the kubelet directory and mounts that name dev are
// looked at: a bind mount of a device node elsewhere is not ours to judge,
// and stat on unrelated mounts (a hung NFS server) could block.
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
		if mp.Device != dev && !strings.HasPrefix(mp.Device, "/dev/") && !strings.HasPrefix(mp.Path, n.kubeletDir+"/") {
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
