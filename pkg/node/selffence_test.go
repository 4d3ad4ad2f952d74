package node

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/loopvol/loopvol/pkg/pool"
	"github.com/loopvol/loopvol/pkg/volspec/volspectest"
)

// fakeFreezer freezes fake mounts by mount point, as the kernel would: a
// second freeze finds it frozen, a thaw of what is not frozen does nothing.
// It counts the shutdowns of each mount point (shutDown thaws as well).
type fakeFreezer struct {
	mu     sync.Mutex
	frozen map[string]bool
	shut   map[string]int
}

func (z *fakeFreezer) freeze(e mountEntry) (bool, error) {
	z.mu.Lock()
	defer z.mu.Unlock()
	already := z.frozen[e.path]
	z.frozen[e.path] = true
	return already, nil
}

func (z *fakeFreezer) thaw(e mountEntry, _ int) (bool, error) {
	z.mu.Lock()
	defer z.mu.Unlock()
	was := z.frozen[e.path]
	delete(z.frozen, e.path)
	return was, nil
}

func (z *fakeFreezer) shutDown(e mountEntry) (bool, error) {
	z.mu.Lock()
	defer z.mu.Unlock()
	if z.shut == nil {
		z.shut = map[string]int{}
	}
	z.shut[e.path]++
	was := z.frozen[e.path]
	delete(z.frozen, e.path)
	return was, nil
}

// shutDowns returns how often the filesystem at path was shut down.
func (z *fakeFreezer) shutDowns(path string) int {
	z.mu.Lock()
	defer z.mu.Unlock()
	return z.shut[path]
}

func (z *fakeFreezer) isFrozen(path string) bool {
	z.mu.Lock()
	defer z.mu.Unlock()
	return z.frozen[path]
}

// frozenMounts is a fake mount table whose unmount of a frozen filesystem
// fails, where the kernel's would block.
type frozenMounts struct {
	fakeMounts
	z *fakeFreezer
}

func (m frozenMounts) unmount(r *resolved) error {
	if m.z.isFrozen(r.path) {
		return fmt.Errorf("unmount %s: the filesystem is frozen (the kernel would block)", r.path)
	}
	return m.fakeMounts.unmount(r)
}

// selfFenceFixture is a fixture whose pool p1 is shared (node-b serves it
// too), with a second, local pool and a fake freezer.
type selfFenceFixture struct {
	*fixture
	local  *pool.Pool
	frozen *fakeFreezer
}

func newSelfFenceFixture(t *testing.T) *selfFenceFixture {
	t.Helper()
	f := newFixture(t)
	local, err := pool.Open(pool.Options{Name: "local", Zone: testZone, Path: filepath.Join(t.TempDir(), "local")})
	if err != nil {
		t.Fatal(err)
	}
	z := &fakeFreezer{frozen: map[string]bool{}}
	f.cfg.Pools = map[string]*pool.Pool{"p1": f.pool, "local": local}
	f.cfg.freezer = z
	f.cfg.mounts = frozenMounts{fakeMounts: fakeMounts{m: f.mounter}, z: z}
	if f.srv, err = New(f.cfg); err != nil {
		t.Fatal(err)
	}
	if err := f.pool.WriteNode(pool.NodeRecord{ID: "node-b", Zone: testZone, LastStart: time.Now().UTC()}); err != nil {
		t.Fatal(err)
	}
	return &selfFenceFixture{fixture: f, local: local, frozen: z}
}

// volumeIn creates a volume attached to this node in pool p.
func (f *selfFenceFixture) volumeIn(p *pool.Pool, name, accessType string) pool.VolumeID {
	f.t.Helper()
	id := pool.DeriveVolumeID(p.Name, name)
	unlock, err := p.Lock(id)
	if err != nil {
		f.t.Fatal(err)
	}
	defer unlock()
	v, err := p.CreateVolume(f.ctx, pool.VolumeSpec{Name: name, SizeBytes: 16 * mib, AccessType: accessType})
	if err != nil {
		f.t.Fatal(err)
	}
	v.Attachments = []pool.Attachment{{Node: testNode}}
	if err := p.WriteVolume(v); err != nil {
		f.t.Fatal(err)
	}
	return id
}

func (f *selfFenceFixture) stage(id pool.VolumeID, block bool) *csi.NodeStageVolumeRequest {
	f.t.Helper()
	req := f.stageReq(id, f.capability(block))
	if _, err := f.srv.NodeStageVolume(f.ctx, req); err != nil {
		f.t.Fatalf("NodeStageVolume %s: %v", id, err)
	}
	return req
}

func (f *selfFenceFixture) capability(block bool) *csi.VolumeCapability {
	if block {
		return volspectest.Block(snw)
	}
	return volspectest.Mount("", snw)
}

// TestSelfFence: SelfFence freezes the filesystems of the shared pool's
// staged volumes, not the local pool's nor a raw block volume; stages and
// publishes of shared-pool volumes are refused with UNAVAILABLE meanwhile,
// a local pool's are served; EndSelfFence thaws and serves them again.
func TestSelfFence(t *testing.T) {
	f := newSelfFenceFixture(t)
	shared := f.volumeIn(f.pool, "shared", pool.AccessMount)
	block := f.volumeIn(f.pool, "block", pool.AccessBlock)
	local := f.volumeIn(f.local, "local", pool.AccessMount)
	later := f.volumeIn(f.pool, "later", pool.AccessMount)
	localLater := f.volumeIn(f.local, "local-later", pool.AccessMount)
	sharedStage := f.stage(shared, false)
	f.stage(block, true)
	localStage := f.stage(local, false)

	f.srv.SelfFence(f.ctx)
	if !f.srv.SelfFenced() {
		t.Error("not self-fenced after SelfFence")
	}
	if !f.frozen.isFrozen(sharedStage.StagingTargetPath) {
		t.Error("the shared pool's volume is not frozen")
	}
	if f.frozen.isFrozen(localStage.StagingTargetPath) {
		t.Error("the local pool's volume is frozen")
	}
	if n := len(f.frozen.frozen); n != 1 {
		t.Errorf("%d filesystems frozen, want 1: %v", n, f.frozen.frozen)
	}

	_, err := f.srv.NodeStageVolume(f.ctx, f.stageReq(later, f.capability(false)))
	wantError(t, err, codes.Unavailable, "cannot renew its heartbeat", "stopped I/O to shared-pool volumes")
	_, err = f.srv.NodePublishVolume(f.ctx, f.publishReq(shared, f.capability(false), "pod1"))
	wantError(t, err, codes.Unavailable, "cannot renew its heartbeat")
	if mps := f.mountsAt(f.path("pods", "pod1")); len(mps) != 0 {
		t.Errorf("a refused publish mounted %v", mps)
	}
	f.stage(localLater, false)
	if _, err := f.srv.NodePublishVolume(f.ctx, f.publishReq(local, f.capability(false), "pod-local")); err != nil {
		t.Errorf("publish of a local pool's volume while self-fenced: %v", err)
	}

	f.srv.EndSelfFence(f.ctx)
	if f.srv.SelfFenced() {
		t.Error("still self-fenced after EndSelfFence")
	}
	if len(f.frozen.frozen) != 0 {
		t.Errorf("frozen after EndSelfFence: %v", f.frozen.frozen)
	}
	f.stage(later, false)
	if _, err := f.srv.NodePublishVolume(f.ctx, f.publishReq(shared, f.capability(false), "pod1")); err != nil {
		t.Errorf("publish after EndSelfFence: %v", err)
	}
}

// TestSelfFencedVolumeFencedShutDown: a volume fenced while the node was
// self-fenced is shut down by EndSelfFence, then thawed (its writes would
// go nowhere, and frozen its writers could not exit); its unstage unmounts
// and cleans it up, and the unstage of a volume a self-fence left frozen
// thaws it first.
func TestSelfFencedVolumeFencedShutDown(t *testing.T) {
	f := newSelfFenceFixture(t)
	fenced := f.volumeIn(f.pool, "fenced", pool.AccessMount)
	kept := f.volumeIn(f.pool, "kept", pool.AccessMount)
	fencedStage, keptStage := f.stage(fenced, false), f.stage(kept, false)

	f.srv.SelfFence(f.ctx)
	f.fence(fenced)
	f.srv.EndSelfFence(f.ctx)
	if n := f.frozen.shutDowns(fencedStage.StagingTargetPath); n != 1 {
		t.Errorf("the fenced volume was shut down %d times, want once", n)
	}
	if f.frozen.isFrozen(fencedStage.StagingTargetPath) {
		t.Error("the fenced volume is still frozen after its shutdown")
	}
	if f.frozen.isFrozen(keptStage.StagingTargetPath) {
		t.Error("the volume that was not fenced is still frozen")
	}
	if n := f.frozen.shutDowns(keptStage.StagingTargetPath); n != 0 {
		t.Errorf("the volume that was not fenced was shut down %d times", n)
	}

	for _, req := range []*csi.NodeStageVolumeRequest{fencedStage, keptStage} {
		if _, err := f.srv.NodeUnstageVolume(f.ctx, &csi.NodeUnstageVolumeRequest{VolumeId: req.VolumeId, StagingTargetPath: req.StagingTargetPath}); err != nil {
			t.Fatalf("NodeUnstageVolume %s: %v", req.VolumeId, err)
		}
		if mps := f.mountsAt(req.StagingTargetPath); len(mps) != 0 || f.frozen.isFrozen(req.StagingTargetPath) {
			t.Errorf("%s after the unstage: mounts %v, frozen %t", req.VolumeId, mps, f.frozen.isFrozen(req.StagingTargetPath))
		}
	}
	if devs, _ := f.loop.List(); len(devs) != 0 {
		t.Errorf("loop devices after the unstages: %v", devs)
	}

	// Frozen by a self-fence still in force: the unstage thaws it too.
	again := f.stage(kept, false)
	f.srv.SelfFence(f.ctx)
	if !f.frozen.isFrozen(again.StagingTargetPath) {
		t.Fatal("not frozen by the second self-fence")
	}
	if _, err := f.srv.NodeUnstageVolume(f.ctx, &csi.NodeUnstageVolumeRequest{VolumeId: again.VolumeId, StagingTargetPath: again.StagingTargetPath}); err != nil {
		t.Fatalf("NodeUnstageVolume while self-fenced: %v", err)
	}
	f.srv.EndSelfFence(f.ctx)
}

// TestStageDuringSelfFence: a stage already under way when the node
// self-fences freezes what it mounted and answers UNAVAILABLE; SelfFence,
// which waited for the volume's lock, finds it frozen. The retry after
// EndSelfFence finds it staged and thawed.
func TestStageDuringSelfFence(t *testing.T) {
	f := newSelfFenceFixture(t)
	id := f.volumeIn(f.pool, "racing", pool.AccessMount)
	req := f.stageReq(id, f.capability(false))
	done := make(chan struct{})
	started := false
	f.loop.OnCall = func(call string) {
		if started || !strings.HasPrefix(call, "Attach ") {
			return
		}
		started = true
		go func() {
			defer close(done)
			f.srv.SelfFence(f.ctx)
		}()
		for !f.srv.SelfFenced() {
			time.Sleep(time.Millisecond)
		}
	}
	_, err := f.srv.NodeStageVolume(f.ctx, req)
	if !started {
		t.Fatal("the stage attached nothing: the test raced nothing")
	}
	wantError(t, err, codes.Unavailable, "cannot renew its heartbeat")
	<-done
	f.loop.OnCall = nil // SelfFence used the Fake until now
	if !f.frozen.isFrozen(req.StagingTargetPath) {
		t.Fatal("the stage that ran into the self-fence left its filesystem writable")
	}
	f.srv.EndSelfFence(f.ctx)
	if f.frozen.isFrozen(req.StagingTargetPath) {
		t.Error("still frozen after EndSelfFence")
	}
	f.stage(id, false)
}

// TestThawLeftovers: a filesystem an earlier run of the plugin left frozen
// is thawed by ThawLeftovers, unless the node is self-fenced (then
// EndSelfFence thaws it); a local pool's is left alone.
func TestThawLeftovers(t *testing.T) {
	f := newSelfFenceFixture(t)
	shared := f.stage(f.volumeIn(f.pool, "shared", pool.AccessMount), false)
	local := f.stage(f.volumeIn(f.local, "local", pool.AccessMount), false)
	f.frozen.frozen[shared.StagingTargetPath] = true // as a killed plugin left it
	f.frozen.frozen[local.StagingTargetPath] = true  // someone else's freeze

	f.srv.SelfFence(f.ctx)
	f.srv.ThawLeftovers(f.ctx)
	if !f.frozen.isFrozen(shared.StagingTargetPath) {
		t.Error("ThawLeftovers thawed a self-fenced node's volume")
	}
	f.srv.EndSelfFence(f.ctx)
	if f.frozen.isFrozen(shared.StagingTargetPath) {
		t.Error("EndSelfFence left a volume frozen that was frozen before SelfFence")
	}

	f.frozen.frozen[shared.StagingTargetPath] = true
	f.srv.ThawLeftovers(f.ctx)
	if f.frozen.isFrozen(shared.StagingTargetPath) {
		t.Error("ThawLeftovers left the shared pool's volume frozen")
	}
	if !f.frozen.isFrozen(local.StagingTargetPath) {
		t.Error("ThawLeftovers thawed a local pool's volume")
	}
}

// TestSelfFenceConcurrent: self-fences come and go while volumes are
// staged, published, unpublished and unstaged (for -race); at the end,
// with the self-fence ended, nothing is left frozen.
func TestSelfFenceConcurrent(t *testing.T) {
	f := newSelfFenceFixture(t)
	ids := make([]pool.VolumeID, 4)
	for i := range ids {
		ids[i] = f.volumeIn(f.pool, fmt.Sprintf("v%d", i), pool.AccessMount)
	}
	ctx, cancel := context.WithCancel(f.ctx)
	var fences, vols sync.WaitGroup
	fences.Go(func() {
		for ctx.Err() == nil {
			f.srv.SelfFence(ctx)
			f.srv.EndSelfFence(ctx)
		}
	})
	for i, id := range ids {
		vols.Go(func() {
			c := f.capability(false)
			for range 30 {
				stage := f.stageReq(id, c)
				pub := f.publishReq(id, c, fmt.Sprintf("pod%d", i))
				_, _ = f.srv.NodeStageVolume(f.ctx, stage)
				_, _ = f.srv.NodePublishVolume(f.ctx, pub)
				_, _ = f.srv.NodeUnpublishVolume(f.ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id.String(), TargetPath: pub.TargetPath})
				_, _ = f.srv.NodeUnstageVolume(f.ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id.String(), StagingTargetPath: stage.StagingTargetPath})
			}
		})
	}
	vols.Wait()
	cancel()
	fences.Wait()
	f.srv.EndSelfFence(f.ctx)
	for path := range f.frozen.frozen {
		if mps := f.mountsAt(path); len(mps) != 0 {
			t.Errorf("%s is mounted and frozen after the self-fence ended", path)
		}
	}
}
