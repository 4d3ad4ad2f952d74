package node

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/loopvol/loopvol/pkg/pool"
	"github.com/loopvol/loopvol/pkg/volspec"
	"github.com/loopvol/loopvol/pkg/volspec/volspectest"
)

// TestUnpublishLeavesWhatIsNotItsOwn: NodeUnpublishVolume with a target
// that is a symbolic link (to another volume's mount inside the kubelet
// directory, or through a linked parent), a plain file, or a directory with
// something in it unmounts nothing and removes nothing; a volume unknown
// here is NOT_FOUND; a target that is gone is success.
func TestUnpublishLeavesWhatIsNotItsOwn(t *testing.T) {
	f := newFixture(t)
	a := f.volume("a", pool.AccessMount, "", pool.Attachment{Node: testNode})
	b := f.volume("b", pool.AccessMount, "", pool.Attachment{Node: testNode})
	_, pubA := f.stageAndPublish(a, volspectest.Mount("", snw), "a")
	f.stageAndPublish(b, volspectest.Mount("", snw), "b")

	link := f.path("pods", "link")
	if err := os.Symlink(pubA.TargetPath, link); err != nil {
		t.Fatal(err)
	}
	linkedParent := f.path("linked")
	if err := os.Symlink(f.path("pods"), linkedParent); err != nil {
		t.Fatal(err)
	}
	file := f.path("pods", "file")
	if err := os.WriteFile(file, []byte("precious"), 0o600); err != nil {
		t.Fatal(err)
	}
	full := f.path("pods", "full")
	if err := os.MkdirAll(filepath.Join(full, "data"), 0o750); err != nil {
		t.Fatal(err)
	}
	unpublish := func(id pool.VolumeID, target string) error {
		_, err := f.srv.NodeUnpublishVolume(f.ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id.String(), TargetPath: target})
		return err
	}
	for _, tc := range []struct {
		name   string
		id     pool.VolumeID
		target string
		want   codes.Code
	}{
		{name: "symlink to volume a's mount, as volume b → OK, untouched", id: b, target: link, want: codes.OK},
		{name: "symlink to volume a's mount, as volume a → OK, untouched", id: a, target: link, want: codes.OK},
		{name: "through a linked parent → OK, untouched", id: a, target: filepath.Join(linkedParent, "a"), want: codes.OK},
		{name: "plain file → OK, untouched", id: a, target: file, want: codes.OK},
		{name: "directory with content → OK, untouched", id: a, target: full, want: codes.OK},
		{name: "gone → OK", id: a, target: f.path("pods", "never", "there"), want: codes.OK},
		{name: "unknown volume → not found", id: pool.DeriveVolumeID("p1", "never-created"), target: pubA.TargetPath, want: codes.NotFound},
		{name: "volume b's mount as volume a → failed precondition", id: a, target: f.path("pods", "b"), want: codes.FailedPrecondition},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantCode(t, unpublish(tc.id, tc.target), tc.want)
		})
	}
	if n := len(f.mountsAt(pubA.TargetPath)); n != 1 {
		t.Errorf("volume a has %d mounts at its target, want its 1", n)
	}
	if n := len(f.mountsAt(f.path("pods", "b"))); n != 1 {
		t.Errorf("volume b has %d mounts at its target, want its 1", n)
	}
	for _, l := range []string{link, linkedParent} {
		if fi, err := os.Lstat(l); err != nil || fi.Mode()&os.ModeSymlink == 0 {
			t.Errorf("symlink %s was changed: %v, %v", l, fi, err)
		}
	}
	if data, err := os.ReadFile(file); err != nil || string(data) != "precious" {
		t.Errorf("plain file: %q, %v", data, err)
	}
	if _, err := os.Stat(filepath.Join(full, "data")); err != nil {
		t.Errorf("directory content removed: %v", err)
	}
	for _, a := range f.mounter.GetLog() {
		if a.Action == "unmount" {
			t.Errorf("something was unmounted: %+v", a)
		}
	}
	// Its own target goes, mount and directory.
	if err := unpublish(a, pubA.TargetPath); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(pubA.TargetPath); !os.IsNotExist(err) {
		t.Errorf("own target still there: %v", err)
	}
}

// TestReadOnlyCannotBeUndoneByAFlag: whether a mount is read-only is
// decided by readonly, the access mode and the attachment; rw with any of
// them is INVALID_ARGUMENT, ro without them too, and nothing is mounted.
func TestReadOnlyCannotBeUndoneByAFlag(t *testing.T) {
	f := newFixture(t)
	rw := f.volume("rw", pool.AccessMount, "", pool.Attachment{Node: testNode})
	roAtt := f.volume("ro-attachment", pool.AccessMount, "", pool.Attachment{Node: testNode, ReadOnly: true})
	f.exec.formatted["/dev/loop0"] = "ext4"
	stage, _ := f.stageAndPublish(rw, volspectest.Mount("", snw), "first")
	mountsBefore := len(f.mounter.GetLog())

	publish := func(id pool.VolumeID, c *csi.VolumeCapability, target string, readonly bool) error {
		req := f.publishReq(id, c, target)
		req.StagingTargetPath = stage.StagingTargetPath
		req.Readonly = readonly
		_, err := f.srv.NodePublishVolume(f.ctx, req)
		return err
	}
	for _, tc := range []struct {
		name string
		err  error
	}{
		{name: "readonly publish with rw", err: publish(rw, volspectest.Mount("", snw, "rw"), "p1", true)},
		{name: "readonly publish with rw after ro", err: publish(rw, volspectest.Mount("", snw, "ro", "rw"), "p2", true)},
		{name: "reader-only mode with rw", err: publish(rw, volspectest.Mount("", mnro, "noatime", "rw"), "p3", false)},
		{name: "writable publish with ro", err: publish(rw, volspectest.Mount("", snw, "ro"), "p4", false)},
		{name: "read-only attachment staged with rw", err: func() error {
			_, err := f.srv.NodeStageVolume(f.ctx, f.stageReq(roAtt, volspectest.Mount("", snw, "rw")))
			return err
		}()},
	} {
		t.Run(tc.name, func(t *testing.T) { wantCode(t, tc.err, codes.InvalidArgument) })
	}
	if log := f.mounter.GetLog(); len(log) != mountsBefore {
		t.Errorf("refused requests mounted: %+v", log[mountsBefore:])
	}
	// ro with a read-only publish is accepted, and the mount is read-only.
	if err := publish(rw, volspectest.Mount("", snw, "ro", "noatime"), "p5", true); err != nil {
		t.Fatal(err)
	}
	if mps := f.mountsAt(f.path("pods", "p5")); len(mps) != 1 || !slices.Contains(mps[0].Opts, "ro") {
		t.Errorf("target mounts = %+v, want read-only", mps)
	}
}

// TestMountFlagsAllowlist: flags outside the allowlist, or of the wrong
// filesystem, or with a value not accepted, are INVALID_ARGUMENT naming the
// flag, before anything is attached or mounted.
func TestMountFlagsAllowlist(t *testing.T) {
	f := newFixture(t)
	e4 := f.volume("e4", pool.AccessMount, "ext4", pool.Attachment{Node: testNode})
	x := f.volume("x", pool.AccessMount, "xfs", pool.Attachment{Node: testNode})
	for _, tc := range []struct {
		id   pool.VolumeID
		flag string
	}{
		{id: e4, flag: "loop"},
		{id: e4, flag: "X-mount.subdir=data"},
		{id: e4, flag: "X-mount.mkdir"},
		{id: e4, flag: "x-systemd.automount"},
		{id: e4, flag: "bind"},
		{id: e4, flag: "rbind"},
		{id: e4, flag: "remount"},
		{id: e4, flag: "move"},
		{id: e4, flag: "shared"},
		{id: e4, flag: "offset=4096"},
		{id: e4, flag: "sizelimit=1048576"},
		{id: e4, flag: "errors=panic"},
		{id: e4, flag: "norecovery"},
		{id: e4, flag: "noload"},
		{id: e4, flag: "journal_dev=7:1"},
		{id: e4, flag: "dax"},
		{id: e4, flag: "nofail"},
		{id: e4, flag: "user"},
		{id: e4, flag: "commit=soon"},
		{id: e4, flag: "data=unordered"},
		{id: e4, flag: "noatime=1"},
		{id: e4, flag: "context"},
		{id: e4, flag: `context=a"b`},
		{id: e4, flag: "logbufs=8"},
		{id: x, flag: "data=writeback"},
		{id: x, flag: "nobarrier"},
		{id: x, flag: "logdev=/dev/sda"},
	} {
		t.Run(tc.flag, func(t *testing.T) {
			_, err := f.srv.NodeStageVolume(f.ctx, f.stageReq(tc.id, volspectest.Mount("", snw, "noatime", tc.flag)))
			wantCode(t, err, codes.InvalidArgument)
			if msg := status.Convert(err).Message(); !strings.Contains(msg, strconv.Quote(tc.flag)) {
				t.Errorf("message %q does not name %q", msg, tc.flag)
			}
		})
	}
	if len(f.loop.Attached()) != 0 || len(f.mounter.GetLog()) != 0 {
		t.Errorf("refused flags reached the system: loop %v, mounts %+v", f.loop.Attached(), f.mounter.GetLog())
	}
	// What is accepted reaches the mount as given.
	accepted := []string{"noatime", "nodev", "nosuid", "noexec", "lazytime", "data=ordered", "commit=30", "errors=remount-ro", `context="system_u:object_r:container_file_t:s0:c1,c2"`}
	if _, err := f.srv.NodeStageVolume(f.ctx, f.stageReq(e4, volspectest.Mount("", snw, accepted...))); err != nil {
		t.Fatalf("NodeStageVolume with %v: %v", accepted, err)
	}
	mps := f.mountsAt(f.stageReq(e4, nil).StagingTargetPath)
	if len(mps) != 1 {
		t.Fatalf("staging mounts = %+v", mps)
	}
	for _, o := range accepted {
		if !slices.Contains(mps[0].Opts, o) {
			t.Errorf("staging mount options %v lack %s", mps[0].Opts, o)
		}
	}
}

// TestMountOptionTranslation: the mount(2) flags, the bind attributes and
// the data string built from options; read-only always wins.
func TestMountOptionTranslation(t *testing.T) {
	o, err := parseMountFlags([]string{"noatime", "nosuid", "nodev", "sync", "strictatime", "suid", "data=journal", `context="a:b:c:s0:c1,c2"`})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := o.msFlags(false), uintptr(unix.MS_NODEV|unix.MS_SYNCHRONOUS|unix.MS_STRICTATIME); got != want {
		t.Errorf("msFlags = %#x, want %#x", got, want)
	}
	if o.msFlags(true)&unix.MS_RDONLY == 0 {
		t.Error("msFlags(readOnly) lacks MS_RDONLY")
	}
	set, clr := o.mountAttrs(true)
	if set != unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_STRICTATIME|unix.MOUNT_ATTR_RDONLY || clr != unix.MOUNT_ATTR__ATIME|unix.MOUNT_ATTR_NOSUID {
		t.Errorf("mountAttrs = set %#x clr %#x", set, clr)
	}
	if got, want := o.data(), `data=journal,context="a:b:c:s0:c1,c2"`; got != want {
		t.Errorf("data = %q, want %q", got, want)
	}
}

// TestMountDefaults: every xfs mount gets nouuid once (a clone shares its
// source's UUID), other filesystems nothing; the caller's slice is not
// changed.
func TestMountDefaults(t *testing.T) {
	o, err := parseMountFlags([]string{"noatime"})
	if err != nil {
		t.Fatal(err)
	}
	if got := o.withDefaults(volspec.FsXFS).data(); got != "nouuid" {
		t.Errorf("xfs data = %q, want nouuid", got)
	}
	if got := o.withDefaults(volspec.FsXFS).strings(); !slices.Equal(got, []string{"noatime", "nouuid"}) {
		t.Errorf("xfs options = %v", got)
	}
	if len(o) != 1 {
		t.Errorf("withDefaults changed its receiver: %v", o.strings())
	}
	given, err := parseMountFlags([]string{"nouuid"})
	if err != nil {
		t.Fatal(err)
	}
	if got := given.withDefaults(volspec.FsXFS).strings(); !slices.Equal(got, []string{"nouuid"}) {
		t.Errorf("xfs options with nouuid given = %v", got)
	}
	if got := o.withDefaults(volspec.FsExt4).strings(); !slices.Equal(got, []string{"noatime"}) {
		t.Errorf("ext4 options = %v", got)
	}
}

// TestMountOptionsDocumented: docs/mount-options.md lists exactly the
// allowlist, and what it says is refused is refused.
func TestMountOptionsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/mount-options.md")
	if err != nil {
		t.Fatal(err)
	}
	accepted, refused, ok := strings.Cut(string(doc), "## Refused on purpose")
	if !ok {
		t.Fatal("docs/mount-options.md has no section of refused options")
	}
	var listed []string
	for _, line := range strings.Split(accepted, "\n") {
		if rest, ok := strings.CutPrefix(line, "| `"); ok {
			name, _, _ := strings.Cut(rest, "`")
			listed = append(listed, strings.TrimSuffix(name, "…"))
		}
	}
	for name := range allowedOptions {
		if !slices.Contains(listed, name) {
			t.Errorf("docs/mount-options.md does not list %s", name)
		}
	}
	for _, name := range listed {
		if _, ok := allowedOptions[name]; !ok {
			t.Errorf("docs/mount-options.md lists %s, which is not accepted", name)
		}
	}
	for _, line := range strings.Split(refused, "\n") {
		first, _, _ := strings.Cut(strings.TrimPrefix(line, "|"), "|")
		if !strings.HasPrefix(line, "| `") || strings.Contains(first, "on xfs") {
			continue
		}
		for i, tok := range strings.Split(first, "`") {
			if i%2 == 0 || strings.Contains(tok, "*") {
				continue
			}
			if strings.HasSuffix(tok, "=") {
				tok += "1"
			}
			if _, err := parseMountFlags([]string{tok}); err == nil {
				t.Errorf("docs/mount-options.md says %s is refused, but it is accepted", tok)
			}
		}
	}
}

// FuzzMountFlags: whatever flag is accepted is in the allowlist, is one
// option, can never make a mount a bind, a remount or a move, and can never
// clear read-only.
func FuzzMountFlags(f *testing.F) {
	for _, seed := range []string{"noatime", "rw", "ro", "discard", "nodiscard", "loop", "X-mount.subdir=x", "bind", "remount",
		`context="system_u:object_r:container_file_t:s0:c1,c2"`, `context="a,b`, "commit=5", "commit=", "data=journal,discard",
		"errors=panic", "logbsize=256k", "=", "", "\x00", `"`, "noatime\x00discard", "defaults"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, flag string) {
		o, err := parseMountFlags([]string{flag})
		if err != nil {
			if !errors.Is(err, volspec.ErrInvalid) {
				t.Fatalf("parseMountFlags(%q) = %v, not INVALID_ARGUMENT", flag, err)
			}
			return
		}
		if len(o) != 1 || !singleMountOption(flag) {
			t.Fatalf("accepted %q as %v", flag, o)
		}
		if _, ok := allowedOptions[o[0].name]; !ok {
			t.Fatalf("accepted %q under the unknown name %q", flag, o[0].name)
		}
		const forbidden = unix.MS_BIND | unix.MS_REMOUNT | unix.MS_MOVE | unix.MS_REC | unix.MS_SHARED | unix.MS_PRIVATE | unix.MS_SLAVE | unix.MS_UNBINDABLE
		if fl := o.msFlags(true); fl&forbidden != 0 || fl&unix.MS_RDONLY == 0 {
			t.Fatalf("%q gives mount flags %#x", flag, fl)
		}
		if set, clr := o.mountAttrs(true); set&unix.MOUNT_ATTR_RDONLY == 0 || clr&unix.MOUNT_ATTR_RDONLY != 0 {
			t.Fatalf("%q clears read-only on a bind (set %#x, clr %#x)", flag, set, clr)
		}
		if err := o.forMount("", true); err == nil && o[0].name == "rw" {
			t.Fatalf("rw accepted on a read-only mount")
		}
		if d := o.data(); strings.Contains(d, "loop") {
			t.Fatalf("%q passes %q to the filesystem", flag, d)
		}
	})
}

// FuzzResolve: any path below the kubelet directory, made of names that
// may collide with symbolic links placed inside it (one to outside, one to
// a sibling), resolves to something whose real location is below the
// kubelet directory, at its canonical path, or is refused; nothing is ever
// created outside; with openat2 and with the walk that replaces it. The
// seeds run with the normal tests.
func FuzzResolve(f *testing.F) {
	for _, seed := range []string{"a", "a/b/c", "out", "out/x", "sib/x", "a/out/x", "dir/file", "dir/file/x", "a//b", "./a", "a/..", "..",
		"dir/link", "dir/link/x", strings.Repeat("d/", 40) + "x"} {
		f.Add(seed, true, false)
		f.Add(seed, false, true)
	}
	kubelet := filepath.Join(f.TempDir(), "kubelet")
	outside := filepath.Join(f.TempDir(), "outside")
	for _, d := range []string{kubelet + "/dir", kubelet + "/sibling", outside} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			f.Fatal(err)
		}
	}
	for link, to := range map[string]string{kubelet + "/out": outside, kubelet + "/sib": kubelet + "/sibling", kubelet + "/dir/link": outside} {
		if err := os.Symlink(to, link); err != nil {
			f.Fatal(err)
		}
	}
	if err := os.WriteFile(kubelet+"/dir/file", nil, 0o600); err != nil {
		f.Fatal(err)
	}
	n := &node{kubeletDir: kubelet, kubeletReal: kubelet}
	f.Fuzz(func(t *testing.T, rel string, create, fallback bool) {
		// fallback takes the O_NOFOLLOW walk that kernels without openat2 get.
		noOpenat2.Store(fallback)
		defer noOpenat2.Store(false)
		p, err := n.lexicalPath("path", kubelet+"/"+rel)
		if err != nil {
			return
		}
		r, err := n.resolve(p, create)
		if err != nil {
			if !errors.Is(err, errNotOwn) && !errors.Is(err, errPathMissing) && !errors.Is(err, unix.ENAMETOOLONG) {
				t.Fatalf("resolve(%q) = %v", p, err)
			}
		} else {
			defer r.close()
			if r.path != p || !strings.HasPrefix(r.path, kubelet+"/") {
				t.Fatalf("resolve(%q) gave the canonical path %q", p, r.path)
			}
			where, err := os.Readlink(procFd(r.parent))
			if err != nil || where+"/"+r.name != p {
				t.Fatalf("resolve(%q): the parent is at %q (%v)", p, where, err)
			}
			if r.exists() {
				if where, err := os.Readlink(r.proc()); err != nil || where != p {
					t.Fatalf("resolve(%q): the object is at %q (%v)", p, where, err)
				}
			}
		}
		if entries, _ := os.ReadDir(outside); len(entries) != 0 {
			t.Fatalf("resolve(%q, %t) created %v outside", p, create, entries)
		}
	})
}
