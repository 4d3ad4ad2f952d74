package controller

import (
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/loopvol/loopvol/pkg/pool"
	"github.com/loopvol/loopvol/pkg/volspec/volspectest"
)

// The rules of fencing on detach (fence.go) that need no reflink: the
// fixture's pools are plain directories of the test's filesystem, which
// has none (test/driver's TestForceDetachFences fences on a real xfs).
func TestFenceOnDetachRules(t *testing.T) {
	mount := volspectest.Mount("ext4", snw)
	setup := func(t *testing.T, nodes ...string) (*fixture, pool.VolumeID) {
		f := newFixture(t, map[string]string{"p": "z"})
		for _, n := range nodes {
			f.addNode(t, "p", n, 0)
		}
		resp, err := f.s.CreateVolume(ctx(t), createReq("vol", 1<<20, mount))
		if err != nil {
			t.Fatal(err)
		}
		id, err := pool.ParseVolumeID(resp.Volume.VolumeId)
		if err != nil {
			t.Fatal(err)
		}
		return f, id
	}
	publish := func(f *fixture, id pool.VolumeID, node string, ro bool) error {
		_, err := f.s.ControllerPublishVolume(ctx(t), &csi.ControllerPublishVolumeRequest{VolumeId: id.String(), NodeId: node, VolumeCapability: mount, Readonly: ro})
		return err
	}
	unpublish := func(f *fixture, id pool.VolumeID, node string) error {
		_, err := f.s.ControllerUnpublishVolume(ctx(t), &csi.ControllerUnpublishVolumeRequest{VolumeId: id.String(), NodeId: node})
		return err
	}
	stage := func(t *testing.T, f *fixture, id pool.VolumeID, node string, ro bool) {
		t.Helper()
		if err := f.pools["p"].WriteStaged(pool.Staged{VolumeID: id.String(), Node: node, NodeStart: time.Now().Add(-time.Hour), Staged: time.Now(), ReadOnly: ro}); err != nil {
			t.Fatal(err)
		}
	}
	staged := func(f *fixture, id pool.VolumeID, node string) bool {
		_, err := f.pools["p"].ReadStaged(id, node)
		return err == nil
	}

	t.Run("shared pool without reflink: refused, and no other writer meanwhile", func(t *testing.T) {
		f, id := setup(t, "n1", "n2")
		if err := publish(f, id, "n1", false); err != nil {
			t.Fatal(err)
		}
		stage(t, f, id, "n1", false)
		err := unpublish(f, id, "n1")
		wantCode(t, err, codes.FailedPrecondition)
		if !strings.Contains(err.Error(), "no reflink") || !strings.Contains(err.Error(), "n1") {
			t.Errorf("the refusal does not say why: %v", err)
		}
		if !staged(f, id, "n1") {
			t.Error("the refused fence removed the node's staged record")
		}
		err = publish(f, id, "n2", false)
		wantCode(t, err, codes.FailedPrecondition)
		if !strings.Contains(err.Error(), "still has it staged") {
			t.Errorf("the refusal does not say why: %v", err)
		}
		// The retried detach keeps refusing until the node unstages.
		wantCode(t, unpublish(f, id, "n1"), codes.FailedPrecondition)
		if err := f.pools["p"].RemoveStaged(id, "n1"); err != nil {
			t.Fatal(err)
		}
		if err := unpublish(f, id, "n1"); err != nil {
			t.Fatalf("detach once the node unstaged: %v", err)
		}
		if err := publish(f, id, "n2", false); err != nil {
			t.Fatalf("attach to n2 once n1 unstaged: %v", err)
		}
	})

	t.Run("local pool: never fenced", func(t *testing.T) {
		f, id := setup(t, "n1")
		if err := publish(f, id, "n1", false); err != nil {
			t.Fatal(err)
		}
		stage(t, f, id, "n1", false)
		if err := unpublish(f, id, "n1"); err != nil {
			t.Fatalf("detach of a local pool's staged volume: %v", err)
		}
		if !staged(f, id, "n1") {
			t.Error("the node's staged record of a local volume was removed")
		}
	})

	t.Run("staged read-only: nothing to fence", func(t *testing.T) {
		f, id := setup(t, "n1", "n2")
		if err := publish(f, id, "n1", true); err != nil {
			t.Fatal(err)
		}
		stage(t, f, id, "n1", true)
		if err := unpublish(f, id, "n1"); err != nil {
			t.Fatalf("detach of a volume staged read-only: %v", err)
		}
		if err := publish(f, id, "n2", false); err != nil {
			t.Fatalf("a writer while a detached node reads it: %v", err)
		}
	})

	t.Run("staged on another node too: not fenced", func(t *testing.T) {
		f, _ := setup(t, "n1", "n2")
		block := volspectest.Block(mnmw)
		resp, err := f.s.CreateVolume(ctx(t), createReq("shared-block", 1<<20, block))
		if err != nil {
			t.Fatal(err)
		}
		bid, _ := pool.ParseVolumeID(resp.Volume.VolumeId)
		for _, n := range []string{"n1", "n2"} {
			if _, err := f.s.ControllerPublishVolume(ctx(t), &csi.ControllerPublishVolumeRequest{VolumeId: bid.String(), NodeId: n, VolumeCapability: block}); err != nil {
				t.Fatal(err)
			}
			stage(t, f, bid, n, false)
		}
		if err := unpublish(f, bid, "n1"); err != nil {
			t.Fatalf("detach of a multi-writer volume staged on two nodes: %v", err)
		}
		if !staged(f, bid, "n1") || !staged(f, bid, "n2") {
			t.Error("a staged record of a volume that was not fenced went")
		}
	})
}
