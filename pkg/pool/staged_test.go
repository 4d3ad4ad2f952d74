package pool

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func stagedPath(p *Pool, name string) string { return filepath.Join(p.Path, stagedDir, name) }

// TestStagedRecords: a node's record is written, read, listed and removed;
// a move and its checks refuse while it is there, naming the node, and
// change nothing; a record of a node that never comes back keeps refusing.
func TestStagedRecords(t *testing.T) {
	pools, peers := movePools(t)
	a, b := pools["a"], pools["b"]
	id := newMovedVolume(t, a, "pvc-staged", false)
	elsewhere, _ := movePools(t) // checkVolumeIn wants nothing else in these
	c := elsewhere["a"]
	other := newMovedVolume(t, c, "pvc-other", false)
	start := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	must(t, a.WriteStaged(Staged{VolumeID: id.String(), Node: "node-1", NodeStart: start, Staged: start}))
	must(t, c.WriteStaged(Staged{VolumeID: other.String(), Node: "node-1", NodeStart: start, Staged: start}))
	must(t, a.WriteStaged(Staged{VolumeID: id.String(), Node: "node.2", NodeStart: start, Staged: start, ReadOnly: true}))

	rec, err := a.ReadStaged(id, "node-1")
	if err != nil || rec.NodeStart != start || rec.ReadOnly {
		t.Fatalf("ReadStaged = %+v, %v", rec, err)
	}
	if ids, err := a.ListStaged("node-1"); err != nil || len(ids) != 1 || ids[0] != id {
		t.Fatalf("ListStaged(node-1) in a = %v, %v; want %s", ids, err, id)
	}
	if ids, err := a.ListStaged("node.2"); err != nil || len(ids) != 1 || ids[0] != id {
		t.Fatalf("ListStaged(node.2) = %v, %v; want %s", ids, err, id)
	}
	// Records live in the home pool only.
	if err := b.WriteStaged(Staged{VolumeID: id.String(), Node: "node-1"}); !errors.Is(err, ErrInvalidID) {
		t.Fatalf("WriteStaged in a pool that is not the volume's home = %v, want ErrInvalidID", err)
	}

	_, err = moveLocked(t, a, id, b, peers, MoveOptions{})
	if !errors.Is(err, ErrInUse) || !strings.Contains(err.Error(), "node-1") || !strings.Contains(err.Error(), "node.2 (read-only") {
		t.Fatalf("move of a staged volume = %v, want ErrInUse naming node-1 and node.2", err)
	}
	checkVolumeIn(t, pools, peers, id, "a")

	// node-1 unstages; node.2 died and never does: still refused.
	must(t, a.RemoveStaged(id, "node-1"))
	must(t, a.RemoveStaged(id, "node-1")) // again: nothing to do
	if _, err := moveLocked(t, a, id, b, peers, MoveOptions{}); !errors.Is(err, ErrInUse) || strings.Contains(err.Error(), "node-1") || !strings.Contains(err.Error(), "node.2") {
		t.Fatalf("move with node.2's record left = %v, want ErrInUse naming node.2 only", err)
	}
	// Reopened (a restarted controller): the record is on disk.
	again, err := Open(Options{Name: "a", Zone: "z1", Path: a.Path})
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if err := again.CheckUnstaged(id, "it moves"); !errors.Is(err, ErrInUse) {
		t.Fatalf("CheckUnstaged after reopening = %v, want ErrInUse", err)
	}
	must(t, a.RemoveStaged(id, "node.2"))
	if _, err := moveLocked(t, a, id, b, peers, MoveOptions{}); err != nil {
		t.Fatalf("move once no node has it staged: %v", err)
	}
	checkVolumeIn(t, pools, peers, id, "b")
	// The other volume's record was never touched.
	if _, err := c.ReadStaged(other, "node-1"); err != nil {
		t.Fatalf("the other volume's record: %v", err)
	}
}

// TestUntrustedStagedEntries: whatever is put where a staged record of the
// volume would be (a symlink, a FIFO, a directory, a huge or foreign record,
// a name that is no record's) keeps refusing the move, named in the message,
// and is never followed or read past its bound; a temporary is no record.
func TestUntrustedStagedEntries(t *testing.T) {
	host, hostData := hostFile(t)
	pools, peers := movePools(t)
	a, b := pools["a"], pools["b"]
	id := newMovedVolume(t, a, "pvc-hostile", false)
	cases := []struct {
		name, want string
		make       func(path string) error
	}{
		{name: "symlink to a host file", want: "node-s (an unreadable record", make: func(path string) error { return os.Symlink(host, path) }},
		{name: "FIFO", want: "node-f (an unreadable record", make: func(path string) error { return syscall.Mkfifo(path, 0o600) }},
		{name: "directory", want: "node-d (an unreadable record", make: func(path string) error { return os.Mkdir(path, 0o700) }},
		{name: "oversized", want: "node-o (an unreadable record", make: func(path string) error {
			return os.WriteFile(path, []byte(`{"volumeID":"`+strings.Repeat("x", maxSmallRecordBytes)+`"}`), 0o600)
		}},
		{name: "another volume's record", want: "node-v (an unreadable record", make: func(path string) error {
			return os.WriteFile(path, []byte(`{"volumeID":"a.00000000000000000000000000000000","node":"node-v"}`), 0o600)
		}},
		{name: "not JSON", want: "node-j (an unreadable record", make: func(path string) error { return os.WriteFile(path, []byte("{"), 0o600) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			node, _, _ := strings.Cut(tc.want, " ")
			path := stagedPath(a, stagedName(id, node))
			must(t, tc.make(path))
			defer os.RemoveAll(path)
			err := a.CheckUnstaged(id, "it moves")
			if !errors.Is(err, ErrInUse) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("CheckUnstaged = %v, want ErrInUse containing %q", err, tc.want)
			}
			if _, err := moveLocked(t, a, id, b, peers, MoveOptions{}); !errors.Is(err, ErrInUse) {
				t.Fatalf("move = %v, want ErrInUse", err)
			}
			checkVolumeIn(t, pools, peers, id, "a")
		})
	}
	// A name that gives no node still refuses, and is named.
	bad := stagedPath(a, id.Hash+".-bad-.json")
	must(t, os.WriteFile(bad, nil, 0o600))
	if err := a.CheckUnstaged(id, "it moves"); !errors.Is(err, ErrInUse) || !strings.Contains(err.Error(), "-bad-") {
		t.Fatalf("CheckUnstaged with a strange name = %v, want ErrInUse naming it", err)
	}
	must(t, os.Remove(bad))
	// A temporary (a writer killed before its rename) is not a record.
	must(t, os.WriteFile(stagedPath(a, "."+stagedName(id, "node-t")+".tmp-0123"), []byte("{"), 0o600))
	if err := a.CheckUnstaged(id, "it moves"); err != nil {
		t.Fatalf("CheckUnstaged with only a temporary = %v", err)
	}
	if got, _ := os.ReadFile(host); string(got) != string(hostData) {
		t.Fatal("the host file changed")
	}
	// Bad node IDs and IDs are refused before any file is touched.
	for _, node := range []string{"", "../x", "a/b", strings.Repeat("n", 200)} {
		if err := a.WriteStaged(Staged{VolumeID: id.String(), Node: node}); !errors.Is(err, ErrInvalidID) {
			t.Errorf("WriteStaged of node %q = %v, want ErrInvalidID", node, err)
		}
		if err := a.RemoveStaged(id, node); !errors.Is(err, ErrInvalidID) {
			t.Errorf("RemoveStaged of node %q = %v, want ErrInvalidID", node, err)
		}
	}
}

// TestStagedSweptTemporaries: Sweep removes what a node plugin killed while
// it wrote a staged record left, once it is old.
func TestStagedSweptTemporaries(t *testing.T) {
	p := newTestPool(t)
	tmp := stagedPath(p, ".0123.node.json.tmp-abcd")
	must(t, os.WriteFile(tmp, nil, 0o600))
	old := time.Now().Add(-time.Hour)
	must(t, os.Chtimes(tmp, old, old))
	r, err := p.Sweep(time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(tmp); !os.IsNotExist(err) || len(r.Temporaries) != 1 {
		t.Fatalf("a dead writer's staged temporary was not swept: %v, %+v", err, r)
	}
}
