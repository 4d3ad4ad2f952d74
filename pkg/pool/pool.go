package pool

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
)

const (
	markerFile   = ".loopvol-pool"
	volumesDir   = "volumes"
	nodesDir     = "nodes"
	markerFormat = 1
	imageSuffix  = ".img"
	recordSuffix = ".json"
	lockSuffix   = ".lock"
)

// Options describe one pool.
type Options struct {
	// Name is the pool's DNS-label name; it prefixes every volume ID.
	Name string
	// Zone is the topology zone whose nodes can reach the pool.
	Zone string
	// Path is the pool directory (local, or shared such as NFS).
	Path string
	// ReserveBytes are kept free and never promised to volumes.
	ReserveBytes int64
}

// Pool is one directory of volume images and records.
type Pool struct {
	Name         string
	Zone         string
	Path         string
	ReserveBytes int64

	locks sync.Map // volume hash → *sync.Mutex: the in-process half of the volume lock
}

type marker struct {
	Name   string `json:"name"`
	Format int    `json:"format"`
}

// Open checks the options, creates the pool layout if it is new and returns
// the pool. A directory that is marked as another pool is refused
// (ErrPoolMismatch): two pools never share a directory, or their volume IDs
// would collide.
func Open(opts Options) (*Pool, error) {
	if err := ValidatePoolName(opts.Name); err != nil {
		return nil, err
	}
	if opts.Zone == "" {
		return nil, fmt.Errorf("pool %s: zone must not be empty", opts.Name)
	}
	if !filepath.IsAbs(opts.Path) {
		abs, err := filepath.Abs(opts.Path)
		if err != nil {
			return nil, fmt.Errorf("pool %s: %w", opts.Name, err)
		}
		opts.Path = abs
	}
	opts.Path = filepath.Clean(opts.Path)
	if opts.ReserveBytes < 0 {
		return nil, fmt.Errorf("pool %s: reserve must not be negative", opts.Name)
	}
	p := &Pool{Name: opts.Name, Zone: opts.Zone, Path: opts.Path, ReserveBytes: opts.ReserveBytes}
	for _, dir := range []string{p.Path, filepath.Join(p.Path, volumesDir), filepath.Join(p.Path, nodesDir)} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return nil, fmt.Errorf("pool %s: create %s: %w", p.Name, dir, err)
		}
	}
	var m marker
	err := readRecord(filepath.Join(p.Path, markerFile), &m)
	switch {
	case errors.Is(err, ErrNotFound):
		if err := writeRecord(filepath.Join(p.Path, markerFile), marker{Name: p.Name, Format: markerFormat}); err != nil {
			return nil, fmt.Errorf("pool %s: write marker: %w", p.Name, err)
		}
	case err != nil:
		return nil, fmt.Errorf("pool %s: %w", p.Name, err)
	case m.Name != p.Name:
		return nil, fmt.Errorf("pool %s: %s is marked as pool %q: %w", p.Name, p.Path, m.Name, ErrPoolMismatch)
	case m.Format != markerFormat:
		return nil, fmt.Errorf("pool %s: on-disk format %d is not supported (want %d)", p.Name, m.Format, markerFormat)
	}
	return p, nil
}

// Check reports whether the pool directory is usable: it exists, carries our
// marker and its volumes directory is writable. Probe uses it.
func (p *Pool) Check() error {
	var m marker
	if err := readRecord(filepath.Join(p.Path, markerFile), &m); err != nil {
		return fmt.Errorf("pool %s: %w", p.Name, err)
	}
	if m.Name != p.Name {
		return fmt.Errorf("pool %s: marker names %q: %w", p.Name, m.Name, ErrPoolMismatch)
	}
	f, err := os.CreateTemp(filepath.Join(p.Path, volumesDir), ".probe-*")
	if err != nil {
		return fmt.Errorf("pool %s: not writable: %w", p.Name, err)
	}
	f.Close()
	return os.Remove(f.Name())
}

// ImagePath returns the image file of a volume of this pool.
func (p *Pool) ImagePath(id VolumeID) string {
	return filepath.Join(p.Path, volumesDir, id.Hash+imageSuffix)
}

func (p *Pool) recordPath(id VolumeID) string {
	return filepath.Join(p.Path, volumesDir, id.Hash+recordSuffix)
}

func (p *Pool) lockPath(id VolumeID) string {
	return filepath.Join(p.Path, volumesDir, id.Hash+lockSuffix)
}

func (p *Pool) nodePath(nodeID string) string {
	return filepath.Join(p.Path, nodesDir, nodeID+recordSuffix)
}

func (p *Pool) own(id VolumeID) error {
	if id.Pool != p.Name {
		return fmt.Errorf("volume %s is not in pool %s: %w", id, p.Name, ErrNotFound)
	}
	return nil
}

func exists(path string) (bool, error) {
	_, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	return err == nil, err
}
