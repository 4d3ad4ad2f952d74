package pool

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/loopvol/loopvol/internal/harness/testfs"
)

// TestLockInUnwritablePool: a pool on a small real filesystem that another
// writer fills to ENOSPC (blocks, then inodes), then remounts read-only.
// A lock whose file does not exist cannot be made there: ErrUnwritable,
// which callers that lock a name in every pool may leave out. A lock whose
// file exists (a volume's, a node's once locked) is still taken, and one
// another process holds is still ErrBusy, full or read-only: without that a
// full pool's held lock would look free.
func TestLockInUnwritablePool(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a filesystem")
	}
	dir := t.TempDir()
	fs := filepath.Join(dir, "fs")
	if err := os.Mkdir(fs, 0o750); err != nil {
		t.Fatal(err)
	}
	testfs.MountSmallExt4(t, filepath.Join(dir, "fs.img"), fs)
	open := func() *Pool {
		p, err := Open(Options{Name: "a", Zone: "z1", Path: filepath.Join(fs, "pool")})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		return p
	}
	p, other := open(), open() // other stands for another controller process
	// Created under its lock, as the controller does: its lock file stays
	// with its record.
	kept := DeriveVolumeID("a", "kept")
	unlock, err := p.Lock(kept)
	if err != nil {
		t.Fatal(err)
	}
	_, err = p.CreateVolume(t.Context(), VolumeSpec{Name: "kept", SizeBytes: 1 << 20, AccessType: AccessBlock, AccessModes: []string{"SINGLE_NODE_WRITER"}})
	unlock()
	if err != nil {
		t.Fatal(err)
	}
	unlock, err = p.LockNode(t.Context(), "old-node")
	if err != nil {
		t.Fatal(err)
	}
	unlock()
	testfs.FillToENOSPC(t, fs)

	check := func(state string) {
		t.Helper()
		if _, err := p.Lock(DeriveVolumeID("a", "new")); !errors.Is(err, ErrUnwritable) {
			t.Errorf("%s: Lock of a new name: %v, want ErrUnwritable", state, err)
		}
		if _, err := p.LockNode(t.Context(), "new-node"); !errors.Is(err, ErrUnwritable) {
			t.Errorf("%s: LockNode of a node never locked: %v, want ErrUnwritable", state, err)
		}
		unlock, err := p.LockNode(t.Context(), "old-node")
		if err != nil {
			t.Errorf("%s: LockNode of a node with a lock file: %v", state, err)
		} else {
			unlock()
		}
		unlock, err = p.Lock(kept)
		if err != nil {
			t.Errorf("%s: Lock of an existing volume: %v", state, err)
			return
		}
		if _, err := other.Lock(kept); !errors.Is(err, ErrBusy) {
			t.Errorf("%s: Lock of a volume another process holds: %v, want ErrBusy", state, err)
		}
		unlock()
	}
	check("full")
	if out, err := exec.Command("mount", "-o", "remount,ro", fs).CombinedOutput(); err != nil {
		t.Fatalf("remount %s read-only: %v: %s", fs, err, out)
	}
	check("read-only")
}
