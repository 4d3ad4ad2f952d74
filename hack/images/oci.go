package main

import (
	"archive/tar"
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Annotations that name an image in an index: containerd's (the full
// reference, which ctr images import uses) and the OCI one (the tag).
const (
	annotationContainerdName = "io.containerd.image.name"
	annotationRefName        = "org.opencontainers.image.ref.name"
)

// index lists img once per reference (repository:tag).
func index(img v1.Image, refs []string) v1.ImageIndex {
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, ref := range refs {
		tag := ref[strings.LastIndex(ref, ":")+1:]
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add: img,
			Descriptor: v1.Descriptor{
				MediaType:   types.OCIManifestSchema1,
				Annotations: map[string]string{annotationContainerdName: ref, annotationRefName: tag},
				Platform:    &v1.Platform{OS: "linux", Architecture: runtime.GOARCH},
			},
		})
	}
	return idx
}

// writeOCI writes idx as the OCI layout dir and as the archive of that
// layout, dir+".tar". Nothing is written if both already hold idx; it
// tells whether it wrote.
func writeOCI(dir string, idx v1.ImageIndex) (bool, error) {
	raw, err := idx.RawManifest()
	if err != nil {
		return false, err
	}
	archive := dir + ".tar"
	old, err := os.ReadFile(filepath.Join(dir, "index.json"))
	if err == nil && bytes.Equal(old, raw) {
		if _, err := os.Stat(archive); err == nil {
			return false, nil
		}
	}
	// index.json goes last: a layout that was cut short keeps its old
	// index.json and is rewritten on the next run.
	lp, err := layout.Write(dir, idx)
	if err != nil {
		return false, err
	}
	// Drop the blobs of earlier builds.
	garbage, err := lp.GarbageCollect()
	if err != nil {
		return false, err
	}
	for _, h := range garbage {
		if err := lp.RemoveBlob(h); err != nil {
			return false, err
		}
	}
	return true, writeArchive(dir, archive)
}

// writeArchive writes the tar archive of the OCI layout dir (oci-layout,
// index.json, blobs/), which ctr images import reads.
func writeArchive(dir, archive string) error {
	var files []string
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != dir {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		return err
	}
	sort.Strings(files)
	f, err := os.CreateTemp(filepath.Dir(archive), ".archive-")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	if err := f.Chmod(0o644); err != nil {
		return err
	}
	bw := bufio.NewWriterSize(f, 1<<20)
	tw := tar.NewWriter(bw)
	for _, p := range files {
		st, err := os.Lstat(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		h := &tar.Header{Name: filepath.ToSlash(rel), Mode: 0o644, ModTime: time.Unix(0, 0)}
		switch {
		case st.IsDir():
			h.Typeflag, h.Name, h.Mode = tar.TypeDir, h.Name+"/", 0o755
		case st.Mode().IsRegular():
			h.Typeflag, h.Size = tar.TypeReg, st.Size()
		default:
			return fmt.Errorf("%s: not a file or directory", p)
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if h.Typeflag == tar.TypeReg {
			src, err := os.Open(p)
			if err != nil {
				return err
			}
			_, err = io.Copy(tw, src)
			src.Close()
			if err != nil {
				return err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), archive)
}
