package controller

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/loopvol/loopvol/pkg/fenceapi"
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

// FenceNode (fencenode.go) on plain directories: without reflink, a
// filesystem volume is fenced by a full copy when the caller allows it,
// a raw block one never; local pools, later incarnations, read-only and
// shared staging are left, each with its reason; attachments stay.
func TestFenceNode(t *testing.T) {
	f := newFixture(t, map[string]string{"shared": "z", "local": "y"})
	for _, n := range []string{"n1", "n2"} {
		f.addNode(t, "shared", n, 0)
	}
	f.addNode(t, "local", "n1", 0)
	incarnation := time.Now().Add(-time.Hour).UTC()
	create := func(name, poolName string, c *csi.VolumeCapability) pool.VolumeID {
		t.Helper()
		req := createReq(name, 1<<20, c)
		req.Parameters = map[string]string{ParameterPool: poolName}
		resp, err := f.s.CreateVolume(ctx(t), req)
		if err != nil {
			t.Fatal(err)
		}
		id, _ := pool.ParseVolumeID(resp.Volume.VolumeId)
		return id
	}
	stage := func(id pool.VolumeID, node string, start time.Time, ro bool) {
		t.Helper()
		if err := f.pools[id.Pool].WriteStaged(pool.Staged{VolumeID: id.String(), Node: node, NodeStart: start, Staged: time.Now(), ReadOnly: ro}); err != nil {
			t.Fatal(err)
		}
	}
	mount, block := volspectest.Mount("ext4", snw), volspectest.Block(snw)
	fsVol := create("fs", "shared", mount)
	blockVol := create("block", "shared", block)
	localVol := create("local", "local", mount)
	laterVol := create("later", "shared", mount)
	roVol := create("ro", "shared", volspectest.Mount("ext4", mnro))
	for _, id := range []pool.VolumeID{fsVol, blockVol, localVol, laterVol} {
		stage(id, "n1", incarnation, false)
	}
	stage(laterVol, "n1", incarnation.Add(time.Minute), false) // rewritten by a later incarnation
	stage(roVol, "n1", incarnation, true)
	image := func(id pool.VolumeID) []byte {
		b, err := os.ReadFile(filepath.Join(f.root, id.Pool, "volumes", id.Hash+".img"))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	// What n1 "wrote": the fence's copy must hold it.
	if err := os.WriteFile(filepath.Join(f.root, "shared", "volumes", fsVol.Hash+".img"), append(make([]byte, 1<<20-5), "hello"...), 0o600); err != nil {
		t.Fatal(err)
	}

	resp, err := f.s.FenceNode(ctx(t), &fenceapi.FenceNodeRequest{NodeID: "n1", Through: incarnation, AllowCopy: true})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]fenceapi.FencedVolume{}
	for _, v := range resp.Volumes {
		got[v.VolumeID] = v
	}
	for id, want := range map[pool.VolumeID]string{fsVol: "", blockVol: "torn image", localVol: "local", laterVol: "later incarnation", roVol: "read-only"} {
		v, ok := got[id.String()]
		switch {
		case !ok:
			t.Errorf("%s: not in the answer %+v", id, resp.Volumes)
		case want == "" && (!v.Fenced || v.Method != pool.FenceCopy):
			t.Errorf("%s: %+v, want fenced by copy", id, v)
		case want != "" && (v.Fenced || !strings.Contains(v.Reason, want)):
			t.Errorf("%s: %+v, want not fenced because %q", id, v, want)
		}
		_, err := f.pools[id.Pool].ReadStaged(id, "n1")
		if fenced := want == ""; fenced != (err != nil) {
			t.Errorf("%s: staged record after the fence: %v (fenced %t)", id, err, fenced)
		}
	}
	if b := image(fsVol); !strings.HasSuffix(string(b), "hello") {
		t.Error("the fence's copy lost the image's data")
	}
	// Idempotent: nothing of n1's is left to fence but what stays.
	again, err := f.s.FenceNode(ctx(t), &fenceapi.FenceNodeRequest{NodeID: "n1", Through: incarnation, AllowCopy: true})
	if err != nil || len(again.Volumes) != 4 {
		t.Errorf("second FenceNode = %+v, %v; want the 4 volumes left, none fenced again", again, err)
	}
	for _, v := range again.Volumes {
		if v.Method != "" {
			t.Errorf("second FenceNode replaced the image of %s again", v.VolumeID)
		}
	}
	_, err = f.s.FenceNode(ctx(t), &fenceapi.FenceNodeRequest{NodeID: "../n1"})
	wantCode(t, err, codes.InvalidArgument)
}

// TestFenceNodeGoesOnPastABrokenPool: a pool whose staged records cannot
// be listed (its directory removed under it) is named in the answer, and
// the node is fenced in the other pools all the same.
func TestFenceNodeGoesOnPastABrokenPool(t *testing.T) {
	f := newFixture(t, map[string]string{"good": "z", "broken": "z"})
	for _, p := range []string{"good", "broken"} {
		for _, n := range []string{"n1", "n2"} {
			f.addNode(t, p, n, 0)
		}
	}
	req := createReq("fs", 1<<20, volspectest.Mount("ext4", snw))
	req.Parameters = map[string]string{ParameterPool: "good"}
	resp, err := f.s.CreateVolume(ctx(t), req)
	if err != nil {
		t.Fatal(err)
	}
	id, _ := pool.ParseVolumeID(resp.Volume.VolumeId)
	incarnation := time.Now().Add(-time.Hour).UTC()
	if err := f.pools["good"].WriteStaged(pool.Staged{VolumeID: id.String(), Node: "n1", NodeStart: incarnation, Staged: time.Now()}); err != nil {
		t.Fatal(err)
	}
	staged := filepath.Join(f.root, "broken", "staged")
	names, _ := os.ReadDir(staged)
	for _, n := range names {
		if err := os.Remove(filepath.Join(staged, n.Name())); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Remove(staged); err != nil {
		t.Fatal(err)
	}
	fenced, err := f.s.FenceNode(ctx(t), &fenceapi.FenceNodeRequest{NodeID: "n1", Through: incarnation, AllowCopy: true})
	if err != nil {
		t.Fatalf("FenceNode with one broken pool: %v, want an answer", err)
	}
	if len(fenced.Volumes) != 1 || !fenced.Volumes[0].Fenced || fenced.Volumes[0].VolumeID != id.String() {
		t.Errorf("volumes = %+v, want %s fenced", fenced.Volumes, id)
	}
	if len(fenced.PoolErrors) != 1 || !strings.Contains(fenced.PoolErrors[0], "pool broken") {
		t.Errorf("pool errors = %q, want the broken pool's", fenced.PoolErrors)
	}
}
