package driver

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"github.com/loopvol/loopvol/internal/harness/testfs"
	"github.com/loopvol/loopvol/pkg/fenceapi"
	"github.com/loopvol/loopvol/test/internal/driverproc"
)

// TestForceDetachFences: a ControllerUnpublishVolume while the node still
// has the volume staged and written is one the CO forced (a node that
// stopped answering, an out-of-service taint). On a shared pool with
// reflink the detach fences the volume before it answers: node B, still
// writing, no longer reaches it; node A can attach and stage it at once and
// finds every write B had synced before the fence and none after; what B
// writes later changes nothing of the image; B's unstage then cleans up
// its side without touching the volume. On a pool without reflink the
// detach refuses (a copy under B's writes would be no consistent image)
// and so does an attach to A, until B unstages.
func TestForceDetachFences(t *testing.T) {
	t.Run("reflink", func(t *testing.T) {
		addr := freeAddress(t)
		c := newClusterOn(t, func(dir, pool string) {
			testfs.MountReflinkXFS(t, filepath.Join(dir, "pool.xfs"), pool, 4*gib) // sparse
		}, "--http-endpoint="+addr)
		cap := mountCap(snw, "ext4")
		id := c.create(t, "pvc-fenced", 128*mib, cap)
		if err := c.publish(t, id, "node-b", cap); err != nil {
			t.Fatal(err)
		}
		targetB := c.stagePublish(t, c.nodeB, c.kubeletB, id, cap, false)
		before := writeRandom(t, filepath.Join(targetB, "before"), 4<<20)

		if _, err := c.ctrl.ControllerUnpublishVolume(bg(), &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: "node-b"}); err != nil {
			t.Fatalf("ControllerUnpublishVolume while node-b has it staged: %v", err)
		}
		// B goes on writing, and its writes succeed: they reach the old
		// image, which is no longer the volume.
		writeRandom(t, filepath.Join(targetB, "after"), 4<<20)

		if err := c.publish(t, id, "node-a", cap); err != nil {
			t.Fatalf("attach to node-a right after the fence: %v", err)
		}
		targetA := c.stagePublish(t, c.nodeA, c.kubeletA, id, cap, false) // mount-utils fscks it first
		if got := checksum(t, filepath.Join(targetA, "before")); !bytes.Equal(got, before) {
			t.Error("node-a reads another 'before' than node-b synced before the fence")
		}
		if _, err := os.Stat(filepath.Join(targetA, "after")); !os.IsNotExist(err) {
			t.Errorf("node-a sees what node-b wrote after the fence: stat = %v", err)
		}
		writeRandom(t, filepath.Join(targetA, "on-a"), 1<<20)
		c.unpublishUnstage(t, c.nodeA, c.kubeletA, id)
		image := filepath.Join(c.pool, "volumes", filepath.Ext(id)[1:]+".img")
		sum := checksum(t, image)

		// B keeps writing into what it has; the image does not change.
		writeRandom(t, filepath.Join(targetB, "later"), 4<<20)
		if out, err := exec.Command("sync").CombinedOutput(); err != nil {
			t.Fatalf("sync: %v: %s", err, out)
		}
		if !bytes.Equal(checksum(t, image), sum) {
			t.Fatal("node-b's writes after the fence changed the volume's image")
		}
		// B comes back to its senses (kubelet unpublishes and unstages):
		// its fenced device goes, the volume stays as it is.
		c.unpublishUnstage(t, c.nodeB, c.kubeletB, id)
		if !bytes.Equal(checksum(t, image), sum) {
			t.Fatal("node-b's unstage of its fenced volume changed the volume's image")
		}
		if _, err := os.Stat(filepath.Join(c.pool, "staged", filepath.Ext(id)[1:]+".node-b.json")); !os.IsNotExist(err) {
			t.Errorf("node-b's staged record is still there: %v", err)
		}

		metrics := scrape(t, "http://"+addr+"/metrics")
		for _, want := range []string{
			`loopvol_fenced_volumes_total{method="reflink",pool="shared"} 1`,
			`loopvol_fence_duration_seconds_count{method="reflink"} 1`,
		} {
			if !strings.Contains(metrics, want) {
				t.Errorf("metrics lack %s", want)
			}
		}
		if _, err := c.ctrl.ControllerUnpublishVolume(bg(), &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: "node-a"}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.ctrl.DeleteVolume(bg(), &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("no-reflink", func(t *testing.T) {
		c := newCluster(t)
		cap := mountCap(snw, "ext4")
		id := c.create(t, "pvc-unfenced", 64*mib, cap)
		if err := c.publish(t, id, "node-b", cap); err != nil {
			t.Fatal(err)
		}
		targetB := c.stagePublish(t, c.nodeB, c.kubeletB, id, cap, false)
		data := writeRandom(t, filepath.Join(targetB, "data"), 1<<20)
		_, err := c.ctrl.ControllerUnpublishVolume(bg(), &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: "node-b"})
		wantCode(t, "a forced detach on a pool without reflink", err, codes.FailedPrecondition)
		if !strings.Contains(err.Error(), "no reflink") {
			t.Errorf("the refusal does not say why: %v", err)
		}
		t.Logf("refused: %v", err)
		err = c.publish(t, id, "node-a", cap)
		wantCode(t, "attach to node-a while node-b, detached, still has it staged", err, codes.FailedPrecondition)
		if !strings.Contains(err.Error(), "still has it staged") {
			t.Errorf("the refusal does not say why: %v", err)
		}
		// Once B unstages, the detach is done and A may have it.
		c.unpublishUnstage(t, c.nodeB, c.kubeletB, id)
		if _, err := c.ctrl.ControllerUnpublishVolume(bg(), &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: "node-b"}); err != nil {
			t.Fatalf("ControllerUnpublishVolume once node-b unstaged: %v", err)
		}
		if err := c.publish(t, id, "node-a", cap); err != nil {
			t.Fatal(err)
		}
		targetA := c.stagePublish(t, c.nodeA, c.kubeletA, id, cap, false)
		if !bytes.Equal(checksum(t, filepath.Join(targetA, "data")), data) {
			t.Error("node-a reads other data than node-b wrote")
		}
		c.unpublishUnstage(t, c.nodeA, c.kubeletA, id)
		if _, err := c.ctrl.ControllerUnpublishVolume(bg(), &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: "node-a"}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.ctrl.DeleteVolume(bg(), &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
			t.Fatal(err)
		}
	})
}

// freeAddress returns a loopback address with a port free at the time.
func freeAddress(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func scrape(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(body)
}

// TestFenceRaces: FenceNode (what the fencing controller calls) from two
// controller processes at once fences each volume once, and one killed with
// SIGKILL in the middle of a fence by copy leaves the volume as it was; the
// retry fences it. Either way the volume ends as one image, fsck-clean,
// with every byte the fenced node had synced, and the node's records gone.
// The pool is a plain directory of the test's ext4 (no reflink): the fence
// is a full copy, long enough to be killed in.
func TestFenceRaces(t *testing.T) {
	c := newCluster(t)
	dir := filepath.Join(c.dir, "ctrl-2")
	if err := os.MkdirAll(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	second := driverproc.Start(t, dir, "--mode=controller", "--zone=shared", "--pool=shared="+c.pool)
	fencers := []*fenceapi.Client{fenceapi.NewClient(c.a.Conn), fenceapi.NewClient(second.Conn)}
	cap := mountCap(snw, "ext4")
	type vol struct {
		id   string
		data []byte
	}
	stageOnB := func(name string, size int64, fill int) vol {
		t.Helper()
		id := c.create(t, name, size, cap)
		if err := c.publish(t, id, "node-b", cap); err != nil {
			t.Fatal(err)
		}
		target := c.stagePublish(t, c.nodeB, c.kubeletB, id, cap, false)
		return vol{id, writeRandom(t, filepath.Join(target, "data"), fill)}
	}
	// checkOnA: the fenced volume, detached from B, staged on A (fsck'd by
	// mount-utils) holds B's data; then B cleans up its side.
	checkOnA := func(v vol) {
		t.Helper()
		if _, err := c.ctrl.ControllerUnpublishVolume(bg(), &csi.ControllerUnpublishVolumeRequest{VolumeId: v.id, NodeId: "node-b"}); err != nil {
			t.Fatalf("detach from the fenced node: %v", err)
		}
		if err := c.publish(t, v.id, "node-a", cap); err != nil {
			t.Fatal(err)
		}
		target := c.stagePublish(t, c.nodeA, c.kubeletA, v.id, cap, false)
		if !bytes.Equal(checksum(t, filepath.Join(target, "data")), v.data) {
			t.Errorf("%s: node A reads other data than B synced before the fence", v.id)
		}
		c.unpublishUnstage(t, c.nodeA, c.kubeletA, v.id)
		c.unpublishUnstage(t, c.nodeB, c.kubeletB, v.id)
		if _, err := os.Stat(filepath.Join(c.pool, "staged", volumeHash(v.id)+".node-b.json")); !os.IsNotExist(err) {
			t.Errorf("%s: node B's staged record is still there: %v", v.id, err)
		}
	}

	t.Run("two controllers at once", func(t *testing.T) {
		vols := []vol{stageOnB("pvc-race-1", 64*mib, 8<<20), stageOnB("pvc-race-2", 64*mib, 8<<20)}
		replaced := map[string]int{}
		var mu sync.Mutex
		var wg sync.WaitGroup
		for _, f := range fencers {
			wg.Go(func() {
				// Retried while a volume's lock is the other's, as the
				// fencing controller retries.
				for try := 0; try < 50; try++ {
					resp, err := f.FenceNode(bg(), &fenceapi.FenceNodeRequest{NodeID: "node-b", AllowCopy: true})
					if err != nil {
						t.Errorf("FenceNode: %v", err)
						return
					}
					busy := false
					mu.Lock()
					for _, v := range resp.Volumes {
						if v.Method != "" {
							replaced[v.VolumeID]++
						}
						busy = busy || v.Error != ""
					}
					mu.Unlock()
					if !busy {
						return
					}
					time.Sleep(20 * time.Millisecond)
				}
				t.Error("FenceNode kept failing")
			})
		}
		wg.Wait()
		for _, v := range vols {
			if replaced[v.id] != 1 {
				t.Errorf("%s: its image was replaced %d times by the two controllers, want once", v.id, replaced[v.id])
			}
			checkOnA(v)
		}
	})

	t.Run("killed mid-fence", func(t *testing.T) {
		v := stageOnB("pvc-killed", 1*gib, 256<<20)
		image := filepath.Join(c.pool, "volumes", volumeHash(v.id)+".img")
		before := inodeOf(t, image)
		go fencers[1].FenceNode(bg(), &fenceapi.FenceNodeRequest{NodeID: "node-b", AllowCopy: true}) // killed under it
		waitFenceCopy(t, c.pool, v.id)
		second.Kill()
		<-second.Done()
		if inodeOf(t, image) != before {
			t.Fatal("a fence killed during its copy replaced the image")
		}
		if _, err := os.Stat(filepath.Join(c.pool, "staged", volumeHash(v.id)+".node-b.json")); err != nil {
			t.Fatalf("a fence killed before its rename broke the node's record: %v", err)
		}
		resp, err := fencers[0].FenceNode(bg(), &fenceapi.FenceNodeRequest{NodeID: "node-b", AllowCopy: true})
		if err != nil || len(resp.Volumes) != 1 || !resp.Volumes[0].Fenced || resp.Volumes[0].Method != "copy" {
			t.Fatalf("FenceNode after the kill = %+v, %v; want the volume fenced by copy", resp, err)
		}
		if inodeOf(t, image) == before {
			t.Fatal("the retried fence left the old image")
		}
		checkOnA(v)
	})

	// The node comes back (thawed, its link up) while a fence by copy
	// copies its volume, and writes: the copy is thrown away, the image
	// stays the volume with every write, and the node goes on with it.
	t.Run("node back during the fence", func(t *testing.T) {
		v := stageOnB("pvc-back", 1*gib, 256<<20)
		image := filepath.Join(c.pool, "volumes", volumeHash(v.id)+".img")
		before := inodeOf(t, image)
		fenced := make(chan *fenceapi.FenceNodeResponse, 1)
		go func() {
			resp, err := fencers[0].FenceNode(bg(), &fenceapi.FenceNodeRequest{NodeID: "node-b", AllowCopy: true})
			if err != nil {
				t.Errorf("FenceNode: %v", err)
			}
			fenced <- resp
		}()
		waitFenceCopy(t, c.pool, v.id)
		// Node B writes until the fence answers, each write synced.
		_, target := paths(c.kubeletB, filepath.Base(v.id))
		var back []byte
		var resp *fenceapi.FenceNodeResponse
		for writes := 0; resp == nil; writes++ {
			back = writeRandom(t, filepath.Join(target, "back"), 64<<10)
			select {
			case resp = <-fenced:
				t.Logf("node B synced %d writes during the fence", writes+1)
			default:
			}
		}
		if len(resp.Volumes) != 1 || resp.Volumes[0].Fenced || !strings.Contains(resp.Volumes[0].Error, "written while the fence copied it") {
			t.Fatalf("FenceNode while the node writes again = %+v; want the volume not fenced, its error saying it was written during the copy", resp.Volumes)
		}
		if inodeOf(t, image) != before {
			t.Fatal("a fence whose copy was written meanwhile replaced the image")
		}
		if tmps, _ := filepath.Glob(filepath.Join(c.pool, "volumes", "."+volumeHash(v.id)+".img.tmp-*")); len(tmps) > 0 {
			t.Errorf("the thrown-away fence left %v", tmps)
		}
		if _, err := os.Stat(filepath.Join(c.pool, "staged", volumeHash(v.id)+".node-b.json")); err != nil {
			t.Fatalf("the thrown-away fence broke the node's record: %v", err)
		}
		// B goes on and later lets go as usual; A then has all of it.
		c.unpublishUnstage(t, c.nodeB, c.kubeletB, v.id)
		if _, err := c.ctrl.ControllerUnpublishVolume(bg(), &csi.ControllerUnpublishVolumeRequest{VolumeId: v.id, NodeId: "node-b"}); err != nil {
			t.Fatalf("detach from node B: %v", err)
		}
		if inodeOf(t, image) != before {
			t.Fatal("the detach of an unstaged volume replaced the image")
		}
		if err := c.publish(t, v.id, "node-a", cap); err != nil {
			t.Fatal(err)
		}
		onA := c.stagePublish(t, c.nodeA, c.kubeletA, v.id, cap, false)
		if !bytes.Equal(checksum(t, filepath.Join(onA, "data")), v.data) || !bytes.Equal(checksum(t, filepath.Join(onA, "back")), back) {
			t.Error("node A reads other data than node B synced before and during the fence")
		}
		c.unpublishUnstage(t, c.nodeA, c.kubeletA, v.id)
	})
}

// waitFenceCopy waits until a fence's copy of volume id's image is being
// made in the pool directory.
func waitFenceCopy(t *testing.T, poolDir, id string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		if tmps, _ := filepath.Glob(filepath.Join(poolDir, "volumes", "."+volumeHash(id)+".img.tmp-*")); len(tmps) > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the fence's copy never appeared")
		}
		time.Sleep(time.Millisecond)
	}
}

func inodeOf(t *testing.T, path string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}
