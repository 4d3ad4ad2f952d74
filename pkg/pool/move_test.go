package pool

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/loopvol/loopvol/internal/harness/testfs"
)

// movePools opens pools a, b and c of zone z1 and d of zone z2 under one
// temporary directory.
func movePools(t *testing.T) (map[string]*Pool, Peers) {
	t.Helper()
	root := t.TempDir()
	pools := map[string]*Pool{}
	for _, o := range []Options{{Name: "a", Zone: "z1"}, {Name: "b", Zone: "z1"}, {Name: "c", Zone: "z1"}, {Name: "d", Zone: "z2"}} {
		o.Path = filepath.Join(root, o.Name)
		p, err := Open(o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		pools[o.Name] = p
	}
	return pools, func(name string) *Pool { return pools[name] }
}

var moveData = []struct {
	off  int64
	data []byte
}{{0, []byte("the first block")}, {3 << 20, []byte("in the middle, after a hole")}, {8<<20 - 7, []byte("the end")}}

// newMovedVolume makes a volume of 8 MiB in home with data at three places.
func newMovedVolume(t *testing.T, home *Pool, name string, thin bool) VolumeID {
	t.Helper()
	sp := spec(name, 8<<20)
	sp.Thin = thin
	v, err := home.CreateVolume(t.Context(), sp)
	if err != nil {
		t.Fatal(err)
	}
	id := mustParse(t, v.ID)
	for _, d := range moveData {
		writeAt(t, home, id, d.off, d.data)
	}
	return id
}

// checkVolumeIn checks that volume id lives in pool want with its data, and
// that every pool holds exactly what it should: the image and full record
// in want, a forwarding record in the home pool, nothing else anywhere (no
// temporary, no old copy).
func checkVolumeIn(t *testing.T, pools map[string]*Pool, peers Peers, id VolumeID, want string) {
	t.Helper()
	home := pools[id.Pool]
	q, v, err := home.Locate(id, peers)
	if err != nil {
		t.Fatalf("Locate(%s): %v", id, err)
	}
	if q.Name != want || v.ID != id.String() || v.Move != nil || v.MovedTo != "" || v.SizeBytes != 8<<20 {
		t.Fatalf("Locate(%s) = pool %s, %+v; want pool %s", id, q.Name, v, want)
	}
	f, err := q.OpenImage(id, os.O_RDONLY)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, d := range moveData {
		got := make([]byte, len(d.data))
		if _, err := f.ReadAt(got, d.off); err != nil || !bytes.Equal(got, d.data) {
			t.Fatalf("volume %s in pool %s at %d: %q, %v; want %q", id, want, d.off, got, err, d.data)
		}
	}
	hv, err := home.readHome(id)
	if err != nil {
		t.Fatal(err)
	}
	if hv.Move != nil {
		t.Fatalf("home record still has move %+v", hv.Move)
	}
	for name, p := range pools {
		names, err := p.vols.names()
		if err != nil {
			t.Fatal(err)
		}
		slices.Sort(names)
		var expect []string
		switch {
		case name == want:
			expect = []string{id.Hash + imageSuffix, id.Hash + recordSuffix, id.Hash + lockSuffix}
		case name == id.Pool:
			expect = []string{id.Hash + recordSuffix, id.Hash + lockSuffix}
		}
		slices.Sort(expect)
		if !slices.Equal(names, expect) {
			t.Errorf("pool %s holds %v, want %v", name, names, expect)
		}
	}
}

func moveLocked(t *testing.T, home *Pool, id VolumeID, to *Pool, peers Peers, opts MoveOptions) (*Volume, error) {
	t.Helper()
	unlock, err := home.Lock(id)
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	return home.MoveVolume(t.Context(), id, to, peers, opts)
}

func TestMoveVolume(t *testing.T) {
	for _, thin := range []bool{false, true} {
		t.Run(fmt.Sprintf("thin=%t", thin), func(t *testing.T) {
			pools, peers := movePools(t)
			a, b, c := pools["a"], pools["b"], pools["c"]
			id := newMovedVolume(t, a, "pvc-move", thin)

			v, err := moveLocked(t, a, id, b, peers, MoveOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if v.ID != id.String() || v.Thin != thin {
				t.Fatalf("moved volume %+v", v)
			}
			checkVolumeIn(t, pools, peers, id, "b")
			if _, err := a.ReadVolume(id); !errors.Is(err, ErrMoved) {
				t.Fatalf("ReadVolume of the forwarding record = %v, want ErrMoved", err)
			}
			if _, err := b.ReadVolume(VolumeID{Pool: "b", Hash: id.Hash}); !errors.Is(err, ErrGuest) {
				t.Fatalf("ReadVolume of b's own ID of that hash = %v, want ErrGuest", err)
			}
			// The record in b is written there, never over a's.
			if err := a.WriteVolume(v); err == nil {
				t.Fatal("WriteVolume of a record read in b into a: no error")
			}
			// Again: nothing to do.
			if _, err := moveLocked(t, a, id, b, peers, MoveOptions{}); err != nil {
				t.Fatal(err)
			}
			checkVolumeIn(t, pools, peers, id, "b")
			// On to c: still one hop from a.
			if _, err := moveLocked(t, a, id, c, peers, MoveOptions{}); err != nil {
				t.Fatal(err)
			}
			checkVolumeIn(t, pools, peers, id, "c")
			// And back home.
			if _, err := moveLocked(t, a, id, a, peers, MoveOptions{}); err != nil {
				t.Fatal(err)
			}
			checkVolumeIn(t, pools, peers, id, "a")
			if got, err := a.ReadVolume(id); err != nil || got.Thin != thin {
				t.Fatalf("back home: %+v, %v", got, err)
			}
		})
	}
}

func TestMoveRefused(t *testing.T) {
	pools, peers := movePools(t)
	a := pools["a"]
	id := newMovedVolume(t, a, "pvc-refused", false)
	listing := func() map[string][]string {
		m := map[string][]string{}
		for name, p := range pools {
			names, _ := p.vols.names()
			// Lock files come and go with the locks; they hold nothing.
			names = slices.DeleteFunc(names, func(n string) bool { return strings.HasSuffix(n, lockSuffix) })
			slices.Sort(names)
			m[name] = names
		}
		return m
	}
	before := listing()

	v, _ := a.ReadVolume(id)
	v.Attachments = []Attachment{{Node: "node-1"}}
	must(t, a.WriteVolume(v))
	if _, err := moveLocked(t, a, id, pools["b"], peers, MoveOptions{}); !errors.Is(err, ErrInUse) || !strings.Contains(err.Error(), "node-1") {
		t.Fatalf("move of an attached volume = %v, want ErrInUse naming node-1", err)
	}
	v.Attachments = nil
	must(t, a.WriteVolume(v))

	if _, err := moveLocked(t, a, id, pools["d"], peers, MoveOptions{}); !errors.Is(err, ErrInvalidID) {
		t.Fatalf("move to another zone = %v, want ErrInvalidID", err)
	}
	full, err := Open(Options{Name: "b", Zone: "z1", Path: pools["b"].Path, ReserveBytes: 1 << 62})
	if err != nil {
		t.Fatal(err)
	}
	defer full.Close()
	fullPeers := func(name string) *Pool {
		if name == "b" {
			return full
		}
		return peers(name)
	}
	if _, err := moveLocked(t, a, id, full, fullPeers, MoveOptions{}); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("move to a full pool = %v, want ErrNoSpace", err)
	}
	if after := listing(); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("a refused move changed the pools:\nbefore %v\nafter  %v", before, after)
	}
	checkVolumeIn(t, pools, peers, id, "a")
}

var errCrash = errors.New("injected crash")

// TestMoveCrashAtEachStep stops a move after each durable step, as a kill
// would, then lets a retried move, or Sweep, converge: the retry always
// ends with the volume moved; Sweep rolls back what was not durable and
// finishes the rest. Every route: away from home, on to a third pool, back
// home.
func TestMoveCrashAtEachStep(t *testing.T) {
	routes := []struct {
		name     string
		first    string // where the volume is moved before the crashed move, "" for nowhere
		from, to string
	}{
		{name: "a→b", from: "a", to: "b"},
		{name: "b→c", first: "b", from: "b", to: "c"},
		{name: "b→a", first: "b", from: "b", to: "a"},
	}
	for _, route := range routes {
		for _, step := range MoveSteps {
			for _, recover := range []string{"retry", "sweep"} {
				t.Run(route.name+"/"+string(step)+"/"+recover, func(t *testing.T) {
					pools, peers := movePools(t)
					a := pools["a"]
					id := newMovedVolume(t, a, "pvc-crash", true)
					if route.first != "" {
						if _, err := moveLocked(t, a, id, pools[route.first], peers, MoveOptions{}); err != nil {
							t.Fatal(err)
						}
					}
					_, err := moveLocked(t, a, id, pools[route.to], peers, MoveOptions{AfterStep: func(s MoveStep) error {
						if s == step {
							return errCrash
						}
						return nil
					}})
					if !errors.Is(err, errCrash) {
						t.Fatalf("move = %v, want the injected crash", err)
					}
					// Until it settles, the volume is found in one
					// place, with its data.
					if q, _, err := a.Locate(id, peers); err != nil {
						t.Fatalf("Locate after the crash: %v", err)
					} else if want := stepWhere(step, route.from, route.to); q.Name != want {
						t.Fatalf("after a crash at %s the volume is in %s, want %s", step, q.Name, want)
					}
					want := route.to
					switch recover {
					case "retry":
						if _, err := moveLocked(t, a, id, pools[route.to], peers, MoveOptions{}); err != nil {
							t.Fatalf("retried move: %v", err)
						}
					case "sweep":
						// Within the grace, Sweep leaves it alone.
						if r := a.SweepMoves(time.Now(), time.Hour, peers); len(r.Finished)+len(r.Errors) != 0 {
							t.Fatalf("sweep within the grace: %+v", r)
						}
						r := a.SweepMoves(time.Now().Add(2*time.Hour), time.Hour, peers)
						if len(r.Errors) != 0 || len(r.Finished) != 1 {
							t.Fatalf("sweep: %+v", r)
						}
						if step == StepIntent || step == StepCopied {
							want = route.from // not durable: rolled back
						}
						for _, p := range pools {
							if _, err := p.Sweep(time.Now().Add(2*time.Hour), time.Hour); err != nil {
								t.Fatal(err)
							}
						}
					}
					checkVolumeIn(t, pools, peers, id, want)
				})
			}
		}
	}
}

// stepWhere is where lookups find the volume after a crash at step.
func stepWhere(step MoveStep, from, to string) string {
	if step == StepCommitted || step == StepCleaned {
		return to
	}
	return from
}

// TestForwardingIsStrict: a forwarding record that names anything but a
// configured pool of the zone holding a full record of the same ID is
// corrupt, never followed further.
func TestForwardingIsStrict(t *testing.T) {
	pools, peers := movePools(t)
	a, b := pools["a"], pools["b"]
	id := newMovedVolume(t, a, "pvc-strict", false)
	if _, err := moveLocked(t, a, id, b, peers, MoveOptions{}); err != nil {
		t.Fatal(err)
	}
	hv, err := a.readHome(id)
	if err != nil {
		t.Fatal(err)
	}
	for _, target := range []string{"a", "d", "nowhere", "../b", ""} {
		bad := *hv
		bad.MovedTo = target
		if target == "" {
			continue
		}
		must(t, a.vols.writeRecord(recordName(id), &bad, MaxRecordBytes))
		if _, _, err := a.Locate(id, peers); !errors.Is(err, ErrCorrupt) {
			t.Errorf("forwarding to %q: Locate = %v, want ErrCorrupt", target, err)
		}
	}
	must(t, a.vols.writeRecord(recordName(id), hv, MaxRecordBytes))
	// b's record forwards again: never followed.
	bv, err := b.readRecordOf(id)
	if err != nil {
		t.Fatal(err)
	}
	again := *bv
	again.MovedTo = "c"
	must(t, b.vols.writeRecord(recordName(id), &again, MaxRecordBytes))
	if _, _, err := a.Locate(id, peers); !errors.Is(err, ErrCorrupt) {
		t.Errorf("a second hop: Locate = %v, want ErrCorrupt", err)
	}
	// b's record names another volume.
	other := *bv
	other.ID = "c." + id.Hash
	must(t, b.vols.writeRecord(recordName(id), &other, MaxRecordBytes))
	if _, _, err := a.Locate(id, peers); !errors.Is(err, ErrCorrupt) {
		t.Errorf("a target record of another ID: Locate = %v, want ErrCorrupt", err)
	}
}

// TestMoveAcrossFilesystems (root): the target pool on a filesystem of its
// own (a loop-mounted 320 MiB xfs, the source on the test's ext4), so no
// reflink can cross: the sparse-aware copy moves the data there and back;
// a volume larger than the target's space is refused with nothing changed.
func TestMoveAcrossFilesystems(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: mounts a filesystem for the target pool")
	}
	root := t.TempDir()
	a, err := Open(Options{Name: "a", Zone: "z1", Path: filepath.Join(root, "a")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	mnt := filepath.Join(root, "xfs")
	must(t, os.MkdirAll(mnt, 0o750))
	testfs.MountReflinkXFS(t, filepath.Join(root, "xfs.img"), mnt, 320<<20)
	b, err := Open(Options{Name: "b", Zone: "z1", Path: filepath.Join(mnt, "b")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() }) // before the unmount
	pools := map[string]*Pool{"a": a, "b": b}
	peers := func(name string) *Pool { return pools[name] }

	id := newMovedVolume(t, a, "pvc-across", false)
	if _, err := moveLocked(t, a, id, b, peers, MoveOptions{}); err != nil {
		t.Fatal(err)
	}
	checkVolumeIn(t, pools, peers, id, "b")
	if _, err := moveLocked(t, a, id, a, peers, MoveOptions{}); err != nil {
		t.Fatal(err)
	}
	checkVolumeIn(t, pools, peers, id, "a")

	big, err := a.CreateVolume(t.Context(), spec("pvc-too-big", 512<<20))
	if err != nil {
		t.Fatal(err)
	}
	bigID := mustParse(t, big.ID)
	before, _ := b.vols.names()
	if _, err := moveLocked(t, a, bigID, b, peers, MoveOptions{}); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("a move to a pool without the room = %v, want ErrNoSpace", err)
	}
	if after, _ := b.vols.names(); len(after) != len(before) {
		t.Fatalf("the refused move left %v in the target (had %v)", after, before)
	}
	if hv, err := a.readHome(bigID); err != nil || hv.Move != nil {
		t.Fatalf("after the refused move the record is %+v, %v", hv, err)
	}
}

// TestMoveCopyFailureRollsBack: a copy that fails (here: the source image
// is gone) is rolled back at once: no intent, no temporary.
func TestMoveCopyFailureRollsBack(t *testing.T) {
	pools, peers := movePools(t)
	a, b := pools["a"], pools["b"]
	id := newMovedVolume(t, a, "pvc-copy-fails", false)
	must(t, a.vols.remove(imageName(id)))
	if _, err := moveLocked(t, a, id, b, peers, MoveOptions{}); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("move without a source image = %v, want ErrCorrupt", err)
	}
	if hv, err := a.readHome(id); err != nil || hv.Move != nil {
		t.Fatalf("after the failed copy the record is %+v, %v", hv, err)
	}
	if names, _ := b.vols.names(); len(names) != 0 {
		t.Fatalf("the failed copy left %v in the target", names)
	}
}

// TestMoveClearsTheTarget: what a dead CreateVolume of the same name left
// in the target (an image without data, no record) is removed before the
// intent, so a crash cannot make FinishMove take it for the move's copy; an
// image with data or a record there is refused, and nothing changes.
func TestMoveClearsTheTarget(t *testing.T) {
	for _, tc := range []struct {
		name    string
		plant   func(t *testing.T, dir string, id VolumeID)
		refused bool
	}{
		{name: "empty orphan image → removed", plant: func(t *testing.T, dir string, id VolumeID) {
			must(t, os.WriteFile(filepath.Join(dir, imageName(id)), nil, 0o600))
			must(t, os.Truncate(filepath.Join(dir, imageName(id)), 8<<20))
		}},
		{name: "orphan image with data → refused", refused: true, plant: func(t *testing.T, dir string, id VolumeID) {
			must(t, os.WriteFile(filepath.Join(dir, imageName(id)), []byte("someone's data"), 0o600))
		}},
		{name: "a record → refused", refused: true, plant: func(t *testing.T, dir string, id VolumeID) {
			must(t, os.WriteFile(filepath.Join(dir, recordName(id)), []byte("{}"), 0o600))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pools, peers := movePools(t)
			a, b := pools["a"], pools["b"]
			id := newMovedVolume(t, a, "pvc-clear", false)
			tc.plant(t, filepath.Join(b.Path, volumesDir), id)
			// A crash right after the intent: the retry must roll
			// back, not forward onto the planted image.
			_, err := moveLocked(t, a, id, b, peers, MoveOptions{AfterStep: func(s MoveStep) error {
				if s == StepIntent {
					return errCrash
				}
				return nil
			}})
			if tc.refused {
				if !errors.Is(err, ErrCorrupt) {
					t.Fatalf("move = %v, want ErrCorrupt", err)
				}
				if hv, err := a.readHome(id); err != nil || hv.Move != nil {
					t.Fatalf("after the refusal the record is %+v, %v", hv, err)
				}
				return
			}
			if !errors.Is(err, errCrash) {
				t.Fatalf("move = %v, want the injected crash", err)
			}
			r := a.SweepMoves(time.Now().Add(time.Hour), time.Minute, peers)
			if len(r.Errors) != 0 || len(r.Finished) != 1 {
				t.Fatalf("sweep: %+v", r)
			}
			checkVolumeIn(t, pools, peers, id, "a")
		})
	}
}
