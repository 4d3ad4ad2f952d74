package node

import (
	"errors"
	"os"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/loopvol/loopvol/pkg/pool"
	"github.com/loopvol/loopvol/pkg/volspec/volspectest"
)

// stagedHere reports whether the pool holds this node's staged record of id.
func (f *fixture) stagedHere(id pool.VolumeID) bool {
	f.t.Helper()
	_, err := f.pool.ReadStaged(id, testNode)
	if err != nil && !errors.Is(err, pool.ErrNotFound) {
		f.t.Fatal(err)
	}
	return err == nil
}

// TestStagedRecordFollowsTheDevice: NodeStageVolume writes the node's staged
// record before it attaches anything (a stage whose attach fails leaves none
// behind), a repeated stage keeps it, and NodeUnstageVolume removes it once
// the device is gone; a volume not attached here gets none. Mount and block.
func TestStagedRecordFollowsTheDevice(t *testing.T) {
	for _, block := range []bool{false, true} {
		name := map[bool]string{false: "mount", true: "block"}[block]
		t.Run(name, func(t *testing.T) {
			f := newFixture(t)
			access, c := pool.AccessMount, volspectest.Mount("", snw)
			if block {
				access, c = pool.AccessBlock, volspectest.Block(snw)
			}
			id := f.volume("vol", access, "", pool.Attachment{Node: testNode})
			stage := f.stageReq(id, c)

			// The attach fails (the image is away): nothing attached,
			// no record left.
			img := f.pool.ImagePath(id)
			if err := os.Rename(img, img+".away"); err != nil {
				t.Fatal(err)
			}
			if _, err := f.srv.NodeStageVolume(f.ctx, stage); err == nil {
				t.Fatal("NodeStageVolume without an image: no error")
			}
			if f.stagedHere(id) {
				t.Fatal("a stage that attached nothing left its staged record")
			}
			if err := os.Rename(img+".away", img); err != nil {
				t.Fatal(err)
			}
			// When the node cannot even tell whether it has a device,
			// the record stays: it only keeps refusing moves.
			f.loop.Err = errors.New("injected loop failure")
			if _, err := f.srv.NodeStageVolume(f.ctx, stage); err == nil {
				t.Fatal("NodeStageVolume with failing loop devices: no error")
			}
			f.loop.Err = nil
			if !f.stagedHere(id) {
				t.Fatal("a stage that could not tell what it attached dropped its staged record")
			}

			for range 2 {
				if _, err := f.srv.NodeStageVolume(f.ctx, stage); err != nil {
					t.Fatalf("NodeStageVolume: %v", err)
				}
				if !f.stagedHere(id) {
					t.Fatal("staged without a staged record")
				}
			}
			if err := f.pool.CheckUnstaged(id, "it moves"); !errors.Is(err, pool.ErrInUse) {
				t.Fatalf("CheckUnstaged of a staged volume = %v, want ErrInUse", err)
			}
			for range 2 {
				if _, err := f.srv.NodeUnstageVolume(f.ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id.String(), StagingTargetPath: stage.StagingTargetPath}); err != nil {
					t.Fatalf("NodeUnstageVolume: %v", err)
				}
				if f.stagedHere(id) {
					t.Fatal("unstaged, and the staged record is still there")
				}
			}

			// Not attached here: refused, and no record.
			other := f.volume("other", access, "")
			_, err := f.srv.NodeStageVolume(f.ctx, f.stageReq(other, c))
			wantCode(t, err, codes.FailedPrecondition)
			if f.stagedHere(other) {
				t.Fatal("a refused stage left a staged record")
			}
		})
	}
}

// TestStagedRecordsAtRestart: a restarted plugin removes its records of
// volumes it has no device of (a stage that died before its attach, an
// unstage after its detach) and keeps those it has, records a device staged
// without one (an older plugin), and leaves other nodes' records alone: a
// dead node's record keeps refusing moves.
func TestStagedRecordsAtRestart(t *testing.T) {
	f := newFixture(t)
	staged := f.volume("staged", pool.AccessMount, "", pool.Attachment{Node: testNode})
	died := f.volume("died", pool.AccessMount, "", pool.Attachment{Node: testNode})
	older := f.volume("older", pool.AccessBlock, "", pool.Attachment{Node: testNode})
	if _, err := f.srv.NodeStageVolume(f.ctx, f.stageReq(staged, volspectest.Mount("", snw))); err != nil {
		t.Fatal(err)
	}
	if _, err := f.srv.NodeStageVolume(f.ctx, f.stageReq(older, volspectest.Block(snw))); err != nil {
		t.Fatal(err)
	}
	// As an older plugin left it: a device, no record.
	if err := f.pool.RemoveStaged(older, testNode); err != nil {
		t.Fatal(err)
	}
	// A stage that died after its record, before its attach.
	if err := f.pool.WriteStaged(pool.Staged{VolumeID: died.String(), Node: testNode}); err != nil {
		t.Fatal(err)
	}
	// Another node's, which this node must not judge.
	if err := f.pool.WriteStaged(pool.Staged{VolumeID: died.String(), Node: "node-b"}); err != nil {
		t.Fatal(err)
	}

	restarted, err := New(f.cfg)
	if err != nil {
		t.Fatal(err)
	}
	restarted.Start(f.ctx)
	if !f.stagedHere(staged) || !f.stagedHere(older) || f.stagedHere(died) {
		t.Fatalf("after the restart: staged %t (want true), older %t (want true), died %t (want false)",
			f.stagedHere(staged), f.stagedHere(older), f.stagedHere(died))
	}
	if err := f.pool.CheckUnstaged(died, "it moves"); !errors.Is(err, pool.ErrInUse) {
		t.Fatalf("CheckUnstaged with node-b's record = %v, want ErrInUse", err)
	}
}
