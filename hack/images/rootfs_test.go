package main

import (
	"archive/tar"
	"bufio"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// testLayers keeps the layers the tests build, for the package's tests to
// share.
var testLayers string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "loopvol-images-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	testLayers = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// testBuilder builds from the machine's apt sources, with the .debs cached
// where make images keeps them (or in $LOOPVOL_IMAGES_CACHE), and layers in
// testLayers.
func testBuilder(t *testing.T) *builder {
	t.Helper()
	for _, tool := range []string{"apt-cache", "apt-get", "apt-config"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("no %s: the node image is made of Debian packages", tool)
		}
	}
	cache := os.Getenv("LOOPVOL_IMAGES_CACHE")
	if cache == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			t.Fatal(err)
		}
		cache = filepath.Join(home, ".cache", "loopvol")
	}
	return &builder{
		apt:     &apt{cacheDir: filepath.Join(cache, "debs"), resolvedDir: filepath.Join(cache, "resolved"), log: t.Logf},
		layers:  &layerCache{dir: testLayers},
		created: time.Unix(0, 0),
		version: "test",
		log:     t.Logf,
	}
}

func recipeNamed(t *testing.T, name string) recipe {
	t.Helper()
	for _, r := range recipes {
		if r.name == name {
			return r
		}
	}
	t.Fatalf("no recipe %s", name)
	return recipe{}
}

// nodeRootfs builds the node image's files layer and unpacks it.
func nodeRootfs(t *testing.T) string {
	t.Helper()
	b := testBuilder(t)
	l, _, err := b.filesLayer(recipeNamed(t, "loopvol-node"))
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	if err := unpack(l.path, root); err != nil {
		t.Fatal(err)
	}
	return root
}

// unpack extracts a gzip-compressed layer into dir, as a container runtime
// would (without whiteouts, which these layers never have).
func unpack(layer, dir string) error {
	zr, err := openGzip(layer)
	if err != nil {
		return err
	}
	defer zr.Close()
	tr := tar.NewReader(bufio.NewReader(zr))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if strings.HasPrefix(h.Name, "/") || strings.Contains("/"+h.Name+"/", "/../") {
			return fmt.Errorf("unsafe path %q", h.Name)
		}
		p := filepath.Join(dir, h.Name)
		if _, err := os.Lstat(filepath.Dir(p)); err != nil {
			return fmt.Errorf("%s: parent directory missing from the layer: %w", h.Name, err)
		}
		mode := fileMode(h.Mode)
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.Mkdir(p, 0o755); err != nil && !os.IsExist(err) {
				return err
			}
			defer os.Chmod(p, mode)
		case tar.TypeReg:
			f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, mode)
			if err != nil {
				return err
			}
			_, err = io.Copy(f, tr)
			f.Close()
			if err != nil {
				return err
			}
			if err := os.Chmod(p, mode); err != nil {
				return err
			}
		case tar.TypeSymlink:
			if err := os.Symlink(h.Linkname, p); err != nil {
				return err
			}
		case tar.TypeLink:
			if err := os.Link(filepath.Join(dir, h.Linkname), p); err != nil {
				return err
			}
		default:
			return fmt.Errorf("%s: unexpected entry type %q", h.Name, h.Typeflag)
		}
	}
}

// fileMode converts a tar header's Unix mode.
func fileMode(m int64) os.FileMode {
	mode := os.FileMode(m).Perm()
	for bit, fm := range map[int64]os.FileMode{0o1000: os.ModeSticky, 0o2000: os.ModeSetgid, 0o4000: os.ModeSetuid} {
		if m&bit != 0 {
			mode |= fm
		}
	}
	return mode
}

// inRoot resolves an absolute path of the image to a path under root,
// following symlinks as the kernel would in a chroot (absolute links start
// again at root, .. stops at root).
func inRoot(root, p string) (string, error) {
	parts := strings.Split(strings.Trim(path.Clean("/"+p), "/"), "/")
	cur := ""
	for hops := 0; len(parts) > 0; {
		name := parts[0]
		parts = parts[1:]
		switch name {
		case "", ".":
			continue
		case "..":
			cur = path.Dir(cur)
			if cur == "." {
				cur = ""
			}
			continue
		}
		next := path.Join(cur, name)
		st, err := os.Lstat(filepath.Join(root, next))
		if err != nil {
			return "", err
		}
		if st.Mode()&os.ModeSymlink == 0 {
			cur = next
			continue
		}
		if hops++; hops > 40 {
			return "", fmt.Errorf("%s: too many symlinks", p)
		}
		target, err := os.Readlink(filepath.Join(root, next))
		if err != nil {
			return "", err
		}
		if strings.HasPrefix(target, "/") {
			cur = ""
		}
		parts = append(strings.Split(target, "/"), parts...)
	}
	return filepath.Join(root, cur), nil
}

// lookPath finds a command in the image's PATH and returns its path in the
// image.
func lookPath(root, name string) (string, error) {
	for _, dir := range []string{"/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"} {
		p := path.Join(dir, name)
		host, err := inRoot(root, p)
		if err != nil {
			continue
		}
		if st, err := os.Stat(host); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s: not in the image's PATH", name)
}

// libDirs are the directories the image's dynamic linker searches without
// an ld.so.cache (the image has none: ldconfig never ran): its multiarch
// directories (etc/ld.so.conf.d names them) and /lib, /usr/lib.
func libDirs(t *testing.T, root string) []string {
	t.Helper()
	confs, err := filepath.Glob(filepath.Join(root, "etc/ld.so.conf.d/*.conf"))
	if err != nil || len(confs) == 0 {
		t.Fatalf("no etc/ld.so.conf.d/*.conf in the image (libc6 ships it): %v", err)
	}
	var dirs []string
	for _, c := range confs {
		b, err := os.ReadFile(c)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(string(b), "\n") {
			if l = strings.TrimSpace(l); strings.HasPrefix(l, "/") {
				dirs = append(dirs, l)
			}
		}
	}
	return append(dirs, "/lib", "/usr/lib")
}

// closure checks that the program at p (a path in the image) can start in
// the image: a script's interpreter, an ELF binary's interpreter and every
// shared library it needs, recursively, are there. It returns what it
// looked at, to report.
func closure(root, p string, dirs []string, seen map[string]bool) error {
	if seen[p] {
		return nil
	}
	seen[p] = true
	host, err := inRoot(root, p)
	if err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	head := make([]byte, 256)
	f, err := os.Open(host)
	if err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	n, _ := io.ReadFull(f, head)
	f.Close()
	head = head[:n]
	if line, ok := strings.CutPrefix(string(head), "#!"); ok {
		line, _, _ = strings.Cut(line, "\n")
		fields := strings.Fields(line)
		if len(fields) == 0 {
			return fmt.Errorf("%s: empty #! line", p)
		}
		if err := closure(root, fields[0], dirs, seen); err != nil {
			return fmt.Errorf("%s (script): %w", p, err)
		}
		return nil
	}
	ef, err := elf.Open(host)
	if err != nil {
		return fmt.Errorf("%s: neither a script nor ELF: %w", p, err)
	}
	defer ef.Close()
	for _, prog := range ef.Progs {
		if prog.Type != elf.PT_INTERP {
			continue
		}
		b, err := io.ReadAll(prog.Open())
		if err != nil {
			return fmt.Errorf("%s: PT_INTERP: %w", p, err)
		}
		interp := strings.TrimRight(string(b), "\x00")
		if err := closure(root, interp, dirs, seen); err != nil {
			return fmt.Errorf("%s: interpreter: %w", p, err)
		}
	}
	needed, err := ef.ImportedLibraries()
	if err != nil {
		return fmt.Errorf("%s: DT_NEEDED: %w", p, err)
	}
	search := dirs
	for _, tag := range []elf.DynTag{elf.DT_RUNPATH, elf.DT_RPATH} {
		vals, _ := ef.DynString(tag)
		for _, v := range vals {
			for _, d := range strings.Split(v, ":") {
				search = append([]string{strings.ReplaceAll(d, "$ORIGIN", path.Dir(p))}, search...)
			}
		}
	}
	for _, lib := range needed {
		found := ""
		for _, d := range search {
			if _, err := inRoot(root, path.Join(d, lib)); err == nil {
				found = path.Join(d, lib)
				break
			}
		}
		if found == "" {
			return fmt.Errorf("%s needs %s, which is in none of %v", p, lib, search)
		}
		if err := closure(root, found, dirs, seen); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
	}
	return nil
}

// chrootRun runs the program at p (a path in the image) in a chroot of
// root, with the image's PATH, and returns what it printed.
func chrootRun(root, p, name string, args ...string) (string, error) {
	cmd := &exec.Cmd{
		Path:        p,
		Args:        append([]string{name}, args...),
		Env:         []string{debianPath},
		Dir:         "/",
		SysProcAttr: &syscall.SysProcAttr{Chroot: root},
	}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// nodePaths finds each of nodeCommands in the image.
func nodePaths(t *testing.T, root string) map[string]string {
	t.Helper()
	paths := map[string]string{}
	for _, c := range nodeCommands {
		p, err := lookPath(root, c)
		if err != nil {
			t.Fatal(err)
		}
		paths[c] = p
	}
	return paths
}

// TestNodeImageRunsTheNodeCommands builds the node image's root filesystem
// from the packages and checks that every program the node plugin runs is
// in its PATH and can start there: its interpreter and all the shared
// libraries it needs resolve inside the image. As root, it also runs them
// in a chroot of the image: each prints its version, and the filesystem
// tools make, check, grow and identify real ext4 and XFS filesystems in
// image files.
func TestNodeImageRunsTheNodeCommands(t *testing.T) {
	root := nodeRootfs(t)
	dirs := libDirs(t, root)
	paths := map[string]string{}
	for _, c := range nodeCommands {
		p, err := lookPath(root, c)
		if err != nil {
			t.Errorf("%v", err)
			continue
		}
		paths[c] = p
		seen := map[string]bool{}
		if err := closure(root, p, dirs, seen); err != nil {
			t.Errorf("%s cannot start in the image: %v", c, err)
			continue
		}
		t.Logf("%s: %s, %d files", c, p, len(seen))
	}
	if t.Failed() {
		return
	}
	// The image holds only what the packages ship and the recipe adds:
	// no documentation but copyright files, a root-only passwd.
	if docs, _ := filepath.Glob(filepath.Join(root, "usr/share/doc/*/*")); len(docs) == 0 {
		t.Errorf("no copyright files in usr/share/doc")
	} else {
		for _, d := range docs {
			if filepath.Base(d) != "copyright" {
				t.Errorf("documentation left in the image: %s", d)
			}
		}
	}
	for _, d := range []string{"usr/share/man", "usr/share/locale"} {
		if _, err := os.Stat(filepath.Join(root, d)); err == nil {
			t.Errorf("%s is in the image", d)
		}
	}
	for _, d := range mergedUsr {
		if target, err := os.Readlink(filepath.Join(root, d)); err != nil || target != "usr/"+d {
			t.Errorf("/%s is not a link to usr/%s: %q, %v", d, d, target, err)
		}
	}

	if os.Geteuid() != 0 {
		t.Skip("running the commands in a chroot of the image needs root")
	}
	// What a container runtime gives every container: /dev/null (e2fsck
	// and mke2fs open it) and /proc (e2fsck and resize2fs read the mounts
	// through /etc/mtab).
	if err := unix.Mknod(filepath.Join(root, "dev/null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("proc", filepath.Join(root, "proc"), "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(filepath.Join(root, "proc"), unix.MNT_DETACH); err != nil {
			t.Errorf("unmount the chroot's /proc: %v", err)
		}
	})
	run := func(name string, args ...string) string {
		t.Helper()
		out, err := chrootRun(root, paths[name], name, args...)
		if err != nil {
			t.Fatalf("%s %s in the image: %v: %s", name, strings.Join(args, " "), err, out)
		}
		return out
	}
	for _, c := range [][]string{
		{"mount", "-V"}, {"umount", "-V"}, {"blkid", "-V"}, {"blockdev", "-V"}, {"fsck", "-V"},
		{"mkfs.ext4", "-V"}, {"mkfs.xfs", "-V"}, {"e2fsck", "-V"}, {"xfs_growfs", "-V"},
	} {
		out := run(c[0], c[1:]...)
		t.Logf("%s: %s", strings.Join(c, " "), firstLine(out))
	}

	// Real filesystems in image files: what staging and expanding a volume
	// runs, but for mount (which needs a loop device).
	mkImage := func(name string, size int64) string {
		f, err := os.Create(filepath.Join(root, name))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if err := f.Truncate(size); err != nil {
			t.Fatal(err)
		}
		return "/" + name
	}
	ext4 := mkImage("ext4.img", 64<<20)
	run("mkfs.ext4", "-F", "-m0", "-q", "-E", "nodiscard,lazy_itable_init=1,lazy_journal_init=1", ext4)
	if out := run("blkid", "-p", "-s", "TYPE", "-s", "PTTYPE", "-o", "export", ext4); !strings.Contains(out, "TYPE=ext4") {
		t.Errorf("blkid on ext4: %q", out)
	}
	run("fsck", "-a", ext4) // through fsck.ext4
	if err := os.Truncate(filepath.Join(root, ext4), 128<<20); err != nil {
		t.Fatal(err)
	}
	run("e2fsck", "-f", "-p", ext4)
	if out := run("resize2fs", ext4); !strings.Contains(out, "is now") {
		t.Errorf("resize2fs: %q", out)
	}
	xfs := mkImage("xfs.img", 320<<20)
	run("mkfs.xfs", "-f", "-K", "-q", xfs)
	if out := run("blkid", "-p", "-s", "TYPE", "-o", "export", xfs); !strings.Contains(out, "TYPE=xfs") {
		t.Errorf("blkid on xfs: %q", out)
	}
	run("fsck", "-a", xfs) // through fsck.xfs, a shell script
}
