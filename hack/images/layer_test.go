package main

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"reflect"
	"strings"
	"testing"
)

func TestCanonical(t *testing.T) {
	for in, want := range map[string]string{
		"./":                     "",
		"./bin/":                 "usr/bin",
		"./bin/mount":            "usr/bin/mount",
		"./sbin/mkfs.ext4":       "usr/sbin/mkfs.ext4",
		"./lib/x86_64-linux-gnu": "usr/lib/x86_64-linux-gnu",
		"./lib64/ld.so":          "usr/lib64/ld.so",
		"./usr/bin/chattr":       "usr/bin/chattr",
		"/etc/passwd":            "etc/passwd",
		"./libexec/x":            "libexec/x",
		"./binx/y":               "binx/y",
	} {
		if got := canonical(in); got != want {
			t.Errorf("canonical(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestSkipped(t *testing.T) {
	for name, want := range map[string]bool{
		"usr/share/doc":                     false,
		"usr/share/doc/dash":                false,
		"usr/share/doc/dash/copyright":      false,
		"usr/share/doc/dash/changelog.gz":   true,
		"usr/share/doc/dash/examples/x":     true,
		"usr/share/man":                     true,
		"usr/share/man/man8/mount.8.gz":     true,
		"usr/share/locale/de/LC_MESSAGES/x": true,
		"usr/share/info/dir":                true,
		"usr/share/lintian/overrides/x":     true,
		"usr/share/mandoc":                  false,
		"etc/mke2fs.conf":                   false,
	} {
		if got := skipped(name); got != want {
			t.Errorf("skipped(%q) = %v, want %v", name, got, want)
		}
	}
}

// entry is one tar entry in a test's terms.
type entry struct {
	typ      byte
	name     string
	link     string
	content  string
	mode     int64
	uid, gid int
}

func (e entry) String() string {
	return fmt.Sprintf("%c %s %s %q %o %d:%d", e.typ, e.name, e.link, e.content, e.mode, e.uid, e.gid)
}

func readEntries(t *testing.T, b []byte) []entry {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader(b))
	var out []entry
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		c, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, entry{h.Typeflag, h.Name, h.Linkname, string(c), h.Mode, h.Uid, h.Gid})
	}
}

func TestLayerWriter(t *testing.T) {
	reg := func(name, content string) *tar.Header {
		return &tar.Header{Typeflag: tar.TypeReg, Name: name, Size: int64(len(content)), Mode: 0o755}
	}
	for _, tc := range []struct {
		name     string
		add      []*tar.Header // each regular file's content is its name
		want     []entry
		overlaps []string
		err      string
	}{
		{
			name: "merged /usr, parents first, each path once",
			add: []*tar.Header{
				{Typeflag: tar.TypeDir, Name: "./", Mode: 0o755},
				{Typeflag: tar.TypeDir, Name: "./bin/", Mode: 0o755},
				reg("./bin/mount", "./bin/mount"),
				{Typeflag: tar.TypeDir, Name: "./usr/", Mode: 0o755},
				{Typeflag: tar.TypeDir, Name: "./usr/bin/", Mode: 0o755},
				{Typeflag: tar.TypeSymlink, Name: "./sbin/fsck.ext4", Linkname: "e2fsck"},
				{Typeflag: tar.TypeLink, Name: "./usr/bin/mount2", Linkname: "./bin/mount"},
				reg("./usr/share/doc/x/changelog", "./usr/share/doc/x/changelog"),
				reg("./usr/share/doc/x/copyright", "./usr/share/doc/x/copyright"),
			},
			want: []entry{
				{typ: tar.TypeDir, name: "usr/", mode: 0o755},
				{typ: tar.TypeDir, name: "usr/bin/", mode: 0o755},
				{typ: tar.TypeReg, name: "usr/bin/mount", content: "./bin/mount", mode: 0o755},
				{typ: tar.TypeDir, name: "usr/sbin/", mode: 0o755},
				{typ: tar.TypeSymlink, name: "usr/sbin/fsck.ext4", link: "e2fsck"},
				{typ: tar.TypeLink, name: "usr/bin/mount2", link: "usr/bin/mount"},
				{typ: tar.TypeDir, name: "usr/share/", mode: 0o755},
				{typ: tar.TypeDir, name: "usr/share/doc/", mode: 0o755},
				{typ: tar.TypeDir, name: "usr/share/doc/x/", mode: 0o755},
				{typ: tar.TypeReg, name: "usr/share/doc/x/copyright", content: "./usr/share/doc/x/copyright", mode: 0o755},
			},
		},
		{
			name: "the root's links into /usr stay at the root",
			add: []*tar.Header{
				{Typeflag: tar.TypeSymlink, Name: "bin", Linkname: "usr/bin"},
				{Typeflag: tar.TypeDir, Name: "./bin/", Mode: 0o755},
				reg("./bin/sh", "./bin/sh"),
			},
			want: []entry{
				{typ: tar.TypeSymlink, name: "bin", link: "usr/bin"},
				{typ: tar.TypeDir, name: "usr/", mode: 0o755},
				{typ: tar.TypeDir, name: "usr/bin/", mode: 0o755},
				{typ: tar.TypeReg, name: "usr/bin/sh", content: "./bin/sh", mode: 0o755},
			},
		},
		{
			name: "a file shipped twice keeps the first",
			add: []*tar.Header{
				reg("./etc/a", "./etc/a"),
				reg("etc/a", "etc/a"),
			},
			want: []entry{
				{typ: tar.TypeDir, name: "etc/", mode: 0o755},
				{typ: tar.TypeReg, name: "etc/a", content: "./etc/a", mode: 0o755},
			},
			overlaps: []string{"etc/a (test, test)"},
		},
		{
			name: "a hard link to a file the layer lacks",
			add:  []*tar.Header{{Typeflag: tar.TypeLink, Name: "./a", Linkname: "./usr/share/doc/x/NEWS"}},
			err:  "hard link a to usr/share/doc/x/NEWS, which the layer lacks",
		},
		{
			name: "nothing under a symlink",
			add: []*tar.Header{
				{Typeflag: tar.TypeSymlink, Name: "var/run", Linkname: "/run"},
				reg("./var/run/x.pid", "x"),
			},
			err: "var/run/x.pid is under var/run, a symlink in the layer",
		},
		{
			name: "a directory of its own mode after its content",
			add: []*tar.Header{
				reg("./tmp/x", "./tmp/x"),
				{Typeflag: tar.TypeDir, Name: "./tmp/", Mode: 0o1777},
			},
			err: "directory tmp (mode 1777, owner 0:0) comes after what it holds",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			w := newLayerWriter(&buf)
			var err error
			for _, h := range tc.add {
				if err = w.add(h, strings.NewReader(h.Name), "test"); err != nil {
					break
				}
			}
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one with %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := w.close(); err != nil {
				t.Fatal(err)
			}
			if got := readEntries(t, buf.Bytes()); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("entries:\n%v\nwant:\n%v", got, tc.want)
			}
			if !reflect.DeepEqual(w.overlaps, tc.overlaps) {
				t.Errorf("overlaps %q, want %q", w.overlaps, tc.overlaps)
			}
		})
	}
}
