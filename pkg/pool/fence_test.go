package pool

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/loopvol/loopvol/internal/harness/testfs"
)

// attachLoop attaches image to a loop device with direct I/O, as a node
// plugin does, until the test ends.
func attachLoop(t *testing.T, image string) string {
	t.Helper()
	out, err := exec.Command("losetup", "--direct-io=on", "-f", "--show", image).CombinedOutput()
	if err != nil {
		t.Fatalf("losetup %s: %v: %s", image, err, out)
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() {
		if out, err := exec.Command("losetup", "-d", dev).CombinedOutput(); err != nil {
			t.Errorf("losetup -d %s: %v: %s", dev, err, out)
		}
	})
	return dev
}

// writeSynced writes 1 MiB of b at off through dev and fsyncs it: an
// acknowledged write.
func writeSynced(t *testing.T, dev string, off int64, b byte) {
	t.Helper()
	f, err := os.OpenFile(dev, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(bytes.Repeat([]byte{b}, 1<<20), off); err != nil {
		t.Fatalf("write %s at %d: %v", dev, off, err)
	}
	if err := f.Sync(); err != nil {
		t.Fatalf("fsync %s: %v", dev, err)
	}
}

// ext4Pool opens pool "shared" on an ext4 (no reflink: fences are copies)
// of size bytes, loop-mounted until the test ends.
func ext4Pool(t *testing.T, size int64) *Pool {
	t.Helper()
	root := t.TempDir()
	mnt := filepath.Join(root, "mnt")
	must(t, os.Mkdir(mnt, 0o700))
	testfs.Mount(t, filepath.Join(root, "fs.img"), mnt, size, "mkfs.ext4", "-q")
	p, err := Open(Options{Name: "shared", Zone: "z1", Path: filepath.Join(mnt, "pool")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// TestFenceImage: a node has the volume attached (a real loop device, direct
// I/O, as the node plugin attaches it) and has written to it. After the
// fence every write it acknowledged before is in the volume's image, and
// what it writes after, though its device still accepts it, never reaches
// the image; its staged record is broken, a later incarnation's is not.
// On a reflink xfs and on an ext4 (a full copy).
func TestFenceImage(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: mounts and loop devices")
	}
	for _, tc := range []struct {
		name   string
		mount  func(t *testing.T, image, dir string)
		method string
	}{
		{name: "xfs", method: FenceReflink, mount: func(t *testing.T, image, dir string) {
			testfs.MountReflinkXFS(t, image, dir, 512<<20)
		}},
		{name: "ext4", method: FenceCopy, mount: func(t *testing.T, image, dir string) {
			testfs.Mount(t, image, dir, 256<<20, "mkfs.ext4", "-q")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			mnt := filepath.Join(root, "mnt")
			must(t, os.Mkdir(mnt, 0o700))
			tc.mount(t, filepath.Join(root, "fs.img"), mnt)
			p, err := Open(Options{Name: "shared", Zone: "z1", Path: filepath.Join(mnt, "pool")})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { p.Close() })
			const size = 32 << 20
			v, err := p.CreateVolume(t.Context(), spec("fenced", size))
			if err != nil {
				t.Fatal(err)
			}
			id, _ := ParseVolumeID(v.ID)
			image := p.ImagePath(id)
			start := time.Now().UTC().Truncate(time.Second)
			must(t, p.WriteStaged(Staged{VolumeID: v.ID, Node: "node-b", NodeStart: start, Staged: start}))
			dev := attachLoop(t, image)
			writeSynced(t, dev, 0, 'a')

			unlock, err := p.Lock(id)
			if err != nil {
				t.Fatal(err)
			}
			method, err := p.FenceImage(t.Context(), id, nil, nil)
			if err != nil {
				unlock()
				t.Fatalf("FenceImage: %v", err)
			}
			if method != tc.method {
				t.Errorf("fenced by %s, want %s", method, tc.method)
			}
			// A later incarnation's record is not this fence's to break.
			if broken, err := p.BreakStaged(id, "node-b", start.Add(-time.Second)); err != nil || broken {
				t.Errorf("BreakStaged through an earlier incarnation = %v, %v; want the record kept", broken, err)
			}
			if broken, err := p.BreakStaged(id, "node-b", start); err != nil || !broken {
				t.Errorf("BreakStaged through the fenced incarnation = %v, %v; want it broken", broken, err)
			}
			unlock()
			if entries, err := p.StagedOn(id); err != nil || len(entries) != 0 {
				t.Errorf("staged records after the fence: %v, %v; want none", entries, err)
			}

			// The fenced node keeps writing: its device still takes it.
			writeSynced(t, dev, 1<<20, 'b')
			got, err := os.ReadFile(image)
			if err != nil {
				t.Fatal(err)
			}
			if int64(len(got)) != size {
				t.Fatalf("the fenced image is %d bytes, want %d", len(got), size)
			}
			if !bytes.Equal(got[:1<<20], bytes.Repeat([]byte{'a'}, 1<<20)) {
				t.Error("a write acknowledged before the fence is not in the fenced image")
			}
			if bytes.IndexByte(got[1<<20:], 'b') >= 0 {
				t.Error("a write after the fence reached the image")
			}
			// No temporary is left; the image is the volume's, readable
			// by its record.
			names, err := p.vols.names()
			if err != nil {
				t.Fatal(err)
			}
			for _, n := range names {
				if strings.HasPrefix(n, ".") {
					t.Errorf("the fence left %s", n)
				}
			}
			if _, err := p.ReadVolume(id); err != nil {
				t.Errorf("ReadVolume after the fence: %v", err)
			}
		})
	}
}

// TestFenceImageRefusedWithoutSpace: without reflink a fence is a full copy;
// a pool without room for it refuses with ErrNoSpace and changes nothing.
func TestFenceImageRefusedWithoutSpace(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: mounts an ext4")
	}
	p := ext4Pool(t, 128<<20)
	u, err := p.Usage()
	if err != nil {
		t.Fatal(err)
	}
	v, err := p.CreateVolume(t.Context(), spec("big", (u.AvailableBytes/2+8<<20)&^(1<<20-1)))
	if err != nil {
		t.Fatal(err)
	}
	id, _ := ParseVolumeID(v.ID)
	before, err := os.Stat(p.ImagePath(id))
	if err != nil {
		t.Fatal(err)
	}
	unlock, err := p.Lock(id)
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	if _, err := p.FenceImage(t.Context(), id, nil, nil); err == nil || !strings.Contains(err.Error(), "no reflink") {
		t.Fatalf("a fence that needs a copy the pool cannot hold = %v, want ErrNoSpace saying why", err)
	} else {
		t.Logf("refused: %v", err)
	}
	after, err := os.Stat(p.ImagePath(id))
	if err != nil || !os.SameFile(before, after) {
		t.Fatalf("the refused fence changed the image: %v", err)
	}
}

// TestFenceByCopyWrittenMeanwhile: the node a fence by copy fences comes
// back during the copy and writes through its loop device. The copy is
// thrown away (ErrWrittenDuringFence): the image stays the volume, with
// that write, and nothing of the fence is left.
func TestFenceByCopyWrittenMeanwhile(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: mounts an ext4 and attaches a loop device")
	}
	p := ext4Pool(t, 256<<20)
	v, err := p.CreateVolume(t.Context(), spec("returning", 32<<20))
	if err != nil {
		t.Fatal(err)
	}
	id, _ := ParseVolumeID(v.ID)
	image := p.ImagePath(id)
	before, err := os.Stat(image)
	if err != nil {
		t.Fatal(err)
	}
	dev := attachLoop(t, image)
	writeSynced(t, dev, 0, 'a')

	unlock, err := p.Lock(id)
	if err != nil {
		t.Fatal(err)
	}
	wrote := false
	_, err = p.FenceImage(t.Context(), id, nil, func(done, total int64) {
		if !wrote {
			wrote = true
			writeSynced(t, dev, 1<<20, 'b') // the node is back
		}
	})
	unlock()
	if !wrote {
		t.Fatal("the fence made no copy (no progress heard)")
	}
	if !errors.Is(err, ErrWrittenDuringFence) {
		t.Fatalf("a fence by copy of an image written meanwhile = %v, want ErrWrittenDuringFence", err)
	}
	t.Logf("refused: %v", err)
	after, err := os.Stat(image)
	if err != nil || !os.SameFile(before, after) {
		t.Fatalf("the thrown-away fence replaced the image: %v", err)
	}
	got, err := os.ReadFile(image)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got[:1<<20], bytes.Repeat([]byte{'a'}, 1<<20)) || !bytes.Equal(got[1<<20:2<<20], bytes.Repeat([]byte{'b'}, 1<<20)) {
		t.Error("the image lost a write: before the fence or during it")
	}
	names, err := p.vols.names()
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if strings.HasPrefix(n, ".") {
			t.Errorf("the thrown-away fence left %s", n)
		}
	}
}
