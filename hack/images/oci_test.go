package main

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

// controllerBuilder builds with stand-in binaries: the controller image
// needs no packages.
func controllerBuilder(t *testing.T) *builder {
	t.Helper()
	bin := t.TempDir()
	for _, name := range []string{"driver", "attacher"} {
		if err := os.WriteFile(filepath.Join(bin, name), []byte("binary "+name), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cache := t.TempDir()
	return &builder{
		apt:     &apt{cacheDir: filepath.Join(cache, "debs"), resolvedDir: filepath.Join(cache, "resolved"), log: t.Logf},
		layers:  &layerCache{dir: filepath.Join(cache, "layers")},
		binDir:  bin,
		created: time.Unix(1700000000, 0).UTC(),
		version: "v1.2.3",
		log:     t.Logf,
	}
}

// flatten lists the image's files: path → type, mode, owner and content.
func flatten(t *testing.T, img v1.Image) map[string]string {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	files := map[string]string{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		c, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[h.Name] = string(h.Typeflag) + " " + os.FileMode(h.Mode).String() + " " + strconv.Itoa(h.Uid) + ":" + strconv.Itoa(h.Gid) + " " + string(c)
	}
}

// TestControllerImage builds the controller image and reads it back from
// the OCI layout and the archive that make images writes.
func TestControllerImage(t *testing.T) {
	b := controllerBuilder(t)
	img, err := b.image(recipeNamed(t, "loopvol-controller"))
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	dir := filepath.Join(out, "loopvol-controller")
	refs := []string{"localhost/loopvol/loopvol-controller:v1.2.3", "localhost/loopvol/loopvol-controller:dev"}
	wrote, err := writeOCI(dir, index(img, refs))
	if err != nil || !wrote {
		t.Fatalf("writeOCI: %v, %v", wrote, err)
	}

	// The layout: one manifest, named twice, for containerd and OCI tools.
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	digest, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	var names []map[string]string
	for _, d := range im.Manifests {
		if d.Digest != digest {
			t.Errorf("index names %s, built %s", d.Digest, digest)
		}
		if d.Platform == nil || d.Platform.OS != "linux" || d.Platform.Architecture == "" {
			t.Errorf("descriptor platform %+v", d.Platform)
		}
		names = append(names, d.Annotations)
	}
	wantNames := []map[string]string{
		{annotationContainerdName: refs[0], annotationRefName: "v1.2.3"},
		{annotationContainerdName: refs[1], annotationRefName: "dev"},
	}
	if !reflect.DeepEqual(names, wantNames) {
		t.Errorf("annotations %v, want %v", names, wantNames)
	}
	got, err := idx.Image(digest)
	if err != nil {
		t.Fatal(err)
	}

	cf, err := got.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.Config.User != "65532:65532" || !reflect.DeepEqual(cf.Config.Entrypoint, []string{"/driver"}) ||
		cf.Config.Labels["org.opencontainers.image.version"] != "v1.2.3" || !cf.Created.Time.Equal(b.created) || cf.OS != "linux" {
		t.Errorf("config: %+v, created %v, os %s", cf.Config, cf.Created, cf.OS)
	}
	passwd, err := rootfs.ReadFile("rootfs/controller/etc/passwd")
	if err != nil {
		t.Fatal(err)
	}
	group, err := rootfs.ReadFile("rootfs/controller/etc/group")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(passwd), ":65532:65532:") {
		t.Errorf("passwd has no user 65532: %q", passwd)
	}
	wantFiles := map[string]string{
		"etc":        "5 -rwxr-xr-x 0:0 ", // mode bits only
		"etc/passwd": "0 -rw-r--r-- 0:0 " + string(passwd),
		"etc/group":  "0 -rw-r--r-- 0:0 " + string(group),
		"driver":     "0 -rwxr-xr-x 0:0 binary driver",
		"attacher":   "0 -rwxr-xr-x 0:0 binary attacher",
	}
	if files := flatten(t, got); !reflect.DeepEqual(files, wantFiles) {
		t.Errorf("files %q, want %q", files, wantFiles)
	}

	// The archive holds the layout, every blob the index needs.
	archive := readTar(t, dir+".tar")
	var entries []string
	for name := range archive {
		entries = append(entries, name)
	}
	sort.Strings(entries)
	want := []string{"blobs/", "blobs/sha256/", "index.json", "oci-layout"}
	manifest, _ := got.Manifest()
	for _, d := range append([]v1.Descriptor{manifest.Config}, manifest.Layers...) {
		want = append(want, "blobs/sha256/"+d.Digest.Hex)
	}
	want = append(want, "blobs/sha256/"+digest.Hex)
	sort.Strings(want)
	if !reflect.DeepEqual(entries, want) {
		t.Errorf("archive entries %q, want %q", entries, want)
	}
	layoutIndex, err := os.ReadFile(filepath.Join(dir, "index.json"))
	if err != nil {
		t.Fatal(err)
	}
	if archive["index.json"] != string(layoutIndex) {
		t.Errorf("the archive's index.json differs from the layout's")
	}

	// A rerun with nothing changed writes nothing and builds nothing.
	st, err := os.Stat(dir + ".tar")
	if err != nil {
		t.Fatal(err)
	}
	again, err := b.image(recipeNamed(t, "loopvol-controller"))
	if err != nil {
		t.Fatal(err)
	}
	if d, _ := again.Digest(); d != digest {
		t.Errorf("rebuilt image %s, first %s: not reproducible", d, digest)
	}
	if wrote, err := writeOCI(dir, index(again, refs)); err != nil || wrote {
		t.Errorf("rerun writeOCI: wrote %v, %v", wrote, err)
	}
	if st2, err := os.Stat(dir + ".tar"); err != nil || !st2.ModTime().Equal(st.ModTime()) {
		t.Errorf("rerun rewrote the archive")
	}

	// A new binary: a new image; the old blobs leave the layout.
	if err := os.WriteFile(filepath.Join(b.binDir, "attacher"), []byte("binary attacher 2"), 0o755); err != nil {
		t.Fatal(err)
	}
	img2, err := b.image(recipeNamed(t, "loopvol-controller"))
	if err != nil {
		t.Fatal(err)
	}
	if wrote, err := writeOCI(dir, index(img2, refs)); err != nil || !wrote {
		t.Fatalf("writeOCI after a change: wrote %v, %v", wrote, err)
	}
	blobs, err := os.ReadDir(filepath.Join(dir, "blobs", "sha256"))
	if err != nil {
		t.Fatal(err)
	}
	if len(blobs) != 4 { // manifest, config, two layers
		var names []string
		for _, e := range blobs {
			names = append(names, e.Name())
		}
		t.Errorf("layout blobs after a rebuild: %q, want the new image's 4", names)
	}
	if _, err := os.Stat(filepath.Join(dir, "blobs", "sha256", digest.Hex)); !os.IsNotExist(err) {
		t.Errorf("the old manifest is still in the layout: %v", err)
	}
}

func readTar(t *testing.T, file string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(bytes.NewReader(b))
	out := map[string]string{}
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
		out[h.Name] = string(c)
	}
}
