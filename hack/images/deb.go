package main

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/klauspost/compress/zstd"
	"github.com/ulikunitz/xz"
)

// arMagic starts every ar archive, the container format of a .deb.
const arMagic = "!<arch>\n"

// openData finds the data archive (data.tar, data.tar.xz, .zst or .gz) in
// the .deb at path and returns a reader of its tar stream.
func openData(path string) (*tar.Reader, io.Closer, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	r := bufio.NewReaderSize(f, 1<<20)
	magic := make([]byte, len(arMagic))
	if _, err := io.ReadFull(r, magic); err != nil || string(magic) != arMagic {
		f.Close()
		return nil, nil, fmt.Errorf("%s: not an ar archive", path)
	}
	for {
		// Each member: a 60-byte header (name 16, mtime 12, uid 6, gid 6,
		// mode 8, size 10, magic "`\n"), its data, one pad byte to an even
		// offset.
		hdr := make([]byte, 60)
		if _, err := io.ReadFull(r, hdr); err != nil {
			f.Close()
			return nil, nil, fmt.Errorf("%s: no data.tar member: %w", path, err)
		}
		if string(hdr[58:60]) != "`\n" {
			f.Close()
			return nil, nil, fmt.Errorf("%s: bad ar member header", path)
		}
		name := strings.TrimRight(strings.TrimSpace(string(hdr[0:16])), "/")
		size, err := strconv.ParseInt(strings.TrimSpace(string(hdr[48:58])), 10, 64)
		if err != nil {
			f.Close()
			return nil, nil, fmt.Errorf("%s: member %s: bad size: %w", path, name, err)
		}
		if !strings.HasPrefix(name, "data.tar") {
			if _, err := r.Discard(int(size + size%2)); err != nil {
				f.Close()
				return nil, nil, fmt.Errorf("%s: %w", path, err)
			}
			continue
		}
		body := io.LimitReader(r, size)
		var dr io.Reader
		closer := io.Closer(f)
		switch name {
		case "data.tar":
			dr = body
		case "data.tar.xz":
			xr, err := xz.NewReader(body)
			if err != nil {
				f.Close()
				return nil, nil, fmt.Errorf("%s: %w", path, err)
			}
			dr = xr
		case "data.tar.zst":
			zr, err := zstd.NewReader(body)
			if err != nil {
				f.Close()
				return nil, nil, fmt.Errorf("%s: %w", path, err)
			}
			dr = zr
			closer = closers{zr.IOReadCloser(), f}
		case "data.tar.gz":
			gr, err := gzip.NewReader(body)
			if err != nil {
				f.Close()
				return nil, nil, fmt.Errorf("%s: %w", path, err)
			}
			dr = gr
		default:
			f.Close()
			return nil, nil, fmt.Errorf("%s: unsupported member %s", path, name)
		}
		return tar.NewReader(bufio.NewReaderSize(dr, 1<<20)), closer, nil
	}
}

// closers closes each in turn.
type closers []io.Closer

func (c closers) Close() error {
	var first error
	for _, cl := range c {
		if err := cl.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}
