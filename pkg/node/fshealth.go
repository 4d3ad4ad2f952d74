package node

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"

	"github.com/loopvol/loopvol/pkg/pool"
)

// Reasons of the health entries this file adds to NodeGetVolumeHealth.
const (
	reasonImageTruncated      = "ImageTruncated"
	reasonBackingFileReplaced = "BackingFileReplaced"
	reasonFilesystemErrors    = "FilesystemErrors"
	reasonFilesystemShutdown  = "FilesystemShutdown"
)

// sysExt4 is where the kernel describes ext4 filesystems; tests of the
// parsing point it elsewhere.
var sysExt4 = "/sys/fs/ext4"

// addFunc adds one health entry (health's add).
type addFunc func(status csi.VolumeHealthErrorType, reason, format string, args ...any)

// deepHealth adds to NodeGetVolumeHealth what needs more than the record
// and the mount table: an image shorter than the volume, a loop device
// still serving an image that was replaced, and errors the filesystem on
// the device recorded (ext4) or a filesystem that shut itself down (xfs).
// Each message says what happened and what to do. It never fails the
// call: what it cannot read, it does not report.
//
// eio says that a path of the volume could not even be looked at (EIO):
// its filesystem shut down. replaced is a device of this node still serving
// a file that was the image and was replaced by someone else than a fence
// (health tells; a fence has its own entry), "" for none.
func (n *node) deepHealth(a healthArgs, v *pool.Volume, dev string, found, eio bool, replaced string, add addFunc) {
	p := n.residence(a.id)
	image := p.ImagePath(a.id)
	var st unix.Stat_t
	imageErr := unix.Stat(image, &st)
	if imageErr == nil && v != nil && st.Size < v.SizeBytes {
		add(csi.VolumeHealthErrorType_DATA_LOSS, reasonImageTruncated,
			"the image %s of volume %s holds %d bytes, the volume is %d: it was truncated outside loopvol and the data past %d bytes is gone; restore the volume from a snapshot",
			image, a.id, st.Size, v.SizeBytes, st.Size)
	}
	if !found && imageErr == nil && replaced != "" {
		add(csi.VolumeHealthErrorType_DATA_LOSS, reasonBackingFileReplaced,
			"loop device %s still serves a deleted file that was at %s, and another file is there now: whatever is written to the volume goes to the deleted file and is lost when the device is detached. "+
				"Stop the volume's Pods and copy the deleted file back from the device (dd if=%s) before unstaging", replaced, image, replaced)
	}
	if !found || (v != nil && v.AccessType == pool.AccessBlock) {
		return
	}
	name := filepath.Base(dev)
	if count, ok := readInt(filepath.Join(sysExt4, name, "errors_count")); ok && count > 0 {
		first, _ := os.ReadFile(filepath.Join(sysExt4, name, "first_error_func"))
		add(csi.VolumeHealthErrorType_DEGRADED, reasonFilesystemErrors,
			"the ext4 filesystem of volume %s on %s has recorded %d errors (the first in %s; dmesg has the details): some data may be damaged. Unstage the volume and run e2fsck -f on its image %s",
			a.id, dev, count, strings.TrimSpace(string(first)), image)
	}
	for _, path := range []string{a.staging, a.publish} {
		if eio || path == "" {
			continue
		}
		if shut, ok := n.shutdown(path, dev); ok {
			eio = shut
			break
		}
	}
	if eio {
		add(csi.VolumeHealthErrorType_INACCESSIBLE, reasonFilesystemShutdown,
			"the filesystem of volume %s on %s has shut down after an error (dmesg says which) and refuses all I/O: unstage the volume, run xfs_repair (or e2fsck -f) on its image %s, then stage it again",
			a.id, dev, image)
	}
}

// shutdown reports whether the filesystem of dev mounted at path has shut
// down (xfs after a metadata error, ext4 after an abort): syncfs then
// fails with EIO, where a healthy filesystem writes back and succeeds. ok
// is false when path holds no mount of dev.
func (n *node) shutdown(path, dev string) (shut, ok bool) {
	mp, mounted, r, err := n.mountAtPath(path)
	if err != nil {
		return false, false
	}
	defer r.close()
	if !mounted || !n.mountedFrom(mp, dev) {
		return false, false
	}
	fd, err := unix.Open(r.proc(), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return errors.Is(err, unix.EIO), true
	}
	defer unix.Close(fd)
	return errors.Is(unix.Syncfs(fd), unix.EIO), true
}

func readInt(path string) (int64, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return v, err == nil
}
