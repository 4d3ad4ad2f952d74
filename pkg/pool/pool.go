package pool

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

const (
	markerFile   = ".loopvol-pool"
	volumesDir   = "volumes"
	nodesDir     = "nodes"
	markerFormat = 1
	imageSuffix  = ".img"
	recordSuffix = ".json"
	lockSuffix   = ".lock"
	// poolLockFile, next to the marker, is flock'ed around every capacity decision
	// and the allocation it allows; it is never removed.
	poolLockFile = ".loopvol-pool.lock"
	probePrefix  = ".probe-"
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

	// The pool's directories, opened once by Open: every file operation is
	// relative to them (fs.go).
	root, vols, nodes *dir
	// staged holds the nodes' staged records (staged.go).
	staged *dir

	// held is the in-process half of the volume and snapshot locks: the
	// keys (file stems) locked now. A key leaves it on unlock, so it holds
	// only what is locked at the moment, never every ID ever seen.
	held heldSet
	// capacity is the in-process half of the pool lock that makes a
	// capacity decision and its allocation one step (lock.go).
	capacity chan struct{}
	// nodeLocks: node ID → chan struct{}, the in-process half of the node
	// lock (LockNode).
	nodeLocks sync.Map
}

type marker struct {
	Name   string `json:"name"`
	Format int    `json:"format"`
}

// Open checks the options, creates the pool layout if it is new and returns
// the pool. A directory that is marked as another pool is refused
// (ErrPoolMismatch): two pools never share a directory, or their volume IDs
// would collide. The pool directory is opened once, following symlinks in
// its configured path; volumes/ and nodes/ are opened beneath it without
// following any, and must belong to the pool directory's owner.
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
	p := &Pool{Name: opts.Name, Zone: opts.Zone, Path: opts.Path, ReserveBytes: opts.ReserveBytes, capacity: make(chan struct{}, 1)}
	if err := os.MkdirAll(p.Path, 0o750); err != nil {
		return nil, fmt.Errorf("pool %s: create %s: %w", p.Name, p.Path, err)
	}
	var err error
	if p.root, err = openRoot(p.Path); err != nil {
		return nil, fmt.Errorf("pool %s: %w", p.Name, err)
	}
	if p.vols, err = p.root.subdir(volumesDir); err != nil {
		return nil, fmt.Errorf("pool %s: %w", p.Name, err)
	}
	if p.nodes, err = p.root.subdir(nodesDir); err != nil {
		return nil, fmt.Errorf("pool %s: %w", p.Name, err)
	}
	if p.staged, err = p.root.subdir(stagedDir); err != nil {
		return nil, fmt.Errorf("pool %s: %w", p.Name, err)
	}
	var m marker
	err = p.root.readRecord(markerFile, &m, maxSmallRecordBytes)
	switch {
	case errors.Is(err, ErrNotFound):
		if err := p.root.writeRecord(markerFile, marker{Name: p.Name, Format: markerFormat}, maxSmallRecordBytes); err != nil {
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

// Check reports whether the pool directory is usable: it carries our marker,
// its volumes and nodes directories are still the ones Open opened, and the
// volumes directory is writable. Probe uses it.
func (p *Pool) Check() error {
	var m marker
	if err := p.root.readRecord(markerFile, &m, maxSmallRecordBytes); err != nil {
		return fmt.Errorf("pool %s: %w", p.Name, err)
	}
	if m.Name != p.Name {
		return fmt.Errorf("pool %s: marker names %q: %w", p.Name, m.Name, ErrPoolMismatch)
	}
	if err := p.vols.sameAs(p.root, volumesDir); err != nil {
		return fmt.Errorf("pool %s: %w", p.Name, err)
	}
	if err := p.nodes.sameAs(p.root, nodesDir); err != nil {
		return fmt.Errorf("pool %s: %w", p.Name, err)
	}
	if err := p.staged.sameAs(p.root, stagedDir); err != nil {
		return fmt.Errorf("pool %s: %w", p.Name, err)
	}
	name := probePrefix + strconv.FormatInt(time.Now().UnixNano(), 36)
	fd, err := unix.Openat(p.vols.fd(), name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("pool %s: not writable: %w", p.Name, err)
	}
	unix.Close(fd)
	return p.vols.remove(name)
}

// ImagePath returns the image file of a volume of this pool, for messages
// and for the loop device's backing-file name. Open the image with
// OpenImage, never by this path: the path is walked again, the descriptor
// is checked.
func (p *Pool) ImagePath(id VolumeID) string {
	return filepath.Join(p.Path, volumesDir, imageName(id))
}

func imageName(id VolumeID) string  { return id.Hash + imageSuffix }
func recordName(id VolumeID) string { return id.Hash + recordSuffix }
func lockName(id VolumeID) string   { return id.Hash + lockSuffix }

// own checks that id may name a volume of this pool: any valid ID may, since
// a volume moved here from its home pool keeps the home's ID (move.go).
// Which pool a volume lives in is Locate's to say; every record read checks
// that the record names the ID asked for.
func (p *Pool) own(id VolumeID) error {
	return ValidatePoolName(id.Pool)
}

// Close releases the pool's directory descriptors. A driver keeps its pools
// open for its lifetime; tests close them to unmount what holds them.
func (p *Pool) Close() error {
	return errors.Join(p.root.f.Close(), p.vols.f.Close(), p.nodes.f.Close(), p.staged.f.Close())
}
