package main

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/klauspost/compress/gzip"
)

// mergedUsr are the top-level directories that Debian 12 keeps in /usr
// (merged /usr): the root holds only symlinks to them.
var mergedUsr = []string{"bin", "sbin", "lib", "lib64"}

// canonical returns the path a layer stores name under: relative, cleaned,
// with the merged-/usr directories moved into usr/. "" is the root.
func canonical(name string) string {
	name = strings.TrimPrefix(path.Clean("/"+name), "/")
	first, rest, _ := strings.Cut(name, "/")
	for _, d := range mergedUsr {
		if first == d {
			return strings.TrimSuffix("usr/"+d+"/"+rest, "/")
		}
	}
	return name
}

// isMergedUsrLink tells whether name is one of the root's links into /usr.
func isMergedUsrLink(name string) bool {
	name = strings.Trim(name, "/")
	for _, d := range mergedUsr {
		if name == d {
			return true
		}
	}
	return false
}

// skipped tells which packaged files the images leave out: documentation
// (but each package's copyright file), manual pages, translations.
func skipped(name string) bool {
	if rest, ok := strings.CutPrefix(name, "usr/share/doc/"); ok {
		_, file, _ := strings.Cut(rest, "/")
		return file != "" && file != "copyright"
	}
	for _, p := range []string{"usr/share/man", "usr/share/info", "usr/share/locale", "usr/share/lintian"} {
		if name == p || strings.HasPrefix(name, p+"/") {
			return true
		}
	}
	return false
}

// layerWriter writes a layer's tar stream: every path canonical and stored
// once (the first writer wins, as apt would refuse the second package).
type layerWriter struct {
	tw    *tar.Writer
	seen  map[string]string // path → who wrote it
	links map[string]bool   // the paths that are symlinks
	// overlaps are files two sources both ship, kept from the first.
	overlaps []string
}

func newLayerWriter(w io.Writer) *layerWriter {
	return &layerWriter{tw: tar.NewWriter(w), seen: map[string]string{}, links: map[string]bool{}}
}

// add writes one entry from src (a package name, "recipe"), with its
// content from r for regular files.
func (w *layerWriter) add(hdr *tar.Header, r io.Reader, src string) error {
	name := canonical(hdr.Name)
	if hdr.Typeflag == tar.TypeSymlink && isMergedUsrLink(hdr.Name) {
		name = strings.Trim(hdr.Name, "/")
	}
	if name == "" || skipped(name) {
		return nil
	}
	if by, ok := w.seen[name]; ok {
		if by == parentDirs && hdr.Typeflag == tar.TypeDir && (hdr.Mode&0o7777 != 0o755 || hdr.Uid != 0 || hdr.Gid != 0) {
			return fmt.Errorf("%s: directory %s (mode %o, owner %d:%d) comes after what it holds, which made it 0755 root's", src, name, hdr.Mode, hdr.Uid, hdr.Gid)
		}
		if hdr.Typeflag != tar.TypeDir {
			w.overlaps = append(w.overlaps, fmt.Sprintf("%s (%s, %s)", name, by, src))
		}
		return nil
	}
	// Nothing goes through a link: unpackers differ on what that means.
	for p := path.Dir(name); p != "."; p = path.Dir(p) {
		if w.links[p] {
			return fmt.Errorf("%s: %s is under %s, a symlink in the layer", src, name, p)
		}
	}
	// Directories come before what they hold, whatever order the sources
	// give (a merged-/usr path can come before usr/ itself).
	if err := w.addParents(name); err != nil {
		return err
	}
	h := &tar.Header{
		Typeflag: hdr.Typeflag,
		Name:     name,
		Linkname: hdr.Linkname,
		Size:     hdr.Size,
		Mode:     hdr.Mode,
		Uid:      hdr.Uid,
		Gid:      hdr.Gid,
		Uname:    hdr.Uname,
		Gname:    hdr.Gname,
		ModTime:  hdr.ModTime.Truncate(time.Second),
		Devmajor: hdr.Devmajor,
		Devminor: hdr.Devminor,
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		h.Name += "/"
	case tar.TypeLink:
		h.Linkname = canonical(hdr.Linkname)
		if _, ok := w.seen[h.Linkname]; !ok {
			return fmt.Errorf("%s: hard link %s to %s, which the layer lacks", src, name, h.Linkname)
		}
	case tar.TypeReg, tar.TypeSymlink, tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
	default:
		return fmt.Errorf("%s: %s: unsupported tar entry type %q", src, name, hdr.Typeflag)
	}
	if hdr.Typeflag != tar.TypeReg {
		h.Size = 0
	}
	if err := w.tw.WriteHeader(h); err != nil {
		return err
	}
	if h.Size > 0 {
		if _, err := io.CopyN(w.tw, r, h.Size); err != nil {
			return fmt.Errorf("%s: %s: %w", src, name, err)
		}
	}
	w.seen[name] = src
	if h.Typeflag == tar.TypeSymlink {
		w.links[name] = true
	}
	return nil
}

// parentDirs is who wrote the directories that addParents makes.
const parentDirs = "parent directories"

// addParents writes the directories above name (a canonical path) that
// the layer lacks: root's, 0755, at fileTime.
func (w *layerWriter) addParents(name string) error {
	var parents []string
	for p := path.Dir(name); p != "." && p != "/"; p = path.Dir(p) {
		if _, ok := w.seen[p]; ok {
			break
		}
		parents = append(parents, p)
	}
	for i := len(parents) - 1; i >= 0; i-- {
		h := &tar.Header{Typeflag: tar.TypeDir, Name: parents[i] + "/", Mode: 0o755, ModTime: fileTime}
		if err := w.tw.WriteHeader(h); err != nil {
			return err
		}
		w.seen[parents[i]] = parentDirs
	}
	return nil
}

// addDeb writes the data archive of the .deb at debPath.
func (w *layerWriter) addDeb(debPath, pkg string) error {
	tr, c, err := openData(debPath)
	if err != nil {
		return err
	}
	defer c.Close()
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: %w", debPath, err)
		}
		if err := w.add(hdr, tr, pkg); err != nil {
			return err
		}
	}
}

// close ends the tar stream.
func (w *layerWriter) close() error { return w.tw.Close() }

// cachedLayer is a gzip-compressed layer file with its digests known, so a
// rerun reuses it without compressing or hashing again. It implements
// v1.Layer.
type cachedLayer struct {
	path   string
	Digest v1.Hash `json:"digest"`
	DiffID v1.Hash `json:"diffID"`
	Bytes  int64   `json:"size"`
}

var _ v1.Layer = layerOf(nil)

// layerOf adapts a cachedLayer to v1.Layer.
func layerOf(l *cachedLayer) v1.Layer { return cachedV1Layer{l} }

type cachedV1Layer struct{ l *cachedLayer }

func (c cachedV1Layer) Digest() (v1.Hash, error)             { return c.l.Digest, nil }
func (c cachedV1Layer) DiffID() (v1.Hash, error)             { return c.l.DiffID, nil }
func (c cachedV1Layer) Size() (int64, error)                 { return c.l.Bytes, nil }
func (c cachedV1Layer) MediaType() (types.MediaType, error)  { return types.OCILayer, nil }
func (c cachedV1Layer) Compressed() (io.ReadCloser, error)   { return os.Open(c.l.path) }
func (c cachedV1Layer) Uncompressed() (io.ReadCloser, error) { return openGzip(c.l.path) }

// openGzip opens a gzip file for reading its content.
func openGzip(p string) (io.ReadCloser, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	zr, err := gzip.NewReader(f)
	if err != nil {
		f.Close()
		return nil, err
	}
	return closerReader{zr, closers{zr, f}}, nil
}

type closerReader struct {
	io.Reader
	io.Closer
}

// layerCache keeps built layers under dir, named by a key that covers
// everything that goes into them.
type layerCache struct{ dir string }

// get returns the layer of prefix and key, building it with write if the
// cache lacks it; built tells which. Building removes the other layers of
// prefix, which this one replaces.
func (c *layerCache) get(prefix, key string, write func(w *layerWriter) error) (l *cachedLayer, built bool, err error) {
	base := filepath.Join(c.dir, prefix+key)
	if b, err := os.ReadFile(base + ".json"); err == nil {
		l := &cachedLayer{path: base + ".tar.gz"}
		if json.Unmarshal(b, l) == nil {
			if st, err := os.Stat(l.path); err == nil && st.Size() == l.Bytes {
				return l, false, nil
			}
		}
	}
	if err := os.MkdirAll(c.dir, 0o755); err != nil {
		return nil, false, err
	}
	f, err := os.CreateTemp(c.dir, ".layer-")
	if err != nil {
		return nil, false, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	if err := f.Chmod(0o644); err != nil {
		return nil, false, err
	}
	compressed := &countingHash{h: sha256.New()}
	zw, err := gzip.NewWriterLevel(io.MultiWriter(f, compressed), gzip.DefaultCompression)
	if err != nil {
		return nil, false, err
	}
	uncompressed := &countingHash{h: sha256.New()}
	lw := newLayerWriter(io.MultiWriter(zw, uncompressed))
	if err := write(lw); err != nil {
		return nil, false, err
	}
	if err := lw.close(); err != nil {
		return nil, false, err
	}
	if err := zw.Close(); err != nil {
		return nil, false, err
	}
	if err := f.Close(); err != nil {
		return nil, false, err
	}
	l = &cachedLayer{path: base + ".tar.gz", Digest: compressed.sum(), DiffID: uncompressed.sum(), Bytes: compressed.n}
	if err := os.Rename(f.Name(), l.path); err != nil {
		return nil, false, err
	}
	meta, err := json.Marshal(l)
	if err != nil {
		return nil, false, err
	}
	if err := writeFileAtomic(base+".json", meta); err != nil {
		return nil, false, err
	}
	old, _ := filepath.Glob(filepath.Join(c.dir, prefix+"*"))
	for _, o := range old {
		if !strings.HasPrefix(o, base+".") {
			os.Remove(o)
		}
	}
	return l, true, nil
}

// countingHash hashes and counts what is written to it.
type countingHash struct {
	h hash.Hash
	n int64
}

func (c *countingHash) Write(p []byte) (int, error) {
	c.n += int64(len(p))
	return c.h.Write(p)
}

func (c *countingHash) sum() v1.Hash {
	return v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(c.h.Sum(nil))}
}
