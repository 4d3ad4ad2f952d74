package pool

import (
	"errors"
	"fmt"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// Unlock releases a volume lock.
type Unlock func()

// Lock takes the volume's lock without waiting: an in-process mutex, so that
// goroutines of this process never queue up behind each other, and flock on a
// lock file, so that two processes sharing the pool (NFS) do not write one
// record at once. A held lock gives ErrBusy, which the servers turn into
// ABORTED: the caller retries later, as the CSI spec asks.
func (p *Pool) Lock(id VolumeID) (Unlock, error) {
	if err := p.own(id); err != nil {
		return nil, err
	}
	v, _ := p.locks.LoadOrStore(id.Hash, &sync.Mutex{})
	mu := v.(*sync.Mutex)
	if !mu.TryLock() {
		return nil, fmt.Errorf("volume %s: %w", id, ErrBusy)
	}
	f, err := p.flock(id)
	if err != nil {
		mu.Unlock()
		return nil, err
	}
	return func() {
		unix.Flock(int(f.Fd()), unix.LOCK_UN)
		f.Close()
		mu.Unlock()
	}, nil
}

// flock locks the volume's lock file. A deleter unlinks the file while it
// holds the lock, so after locking we check that the file we hold is still the
// one at the path; otherwise we lock the new one.
func (p *Pool) flock(id VolumeID) (*os.File, error) {
	path := p.lockPath(id)
	for attempt := 0; attempt < 3; attempt++ {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o640)
		if err != nil {
			return nil, fmt.Errorf("open lock %s: %w", path, err)
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
			if errors.Is(err, unix.EWOULDBLOCK) {
				return nil, fmt.Errorf("volume %s is locked by another process: %w", id, ErrBusy)
			}
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		var held, current unix.Stat_t
		if err := unix.Fstat(int(f.Fd()), &held); err != nil {
			f.Close()
			return nil, fmt.Errorf("stat lock %s: %w", path, err)
		}
		if err := unix.Stat(path, &current); err == nil && current.Ino == held.Ino && current.Dev == held.Dev {
			return f, nil
		}
		unix.Flock(int(f.Fd()), unix.LOCK_UN)
		f.Close()
	}
	return nil, fmt.Errorf("volume %s: lock file keeps changing: %w", id, ErrBusy)
}

// removeLockFile unlinks the lock file of a deleted volume; the caller holds
// the lock.
func (p *Pool) removeLockFile(id VolumeID) {
	os.Remove(p.lockPath(id))
}
