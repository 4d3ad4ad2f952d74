package main

import (
	"archive/tar"
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// layerFormat names the way layers are written in cache keys, so that a
// changed tool never reuses layers an older one wrote: the tool's own
// executable, hashed once.
var layerFormat = sync.OnceValue(func() string {
	exe, err := os.Executable()
	if err == nil {
		if sum, err := fileSHA256(exe); err == nil {
			return sum
		}
	}
	return "unknown"
})

// fileTime is the mtime of the files the recipes make: fixed, so that a
// layer stays the same (and cached) from one commit to the next.
var fileTime = time.Unix(0, 0).UTC()

// builder builds images from recipes.
type builder struct {
	apt     *apt
	layers  *layerCache
	binDir  string    // the static binaries
	created time.Time // the images' creation time
	version string    // org.opencontainers.image.version
	log     func(format string, args ...any)
}

// image builds the image of r.
func (b *builder) image(r recipe) (v1.Image, error) {
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	files, what, err := b.filesLayer(r)
	if err != nil {
		return nil, err
	}
	bins, err := b.binariesLayer(r)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, p := range r.binaries {
		names = append(names, p.dst)
	}
	for _, l := range []struct {
		layer *cachedLayer
		by    string
	}{
		{files, what},
		{bins, "loopvol binaries " + strings.Join(names, " ")},
	} {
		if l.layer == nil {
			continue
		}
		img, err = mutate.Append(img, mutate.Addendum{
			Layer:     layerOf(l.layer),
			MediaType: types.OCILayer,
			History:   v1.History{Created: v1.Time{Time: b.created}, CreatedBy: l.by, Comment: "hack/images"},
		})
		if err != nil {
			return nil, err
		}
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS = "linux"
	cf.Architecture = runtime.GOARCH
	cf.Created = v1.Time{Time: b.created}
	cf.Config.Entrypoint = r.entrypoint
	cf.Config.Cmd = r.cmd
	cf.Config.User = r.user
	cf.Config.Env = r.base.env
	cf.Config.WorkingDir = "/"
	cf.Config.Labels = map[string]string{"org.opencontainers.image.version": b.version}
	return mutate.ConfigFile(img, cf)
}

// filesLayer builds the layer of everything but the binaries: the Debian
// packages and the recipe's files. It returns nil if the recipe has none,
// and a line for the image's history.
func (b *builder) filesLayer(r recipe) (*cachedLayer, string, error) {
	roots := append(append([]string(nil), r.base.packages...), r.packages...)
	var pkgs []*debPackage
	if len(roots) > 0 {
		b.log("%s: resolve %s", r.name, strings.Join(roots, " "))
		var err error
		if pkgs, err = b.apt.resolveCached(roots); err != nil {
			return nil, "", err
		}
		b.log("%s: %d packages", r.name, len(pkgs))
	}
	trees := []string{r.base.tree, r.tree}

	key := sha256.New()
	fmt.Fprintf(key, "%s\n", layerFormat())
	for _, p := range pkgs {
		fmt.Fprintf(key, "deb %s %s %s\n", p.Name, p.Version, p.SHA256)
	}
	for _, l := range sortedKeys(r.base.symlinks) {
		fmt.Fprintf(key, "symlink %s %s\n", l, r.base.symlinks[l])
	}
	for _, t := range trees {
		if err := hashTree(key, t); err != nil {
			return nil, "", err
		}
	}
	if len(pkgs) == 0 && r.base.tree == "" && r.tree == "" && len(r.base.symlinks) == 0 {
		return nil, "", nil
	}
	var names []string
	for _, p := range pkgs {
		names = append(names, p.Name+"="+p.Version)
	}
	what := "recipe files"
	if len(names) > 0 {
		what = "debian packages " + strings.Join(names, " ")
	}

	l, built, err := b.layers.get(r.name+"-files-", hex.EncodeToString(key.Sum(nil))[:32], func(w *layerWriter) error {
		debs, err := b.apt.fetch(pkgs)
		if err != nil {
			return err
		}
		if len(pkgs) > 0 {
			for _, d := range mergedUsr {
				if err := w.add(&tar.Header{Typeflag: tar.TypeSymlink, Name: d, Linkname: "usr/" + d, Mode: 0o777, ModTime: fileTime}, nil, "merged /usr"); err != nil {
					return err
				}
			}
		}
		for _, t := range trees {
			if err := b.addTree(w, t); err != nil {
				return err
			}
		}
		for _, l := range sortedKeys(r.base.symlinks) {
			h := &tar.Header{Typeflag: tar.TypeSymlink, Name: l, Linkname: r.base.symlinks[l], Mode: 0o777, ModTime: fileTime}
			if err := w.add(h, nil, "recipe"); err != nil {
				return err
			}
		}
		for i, p := range pkgs {
			b.log("%s: unpack %s %s", r.name, p.Name, p.Version)
			if err := w.addDeb(debs[i], p.Name); err != nil {
				return err
			}
		}
		// Which packages the image holds, where scanners look in images
		// without dpkg's database (one control file per package).
		for _, p := range pkgs {
			control := statusRecord(p)
			h := &tar.Header{Typeflag: tar.TypeReg, Name: "var/lib/dpkg/status.d/" + p.Name, Size: int64(len(control)), Mode: 0o644, ModTime: fileTime}
			if err := w.add(h, strings.NewReader(control), "recipe"); err != nil {
				return err
			}
		}
		for _, o := range w.overlaps {
			b.log("%s: shipped twice, kept the first: %s", r.name, o)
		}
		return nil
	})
	if err != nil {
		return nil, "", err
	}
	b.logLayer(r.name, "files", l, built)
	return l, what, nil
}

// binariesLayer builds the layer of the recipe's binaries.
func (b *builder) binariesLayer(r recipe) (*cachedLayer, error) {
	if len(r.binaries) == 0 {
		return nil, nil
	}
	key := sha256.New()
	fmt.Fprintf(key, "%s\n", layerFormat())
	for _, p := range r.binaries {
		sum, err := fileSHA256(filepath.Join(b.binDir, p.src))
		if err != nil {
			return nil, fmt.Errorf("binary %s (make static builds it): %w", p.src, err)
		}
		fmt.Fprintf(key, "%s %s\n", p.dst, sum)
	}
	l, built, err := b.layers.get(r.name+"-bin-", hex.EncodeToString(key.Sum(nil))[:32], func(w *layerWriter) error {
		for _, p := range r.binaries {
			f, err := os.Open(filepath.Join(b.binDir, p.src))
			if err != nil {
				return err
			}
			st, err := f.Stat()
			if err != nil {
				f.Close()
				return err
			}
			h := &tar.Header{Typeflag: tar.TypeReg, Name: p.dst, Size: st.Size(), Mode: 0o755, ModTime: fileTime}
			err = w.add(h, bufio.NewReader(f), "binary "+p.src)
			f.Close()
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	b.logLayer(r.name, "binaries", l, built)
	return l, nil
}

func (b *builder) logLayer(image, what string, l *cachedLayer, built bool) {
	how := "cached"
	if built {
		how = "built"
	}
	b.log("%s: %s layer %s %s (%.1f MiB)", image, what, how, l.Digest.Hex[:12], float64(l.Bytes)/(1<<20))
}

// dirHeader is the header of a directory the recipe makes.
func (b *builder) dirHeader() tar.Header {
	return tar.Header{Typeflag: tar.TypeDir, Mode: 0o755, ModTime: fileTime}
}

// addTree copies rootfs/<tree> to /: directories 0755, files 0644, root's.
func (b *builder) addTree(w *layerWriter, tree string) error {
	if tree == "" {
		return nil
	}
	top := path.Join("rootfs", tree)
	return fs.WalkDir(rootfs, top, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == top {
			return err
		}
		name := strings.TrimPrefix(p, top+"/")
		if d.IsDir() {
			h := b.dirHeader()
			h.Name = name
			return w.add(&h, nil, "rootfs/"+tree)
		}
		data, err := rootfs.ReadFile(p)
		if err != nil {
			return err
		}
		h := &tar.Header{Typeflag: tar.TypeReg, Name: name, Size: int64(len(data)), Mode: 0o644, ModTime: fileTime}
		return w.add(h, strings.NewReader(string(data)), "rootfs/"+tree)
	})
}

// hashTree adds the names and contents of rootfs/<tree> to h.
func hashTree(h io.Writer, tree string) error {
	if tree == "" {
		return nil
	}
	top := path.Join("rootfs", tree)
	return fs.WalkDir(rootfs, top, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "tree %s %v\n", p, d.IsDir())
		if !d.IsDir() {
			data, err := rootfs.ReadFile(p)
			if err != nil {
				return err
			}
			h.Write(data)
		}
		return nil
	})
}

// statusRecord is a package's control record without the archive's fields.
func statusRecord(p *debPackage) string {
	var out []string
	skip := false
	for _, line := range strings.Split(p.Stanza, "\n") {
		if !strings.HasPrefix(line, " ") {
			k, _, _ := strings.Cut(line, ":")
			switch k {
			case "Filename", "Size", "MD5sum", "SHA1", "SHA256", "SHA512", "Description-md5", "Tag", "Task":
				skip = true
			default:
				skip = false
			}
		}
		if !skip {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n") + "\n"
}

func fileSHA256(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
