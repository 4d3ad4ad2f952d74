package controller

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/loopvol/loopvol/pkg/loop/looptest"
	"github.com/loopvol/loopvol/pkg/pool"
	"github.com/loopvol/loopvol/pkg/volspec/volspectest"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// twoControllers opens one pool directory twice, as two controller
// processes sharing it would: each server has its own in-process locks, so
// only the pool's file locks keep them apart.
func twoControllers(t *testing.T, dir string, reserve int64) [2]*Server {
	t.Helper()
	var out [2]*Server
	for i := range out {
		p, err := pool.Open(pool.Options{Name: "shared", Zone: "z", Path: dir, ReserveBytes: reserve})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		s, err := New(Config{Pools: []*pool.Pool{p}})
		if err != nil {
			t.Fatal(err)
		}
		out[i] = s
	}
	return out
}

// TestTwoControllersCreateSameNames: both controllers create the same names
// at once, over and over. Every name ends up with one volume and one image,
// every success names that volume, and no image is replaced after a
// CreateVolume returned it.
func TestTwoControllersCreateSameNames(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pool")
	ctrls := twoControllers(t, dir, 0)
	c := ctx(t)
	const names, rounds = 20, 4
	type seen struct {
		id  string
		ino uint64
	}
	var mu sync.Mutex
	returned := map[string]seen{}
	var wg sync.WaitGroup
	for _, s := range ctrls {
		for g := 0; g < 2; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for r := 0; r < rounds; r++ {
					for n := 0; n < names; n++ {
						name := fmt.Sprintf("pvc-%d", n)
						resp, err := s.CreateVolume(c, createReq(name, 4*mib, volspectest.Block(snw)))
						if status.Code(err) == codes.Aborted {
							continue // the other one is creating it: retry later, as a CO does
						}
						if err != nil {
							t.Errorf("CreateVolume %s: %v", name, err)
							return
						}
						id, _ := pool.ParseVolumeID(resp.Volume.VolumeId)
						var st unix.Stat_t
						if err := unix.Stat(filepath.Join(dir, "volumes", id.Hash+".img"), &st); err != nil {
							t.Errorf("image of %s after CreateVolume returned: %v", name, err)
							return
						}
						mu.Lock()
						if prev, ok := returned[name]; ok && (prev.id != id.String() || prev.ino != st.Ino) {
							t.Errorf("%s: returned as %s (inode %d), before as %s (inode %d): the image was replaced", name, id, st.Ino, prev.id, prev.ino)
						}
						returned[name] = seen{id: id.String(), ino: st.Ino}
						mu.Unlock()
					}
				}
			}()
		}
	}
	wg.Wait()
	images, _ := filepath.Glob(filepath.Join(dir, "volumes", "*.img"))
	records, _ := filepath.Glob(filepath.Join(dir, "volumes", "*.json"))
	if len(images) != names || len(records) != names || len(returned) != names {
		t.Fatalf("%d images, %d records, %d names returned; want %d of each", len(images), len(records), len(returned), names)
	}
	for name, got := range returned {
		var st unix.Stat_t
		id, _ := pool.ParseVolumeID(got.id)
		if err := unix.Stat(filepath.Join(dir, "volumes", id.Hash+".img"), &st); err != nil || st.Ino != got.ino {
			t.Errorf("%s: image now inode %d (%v), returned inode %d", name, st.Ino, err, got.ino)
		}
	}
}

// TestParallelCreatesKeepTheReserve: many creates of different names on two
// controllers at once, with room for only some of them: the pool's free
// space never falls below its reserve, and every refusal is
// RESOURCE_EXHAUSTED.
func TestParallelCreatesKeepTheReserve(t *testing.T) {
	dir := looptest.Tmpfs(t, "64m") // exact free space, nothing else writes there
	const reserve = 16 * mib
	ctrls := twoControllers(t, dir, reserve)
	c := ctx(t)
	var wg sync.WaitGroup
	var mu sync.Mutex
	made, refused := 0, 0
	for i := 0; i < 24; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := ctrls[i%2].CreateVolume(c, createReq(fmt.Sprintf("v-%d", i), 4*mib, volspectest.Block(snw)))
			mu.Lock()
			defer mu.Unlock()
			switch status.Code(err) {
			case codes.OK:
				made++
			case codes.ResourceExhausted:
				refused++
			default:
				t.Errorf("CreateVolume v-%d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	free := int64(st.Bavail) * st.Bsize
	t.Logf("%d created, %d refused, %d bytes free, reserve %d", made, refused, free, reserve)
	if free < reserve {
		t.Fatalf("free space %d fell below the reserve %d: %d volumes were created", free, reserve, made)
	}
	if made == 0 || refused == 0 || int64(made) > (64*mib-reserve)/(4*mib) {
		t.Fatalf("%d created, %d refused; want some of each, at most %d created", made, refused, (64*mib-reserve)/(4*mib))
	}
}

// TestDeleteWithUnreadableRecord: a volume whose record cannot be read is
// not deleted while a node serves its pool (it may be attached and staged
// there); the error says how to make the intent explicit, and after that
// the delete goes through.
func TestDeleteWithUnreadableRecord(t *testing.T) {
	f := newFixture(t, map[string]string{"a": "z1"})
	f.addNode(t, "a", "n1", 0)
	c := ctx(t)
	p := f.pools["a"]
	cap := volspectest.Mount("ext4", snw)
	resp, err := f.s.CreateVolume(c, createReq("in-use", 16*mib, cap))
	if err != nil {
		t.Fatal(err)
	}
	id, _ := pool.ParseVolumeID(resp.Volume.VolumeId)
	if _, err := f.s.ControllerPublishVolume(c, &csi.ControllerPublishVolumeRequest{VolumeId: id.String(), NodeId: "n1", VolumeCapability: cap}); err != nil {
		t.Fatal(err)
	}
	rec := filepath.Join(p.Path, "volumes", id.Hash+".json")
	for _, corrupt := range []func() error{
		func() error { return os.WriteFile(rec, []byte(`{"id": "a.`), 0o600) },
		func() error { os.Remove(rec); return unix.Mkfifo(rec, 0o600) },
		func() error { os.Remove(rec); return os.Symlink("/etc/hostname", rec) },
	} {
		if err := corrupt(); err != nil {
			t.Fatal(err)
		}
		_, err = f.s.DeleteVolume(c, &csi.DeleteVolumeRequest{VolumeId: id.String()})
		wantCode(t, err, codes.FailedPrecondition)
		for _, want := range []string{"n1", "losetup -j " + p.ImagePath(id), "mv " + rec} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("the refusal does not say %q: %v", want, err)
			}
		}
		if _, err := os.Stat(p.ImagePath(id)); err != nil {
			t.Fatalf("the image went: %v", err)
		}
		os.Remove(rec)
	}
	// The operator checked the nodes and moved the record aside: intent is
	// explicit.
	if _, err := f.s.DeleteVolume(c, &csi.DeleteVolumeRequest{VolumeId: id.String()}); err != nil {
		t.Fatal(err)
	}
	if left := f.files(t); len(left) != 3 {
		t.Fatalf("left after the delete: %v (want the marker, the pool lock and the node record)", left)
	}
}

// TestParameterBounds: parameters within Kubernetes' StorageClass bounds
// are accepted, beyond them refused; only the parameters loopvol uses are
// stored in the record.
func TestParameterBounds(t *testing.T) {
	f := newFixture(t, map[string]string{"a": "z1"})
	c := ctx(t)
	many := map[string]string{}
	for i := 0; i < maxParameters+1; i++ {
		many[fmt.Sprintf("csi.storage.k8s.io/k%d", i)] = "v"
	}
	tests := []struct {
		name   string
		params map[string]string
		code   codes.Code
	}{
		{name: "Kubernetes metadata", params: map[string]string{"csi.storage.k8s.io/pvc/name": "data", "csi.storage.k8s.io/pvc/namespace": "ns", "csi.storage.k8s.io/pv/name": "pvc-1", "pool": "a"}},
		{name: "largest total", params: map[string]string{"csi.storage.k8s.io/x": strings.Repeat("v", maxParametersBytes-len("csi.storage.k8s.io/x"))}},
		{name: "total over 256 KiB", params: map[string]string{"csi.storage.k8s.io/x": strings.Repeat("v", maxParametersBytes)}, code: codes.InvalidArgument},
		{name: "513 entries", params: many, code: codes.InvalidArgument},
		{name: "empty key", params: map[string]string{"": "v"}, code: codes.InvalidArgument},
		{name: "key too long", params: map[string]string{"csi.storage.k8s.io/" + strings.Repeat("k", maxParameterKeyLen): "v"}, code: codes.InvalidArgument},
		{name: "PVC name too long", params: map[string]string{"csi.storage.k8s.io/pvc/name": strings.Repeat("n", 254)}, code: codes.InvalidArgument},
		{name: "unknown key", params: map[string]string{"size": "1"}, code: codes.InvalidArgument},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := createReq(fmt.Sprintf("p-%d", i), 16*mib)
			req.Parameters = tc.params
			resp, err := f.s.CreateVolume(c, req)
			wantCode(t, err, tc.code)
			if _, err := f.s.GetCapacity(c, &csi.GetCapacityRequest{Parameters: tc.params}); status.Code(err) != tc.code {
				t.Errorf("GetCapacity: %v, want %v", err, tc.code)
			}
			if err != nil {
				return
			}
			id, _ := pool.ParseVolumeID(resp.Volume.VolumeId)
			v, err := f.pools["a"].ReadVolume(id)
			if err != nil {
				t.Fatal(err)
			}
			for k := range v.Parameters {
				if !recordedParameters[k] {
					t.Errorf("the record stores parameter %q", k)
				}
			}
			if st, _ := os.Stat(filepath.Join(f.pools["a"].Path, "volumes", id.Hash+".json")); st.Size() > 4096 {
				t.Errorf("record is %d bytes", st.Size())
			}
		})
	}
}
