package cluster

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// holdSysfs gives the network namespace this process runs in a read-write
// sysfs for as long as the returned file is open, and must run before the
// namespace's first pod.
//
// Why: the kernel keeps one sysfs superblock per network namespace, made
// by the first mount of sysfs there, and every later mount shares it; a
// read-only first mount makes the superblock read-only for all (the later
// mount's own rw flag does not help). On a real node the host's /sys made
// it, read-write. In a namespace InNetNS made, the first mount would be a
// pod's: a hostNetwork pod that is not privileged gets a read-only /sys,
// and then the node plugin's writes to its loop devices' queue attributes
// failed with EROFS ("Loop device left untuned"). A mount here, made first,
// makes the superblock read-write; the later read-only mounts are
// read-only on their own. The mount is detached at once (nothing to undo
// after a crash): the open directory keeps it, and so the superblock, alive.
func holdSysfs(dir string) (*os.File, error) {
	mnt := filepath.Join(dir, "sysfs")
	if err := os.MkdirAll(mnt, 0o700); err != nil {
		return nil, err
	}
	defer os.Remove(mnt)
	if err := unix.Mount("sysfs", mnt, "sysfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return nil, fmt.Errorf("mount sysfs on %s: %w", mnt, err)
	}
	f, err := os.Open(mnt)
	if uerr := unix.Unmount(mnt, unix.MNT_DETACH); uerr != nil && err == nil {
		f.Close()
		return nil, fmt.Errorf("detach %s: %w", mnt, uerr)
	}
	if err != nil {
		return nil, err
	}
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &st); err != nil {
		f.Close()
		return nil, err
	}
	if st.Flags&unix.ST_RDONLY != 0 {
		// Something mounted sysfs read-only in this namespace first.
		f.Close()
		return nil, fmt.Errorf("this network namespace's sysfs is read-only already")
	}
	return f, nil
}
