package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestNodeImageStagesVolumes runs, in a chroot of the node image set up as
// deploy/kubernetes/base/node.yaml runs the node plugin (read-only root,
// the host's /dev, /proc, writable kubelet and pool directories), the
// commands that staging, expanding and unstaging an ext4 and an XFS volume
// run, in the order mount-utils and pkg/node run them, on real loop
// devices: probe the blank device, format, probe again, check, mount, grow
// the device and the mounted filesystem, unmount, and grow an unmounted
// ext4 the way pkg/node does before mounting it.
func TestNodeImageStagesVolumes(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("loop devices and mounts need root")
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skipf("no loop devices: %v", err)
	}
	losetup, err := exec.LookPath("losetup")
	if err != nil {
		t.Skip("no losetup on the machine to attach the test's images")
	}
	root := nodeRootfs(t)
	paths := nodePaths(t, root)
	const kubeletDir, poolDir = "/var/lib/kubelet", "/var/lib/loopvol/pools/default"
	for _, d := range []string{kubeletDir, poolDir} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	kubelet, pool := t.TempDir(), t.TempDir()

	mount := func(src, dst, fstype string, flags uintptr) {
		t.Helper()
		if err := unix.Mount(src, dst, fstype, flags, ""); err != nil {
			t.Fatalf("mount %s on %s: %v", src, dst, err)
		}
		if flags&unix.MS_REMOUNT != 0 {
			return
		}
		t.Cleanup(func() {
			if err := unix.Unmount(dst, unix.MNT_DETACH); err != nil {
				t.Errorf("unmount %s: %v", dst, err)
			}
		})
	}
	mount(root, root, "", unix.MS_BIND)
	mount("", root, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY)
	mount("/dev", filepath.Join(root, "dev"), "", unix.MS_BIND)
	mount("proc", filepath.Join(root, "proc"), "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC)
	mount(kubelet, filepath.Join(root, kubeletDir), "", unix.MS_BIND)
	mount(pool, filepath.Join(root, poolDir), "", unix.MS_BIND)
	if err := os.WriteFile(filepath.Join(root, "probe"), nil, 0o644); !errors.Is(err, unix.EROFS) {
		t.Fatalf("the image's root is writable: %v", err)
	}

	run := func(t *testing.T, name string, args ...string) (string, int) {
		t.Helper()
		out, err := chrootRun(root, paths[name], name, args...)
		var ee *exec.ExitError
		switch {
		case err == nil:
			return out, 0
		case errors.As(err, &ee):
			return out, ee.ExitCode()
		}
		t.Fatalf("%s: %v", name, err)
		return "", 0
	}
	must := func(t *testing.T, name string, args ...string) string {
		t.Helper()
		out, code := run(t, name, args...)
		if code != 0 {
			t.Fatalf("%s %s in the image: exit %d: %s", name, strings.Join(args, " "), code, out)
		}
		return out
	}
	host := func(t *testing.T, args ...string) string {
		t.Helper()
		out, err := exec.Command(losetup, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("losetup %s: %v: %s", strings.Join(args, " "), err, out)
		}
		return strings.TrimSpace(string(out))
	}
	attach := func(t *testing.T, name string, size int64) (dev, file string) {
		t.Helper()
		file = filepath.Join(pool, name)
		f, err := os.Create(file)
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Truncate(size); err != nil {
			t.Fatal(err)
		}
		f.Close()
		dev = host(t, "--find", "--show", file)
		t.Cleanup(func() { host(t, "--detach", dev) })
		return dev, file
	}
	grow := func(t *testing.T, dev, file string, size int64) {
		t.Helper()
		if err := os.Truncate(file, size); err != nil {
			t.Fatal(err)
		}
		host(t, "--set-capacity", dev)
	}
	stage := func(t *testing.T, name string) string {
		t.Helper()
		dir := filepath.Join(kubelet, name)
		if err := os.Mkdir(dir, 0o750); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			// Unmounted by the test unless it failed half way.
			if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
				t.Errorf("unmount %s: %v", dir, err)
			}
		})
		return kubeletDir + "/" + name
	}

	t.Run("ext4", func(t *testing.T) {
		dev, file := attach(t, "ext4.img", 64<<20)
		target := stage(t, "ext4")
		// blkid exits 2 when it finds nothing: mount-utils formats then.
		if out, code := run(t, "blkid", "-p", "-s", "TYPE", "-s", "PTTYPE", "-o", "export", dev); code != 2 {
			t.Fatalf("blkid on a blank device: exit %d: %s", code, out)
		}
		must(t, "mkfs.ext4", "-F", "-m0", "-E", "nodiscard,lazy_itable_init=1,lazy_journal_init=1", dev)
		if out := must(t, "blkid", "-p", "-s", "TYPE", "-s", "PTTYPE", "-o", "export", dev); !strings.Contains(out, "TYPE=ext4") {
			t.Fatalf("blkid after mkfs.ext4: %q", out)
		}
		must(t, "fsck", "-a", dev)
		must(t, "mount", "-t", "ext4", "-o", "defaults", dev, target)
		if out := must(t, "blockdev", "--getro", dev); strings.TrimSpace(out) != "0" {
			t.Errorf("blockdev --getro: %q", out)
		}
		grow(t, dev, file, 96<<20)
		if out := must(t, "blockdev", "--getsize64", dev); strings.TrimSpace(out) != "100663296" {
			t.Errorf("blockdev --getsize64 after growing: %q", out)
		}
		// Growing a mounted ext4 takes CAP_SYS_RESOURCE, which a privileged
		// container has; some sandboxes that run this test drop it.
		if hasCapability(t, unix.CAP_SYS_RESOURCE) {
			if out := must(t, "resize2fs", dev); !strings.Contains(out, "is now 98304 (1k) blocks long") {
				t.Errorf("online resize2fs: %q", out)
			}
		} else {
			t.Log("No CAP_SYS_RESOURCE here: online resize2fs not tried")
		}
		must(t, "umount", target)
		// Grown while not staged: pkg/node checks and grows before mounting.
		// (mke2fs makes 1 KiB blocks on a device this small.)
		grow(t, dev, file, 128<<20)
		if out, code := run(t, "e2fsck", "-f", "-p", dev); code > 1 {
			t.Fatalf("e2fsck -f -p: exit %d: %s", code, out)
		}
		if out := must(t, "resize2fs", dev); !strings.Contains(out, "is now 131072 (1k) blocks long") {
			t.Errorf("offline resize2fs: %q", out)
		}
		must(t, "mount", "-t", "ext4", "-o", "ro", dev, target)
		must(t, "umount", target)
	})

	t.Run("xfs", func(t *testing.T) {
		dev, file := attach(t, "xfs.img", 320<<20)
		target := stage(t, "xfs")
		must(t, "mkfs.xfs", "-f", "-K", dev)
		if out := must(t, "blkid", "-p", "-s", "TYPE", "-s", "PTTYPE", "-o", "export", dev); !strings.Contains(out, "TYPE=xfs") {
			t.Fatalf("blkid after mkfs.xfs: %q", out)
		}
		must(t, "fsck", "-a", dev)
		must(t, "mount", "-t", "xfs", "-o", "defaults", dev, target)
		grow(t, dev, file, 400<<20)
		if out := must(t, "xfs_growfs", target); !strings.Contains(out, "data blocks changed from 81920 to 102400") {
			t.Errorf("xfs_growfs: %q", out)
		}
		must(t, "umount", target)
	})
}

// hasCapability tells whether the process has capability c in its
// effective set.
func hasCapability(t *testing.T, c int) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "CapEff:"); ok {
			caps, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil {
				t.Fatal(err)
			}
			return caps&(1<<c) != 0
		}
	}
	t.Fatal("no CapEff in /proc/self/status")
	return false
}
