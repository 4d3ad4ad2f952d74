package pool

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Unlock releases a volume lock.
type Unlock func()

// Lock takes the volume's lock without waiting: an in-process mutex, so that
// goroutines of this process never queue up behind each other, and flock on a
// lock file, so that two processes sharing the pool (NFS) do not write one
// record at once. A held lock gives ErrBusy, which the servers turn into
// ABORTED: the caller retries later, as the CSI spec asks. Every decision
// that depends on a volume's record reads the record after Lock returns.
// A volume's lock is its home pool's (the one its ID names), wherever it
// lives (move.go): another pool's ID is refused (ErrNotFound). A lock file
// the pool's filesystem refuses to create (it is full, read-only, failing)
// gives ErrUnwritable: nobody holds that lock, and nothing can be made in
// the pool under it.
func (p *Pool) Lock(id VolumeID) (Unlock, error) {
	if id.Pool != p.Name {
		return nil, fmt.Errorf("volume %s is not of pool %s, and is locked in its own: %w", id, p.Name, ErrNotFound)
	}
	return p.lockStem(id.Hash, "volume "+id.String())
}

// lockStem takes the lock of the volume or snapshot whose files are
// stem.img, stem.json and stem.lock, without waiting (see Lock); what names
// it in errors.
func (p *Pool) lockStem(stem, what string) (Unlock, error) {
	if !p.held.tryAdd(stem) {
		return nil, fmt.Errorf("%s: %w", what, ErrBusy)
	}
	f, err := p.flock(p.vols, stem+lockSuffix)
	if errors.Is(err, ErrBusy) {
		err = fmt.Errorf("%s is locked by another process: %w", what, err)
	}
	if err != nil {
		p.held.remove(stem)
		return nil, err
	}
	return func() {
		// A volume with neither record nor image (a lookup of a name that
		// does not exist, a lock taken in a pool the volume did not go
		// to) keeps no lock file: remove it while still holding it.
		if !p.exists(stem+recordSuffix) && !p.exists(stem+imageSuffix) {
			p.vols.remove(stem + lockSuffix)
		}
		unix.Flock(int(f.Fd()), unix.LOCK_UN)
		f.Close()
		p.held.remove(stem)
	}, nil
}

// heldSet is a set of try-locks by key that holds only the keys locked now.
type heldSet struct {
	mu   sync.Mutex
	keys map[string]bool
}

func (h *heldSet) tryAdd(key string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.keys[key] {
		return false
	}
	if h.keys == nil {
		h.keys = map[string]bool{}
	}
	h.keys[key] = true
	return true
}

func (h *heldSet) remove(key string) {
	h.mu.Lock()
	delete(h.keys, key)
	h.mu.Unlock()
}

// exists reports whether volumes/name is present (whatever it is).
func (p *Pool) exists(name string) bool {
	_, err := p.vols.stat(name)
	return err == nil
}

// flock locks the lock file name in d without waiting. A deleter
// unlinks a volume's lock file while it holds the lock, so after locking we
// check that the file we hold is still the one of that name; otherwise we
// lock the new one. The file is opened without following a symlink and
// without blocking (a FIFO put in its place cannot hang us) and must be a
// regular file.
func (p *Pool) flock(d *dir, name string) (*os.File, error) {
	for attempt := 0; attempt < 3; attempt++ {
		fd, err := unix.Openat(d.fd(), name, unix.O_RDWR|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0o640)
		if refusesWrites(err) {
			// A full, read-only or failing filesystem: a lock file that
			// exists is locked all the same through a read-only
			// descriptor (flock needs no write access), so a lock held
			// by another process is still ErrBusy. One that does not
			// exist is held by nobody and cannot be made: ErrUnwritable.
			created := err
			fd, err = unix.Openat(d.fd(), name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
			if errors.Is(err, unix.ENOENT) || refusesWrites(err) {
				return nil, fmt.Errorf("create lock %s/%s: %w: %w", d.path, name, created, ErrUnwritable)
			}
		}
		if err != nil {
			return nil, fmt.Errorf("open lock %s/%s: %w", d.path, name, err)
		}
		f := os.NewFile(uintptr(fd), d.path+"/"+name)
		var held unix.Stat_t
		if err := unix.Fstat(fd, &held); err != nil {
			f.Close()
			return nil, fmt.Errorf("stat lock %s: %w", f.Name(), err)
		}
		if held.Mode&unix.S_IFMT != unix.S_IFREG {
			f.Close()
			return nil, fmt.Errorf("lock %s is %s, not a regular file: %w", f.Name(), fileType(held.Mode), ErrUntrusted)
		}
		if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
			if errors.Is(err, unix.EWOULDBLOCK) {
				return nil, ErrBusy
			}
			return nil, fmt.Errorf("lock %s: %w", f.Name(), err)
		}
		if current, err := d.stat(name); err == nil && current.Ino == held.Ino && current.Dev == held.Dev {
			return f, nil
		}
		unix.Flock(fd, unix.LOCK_UN)
		f.Close()
	}
	return nil, fmt.Errorf("lock file %s/%s keeps changing: %w", d.path, name, ErrBusy)
}

// refusesWrites says whether err is a filesystem's refusal to write (full,
// over quota, read-only, failing), which ErrUnwritable reports.
func refusesWrites(err error) bool {
	return errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT) || errors.Is(err, unix.EROFS) || errors.Is(err, unix.EIO)
}

// removeLockFile unlinks the lock file of a deleted volume; the caller holds
// the lock.
func (p *Pool) removeLockFile(id VolumeID) {
	p.vols.remove(lockName(id))
}

// capacityWait bounds how long a capacity step waits for the pool lock. The
// lock is held for one allocation (fallocate of one image: milliseconds, a
// second for a TiB), so this is far beyond a healthy wait; past it the call
// answers ErrBusy (ABORTED) and is retried.
const capacityWait = 30 * time.Second

// lockCapacity takes the pool lock that makes "is there room?" and "take the
// room" one step: a capacity check of one CreateVolume or ExpandVolume and
// its allocation run while no other one of any process on this pool runs, so
// parallel creates of different names cannot each see the same free bytes
// and together overrun the reserve. Unlike the volume lock it waits (creates
// of different names should all succeed), until ctx ends or for capacityWait
// at most; then it answers ErrBusy. ctx is the RPC's: a caller that has
// given up (its deadline passed, kubelet or the sidecar cancelled) stops
// waiting with it instead of holding the volume lock 30 s more for nobody.
func (p *Pool) lockCapacity(ctx context.Context) (Unlock, error) {
	ctx, cancel := context.WithTimeout(ctx, capacityWait)
	defer cancel()
	select {
	case p.capacity <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("pool %s: another allocation in this process held the pool lock too long (%v): %w", p.Name, context.Cause(ctx), ErrBusy)
	}
	release := func() { <-p.capacity }
	f, err := p.waitFlock(ctx.Done(), p.root, poolLockFile)
	if errors.Is(err, ErrBusy) {
		err = fmt.Errorf("another process held the pool lock too long (%v): %w", context.Cause(ctx), err)
	}
	if err != nil {
		release()
		return nil, fmt.Errorf("pool %s: %w", p.Name, err)
	}
	return func() {
		unix.Flock(int(f.Fd()), unix.LOCK_UN)
		f.Close()
		release()
	}, nil
}

// waitFlock locks the lock file name in d, waiting until stop is closed
// (then ErrBusy). The holder of such a lock holds it only for one short
// step, so it polls with a short, growing pause rather than block in
// flock(2), which nothing could interrupt.
func (p *Pool) waitFlock(stop <-chan struct{}, d *dir, name string) (*os.File, error) {
	pause := time.Millisecond
	for {
		f, err := p.flock(d, name)
		if !errors.Is(err, ErrBusy) {
			return f, err
		}
		select {
		case <-stop:
			return nil, err
		case <-time.After(pause):
		}
		pause = min(2*pause, 50*time.Millisecond)
	}
}

// NodeLockWait bounds how long LockNode waits. The lock is held while one
// ControllerPublishVolume counts the node's attachments and writes one
// record (milliseconds), so this is far beyond a healthy wait.
const NodeLockWait = 30 * time.Second

// LockNode takes the node's lock in this pool, nodes/<node ID>.lock: an
// in-process semaphore and flock, like the pool lock. While it is held in
// every pool the node serves, no other publish of any process on those pools
// can attach a volume to the node, so counting the node's attachments and
// adding one is one step and two controllers cannot together exceed the
// node's limit. It waits (publishes of different volumes to one node should
// all succeed), until ctx ends or for NodeLockWait at most; then it answers
// ErrBusy. Callers that lock a node in several pools take the pools in
// one order, by name. The lock file stays with the node record, which is
// never removed either; one the pool's filesystem refuses to create gives
// ErrUnwritable (see Lock).
func (p *Pool) LockNode(ctx context.Context, node string) (Unlock, error) {
	if err := ValidateNodeID(node); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, NodeLockWait)
	defer cancel()
	v, _ := p.nodeLocks.LoadOrStore(node, make(chan struct{}, 1))
	sem := v.(chan struct{})
	select {
	case sem <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("node %s in pool %s: another publish in this process held the node lock too long (%v): %w", node, p.Name, context.Cause(ctx), ErrBusy)
	}
	f, err := p.waitFlock(ctx.Done(), p.nodes, node+lockSuffix)
	if errors.Is(err, ErrBusy) {
		err = fmt.Errorf("another process held the node lock too long (%v): %w", context.Cause(ctx), err)
	}
	if err != nil {
		<-sem
		return nil, fmt.Errorf("node %s in pool %s: %w", node, p.Name, err)
	}
	return func() {
		unix.Flock(int(f.Fd()), unix.LOCK_UN)
		f.Close()
		<-sem
	}, nil
}

// HasNode reports whether a node plugin has registered the node in this pool
// (its record is present, whether or not it can be read).
func (p *Pool) HasNode(node string) bool {
	if ValidateNodeID(node) != nil {
		return false
	}
	_, err := p.nodes.stat(node + recordSuffix)
	return err == nil
}
