package pool

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestLockNode: the node lock is exclusive within a process and across Pool
// handles on one directory (two processes); a waiter whose context ends
// gets ErrBusy; a released lock can be taken again; a bad node ID or a
// symlink in place of the lock file is refused. The lock file is the only
// new entry in nodes/ and ListNodes does not show it.
func TestLockNode(t *testing.T) {
	p := newTestPool(t)
	must(t, p.WriteNode(NodeRecord{ID: "n1", Zone: p.Zone}))
	other, err := Open(Options{Name: p.Name, Zone: p.Zone, Path: p.Path})
	must(t, err)
	unlock, err := p.LockNode(context.Background(), "n1")
	must(t, err)
	for name, q := range map[string]*Pool{"same handle": p, "other handle": other} {
		c, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		_, err := q.LockNode(c, "n1")
		cancel()
		if !errors.Is(err, ErrBusy) {
			t.Fatalf("%s: LockNode of a held node = %v, want ErrBusy", name, err)
		}
	}
	// Another node is not held.
	u2, err := other.LockNode(context.Background(), "n2")
	must(t, err)
	u2()
	unlock()
	u3, err := other.LockNode(context.Background(), "n1")
	if err != nil {
		t.Fatalf("LockNode after unlock: %v", err)
	}
	u3()
	if _, err := p.LockNode(context.Background(), "../n1"); !errors.Is(err, ErrInvalidID) {
		t.Fatalf("LockNode of a bad ID = %v, want ErrInvalidID", err)
	}
	if ids, err := p.ListNodes(); err != nil || len(ids) != 1 || ids[0] != "n1" {
		t.Fatalf("ListNodes = %v, %v; want [n1]", ids, err)
	}
	host := filepath.Join(t.TempDir(), "host")
	must(t, os.WriteFile(host, nil, 0o600))
	must(t, os.Symlink(host, filepath.Join(p.Path, nodesDir, "n3"+lockSuffix)))
	if _, err := p.LockNode(context.Background(), "n3"); err == nil || errors.Is(err, ErrBusy) {
		t.Fatalf("LockNode through a symlinked lock file = %v, want a refusal", err)
	}
}

// TestHasNode: a registered node, even with an unreadable record, is served;
// an unknown one or a bad ID is not.
func TestHasNode(t *testing.T) {
	p := newTestPool(t)
	must(t, p.WriteNode(NodeRecord{ID: "n1", Zone: p.Zone}))
	must(t, os.WriteFile(filepath.Join(p.Path, nodesDir, "torn"+recordSuffix), []byte("{"), 0o600))
	for node, want := range map[string]bool{"n1": true, "torn": true, "n2": false, "../n1": false} {
		if got := p.HasNode(node); got != want {
			t.Errorf("HasNode(%q) = %t, want %t", node, got, want)
		}
	}
}

// BenchmarkLockNode times taking and releasing one node lock with nobody
// else holding it: what the node limit adds to ControllerPublishVolume per
// pool the node serves.
func BenchmarkLockNode(b *testing.B) {
	p, err := Open(Options{Name: "bench", Zone: "z", Path: filepath.Join(b.TempDir(), "pool")})
	if err != nil {
		b.Fatal(err)
	}
	if err := p.WriteNode(NodeRecord{ID: "n1", Zone: "z"}); err != nil {
		b.Fatal(err)
	}
	c := context.Background()
	for b.Loop() {
		if !p.HasNode("n1") {
			b.Fatal("node not registered")
		}
		unlock, err := p.LockNode(c, "n1")
		if err != nil {
			b.Fatal(err)
		}
		unlock()
	}
}

// The in-process lock set holds only what is locked now: it does not grow
// with every ID ever locked.
func TestLockSetDoesNotGrow(t *testing.T) {
	p := newTestPool(t)
	for i := range 100 {
		unlock, err := p.Lock(DeriveVolumeID(p.Name, fmt.Sprint("v", i)))
		if err != nil {
			t.Fatal(err)
		}
		unlock()
	}
	p.held.mu.Lock()
	n := len(p.held.keys)
	p.held.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d keys held after every lock was released", n)
	}
}
