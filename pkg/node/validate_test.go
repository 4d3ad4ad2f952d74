package node

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/loopvol/loopvol/pkg/pool"
	"github.com/loopvol/loopvol/pkg/volspec/volspectest"
)

// TestRequestValidation sends bad requests to every volume RPC and checks
// the code, and that nothing reached the loop devices, the mounts or mkfs.
func TestRequestValidation(t *testing.T) {
	f := newFixture(t)
	attached := f.volume("attached", pool.AccessMount, "", pool.Attachment{Node: testNode})
	other := f.volume("elsewhere", pool.AccessMount, "", pool.Attachment{Node: "node-b"})
	blockVol := f.volume("raw", pool.AccessBlock, "", pool.Attachment{Node: testNode})
	missing := pool.DeriveVolumeID("p1", "never-created")
	unknownPool := pool.DeriveVolumeID("p9", "x")

	outside := t.TempDir()
	// A symbolic link inside the kubelet directory that leads out of it.
	if err := os.Symlink(outside, f.path("escape")); err != nil {
		t.Fatal(err)
	}
	good := volspectest.Mount("", snw)
	staging := f.path("staging", "s")
	target := f.path("pods", "t")

	type rpc func() error
	stage := func(id, path string, c *csi.VolumeCapability) rpc {
		return func() error {
			_, err := f.srv.NodeStageVolume(f.ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: path, VolumeCapability: c})
			return err
		}
	}
	publish := func(id, staging, target string, c *csi.VolumeCapability) rpc {
		return func() error {
			_, err := f.srv.NodePublishVolume(f.ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: c})
			return err
		}
	}
	unstage := func(id, path string) rpc {
		return func() error {
			_, err := f.srv.NodeUnstageVolume(f.ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: path})
			return err
		}
	}
	unpublish := func(id, path string) rpc {
		return func() error {
			_, err := f.srv.NodeUnpublishVolume(f.ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: path})
			return err
		}
	}
	stats := func(id, path string) rpc {
		return func() error {
			_, err := f.srv.NodeGetVolumeStats(f.ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: path})
			return err
		}
	}
	expand := func(id, path string, r *csi.CapacityRange) rpc {
		return func() error {
			_, err := f.srv.NodeExpandVolume(f.ctx, &csi.NodeExpandVolumeRequest{VolumeId: id, VolumePath: path, CapacityRange: r})
			return err
		}
	}
	health := func(id, publishPath string) rpc {
		return func() error {
			_, err := f.srv.NodeGetVolumeHealth(f.ctx, &csi.NodeGetVolumeHealthRequest{VolumeId: id, VolumePublishPath: publishPath})
			return err
		}
	}
	a := attached.String()
	unknownMode := volspectest.Mount("", csi.VolumeCapability_AccessMode_Mode(42))
	noAccessType := &csi.VolumeCapability{AccessMode: &csi.VolumeCapability_AccessMode{Mode: snw}}

	for _, tc := range []struct {
		name string
		call rpc
		want codes.Code
	}{
		{name: "stage: no volume ID → invalid", call: stage("", staging, good), want: codes.InvalidArgument},
		{name: "stage: no staging path → invalid", call: stage(a, "", good), want: codes.InvalidArgument},
		{name: "stage: relative staging path → invalid", call: stage(a, "staging/s", good), want: codes.InvalidArgument},
		{name: "stage: staging path outside kubelet dir → invalid", call: stage(a, filepath.Join(outside, "s"), good), want: codes.InvalidArgument},
		{name: "stage: kubelet dir itself → invalid", call: stage(a, f.kubelet, good), want: codes.InvalidArgument},
		{name: "stage: sibling with kubelet dir as prefix → invalid", call: stage(a, f.kubelet+"-evil/s", good), want: codes.InvalidArgument},
		{name: "stage: dot-dot in staging path → invalid", call: stage(a, f.path("staging", "..", "..", "x"), good), want: codes.InvalidArgument},
		{name: "stage: NUL in staging path → invalid", call: stage(a, staging+"\x00x", good), want: codes.InvalidArgument},
		{name: "stage: huge staging path → invalid", call: stage(a, f.path(strings.Repeat("a", 10000)), good), want: codes.InvalidArgument},
		{name: "stage: symlink out of kubelet dir → invalid", call: stage(a, f.path("escape", "s"), good), want: codes.InvalidArgument},
		{name: "stage: no capability → invalid", call: stage(a, staging, nil), want: codes.InvalidArgument},
		{name: "stage: unknown access mode → invalid", call: stage(a, staging, unknownMode), want: codes.InvalidArgument},
		{name: "stage: no access type → invalid", call: stage(a, staging, noAccessType), want: codes.InvalidArgument},
		{name: "stage: btrfs → invalid", call: stage(a, staging, volspectest.Mount("btrfs", snw)), want: codes.InvalidArgument},
		{name: "stage: comma in mount flag → invalid", call: stage(a, staging, volspectest.Mount("", snw, "ro,exec")), want: codes.InvalidArgument},
		{name: "stage: comma after a quoted value → invalid", call: stage(a, staging, volspectest.Mount("", snw, `context="a:b:c:s0",exec`)), want: codes.InvalidArgument},
		{name: "stage: unbalanced quote → invalid", call: stage(a, staging, volspectest.Mount("", snw, `context="a:b:c:s0:c1,c2`)), want: codes.InvalidArgument},
		{name: "stage: multi-node writer mount → invalid", call: stage(a, staging, volspectest.Mount("", mnmw)), want: codes.InvalidArgument},
		{name: "stage: block capability on a mount volume → invalid", call: stage(a, staging, volspectest.Block(snw)), want: codes.InvalidArgument},
		{name: "stage: mount capability on a block volume → invalid", call: stage(blockVol.String(), staging, good), want: codes.InvalidArgument},
		{name: "stage: xfs on an ext4 volume → invalid", call: stage(f.volume("e4", pool.AccessMount, "ext4", pool.Attachment{Node: testNode}).String(), staging, volspectest.Mount("xfs", snw)), want: codes.InvalidArgument},
		{name: "stage: path-like volume ID → not found", call: stage("../../etc/passwd", staging, good), want: codes.NotFound},
		{name: "stage: NUL in volume ID → not found", call: stage("p1.\x00", staging, good), want: codes.NotFound},
		{name: "stage: huge volume ID → not found", call: stage(strings.Repeat("a", 10000), staging, good), want: codes.NotFound},
		{name: "stage: pool not served here → not found", call: stage(unknownPool.String(), staging, good), want: codes.NotFound},
		{name: "stage: no such volume → not found", call: stage(missing.String(), staging, good), want: codes.NotFound},
		{name: "stage: attached to another node → failed precondition", call: stage(other.String(), staging, good), want: codes.FailedPrecondition},

		{name: "publish: no volume ID → invalid", call: publish("", staging, target, good), want: codes.InvalidArgument},
		{name: "publish: no target → invalid", call: publish(a, staging, "", good), want: codes.InvalidArgument},
		{name: "publish: no staging path → invalid", call: publish(a, "", target, good), want: codes.InvalidArgument},
		{name: "publish: target outside kubelet dir → invalid", call: publish(a, staging, "/etc/x", good), want: codes.InvalidArgument},
		{name: "publish: target through symlink out → invalid", call: publish(a, staging, f.path("escape", "t"), good), want: codes.InvalidArgument},
		{name: "publish: target equals staging → invalid", call: publish(a, staging, staging, good), want: codes.InvalidArgument},
		{name: "publish: no capability → invalid", call: publish(a, staging, target, nil), want: codes.InvalidArgument},
		{name: "publish: no such volume → not found", call: publish(missing.String(), staging, target, good), want: codes.NotFound},
		{name: "publish: attached elsewhere → failed precondition", call: publish(other.String(), staging, target, good), want: codes.FailedPrecondition},
		{name: "publish: not staged → failed precondition", call: publish(a, staging, target, good), want: codes.FailedPrecondition},

		{name: "unstage: no volume ID → invalid", call: unstage("", staging), want: codes.InvalidArgument},
		{name: "unstage: no staging path → invalid", call: unstage(a, ""), want: codes.InvalidArgument},
		{name: "unstage: outside kubelet dir → invalid", call: unstage(a, "/mnt"), want: codes.InvalidArgument},
		{name: "unstage: bad volume ID → not found", call: unstage("p1/../x", staging), want: codes.NotFound},

		{name: "unpublish: no volume ID → invalid", call: unpublish("", target), want: codes.InvalidArgument},
		{name: "unpublish: no target → invalid", call: unpublish(a, ""), want: codes.InvalidArgument},
		{name: "unpublish: outside kubelet dir → invalid", call: unpublish(a, "/"), want: codes.InvalidArgument},
		{name: "unpublish: bad volume ID → not found", call: unpublish("P1.ABC", target), want: codes.NotFound},

		{name: "stats: no volume ID → invalid", call: stats("", target), want: codes.InvalidArgument},
		{name: "stats: no volume path → invalid", call: stats(a, ""), want: codes.InvalidArgument},
		{name: "stats: no such volume → not found", call: stats(missing.String(), "some/path"), want: codes.NotFound},
		{name: "stats: relative path → not found", call: stats(a, "some/path"), want: codes.NotFound},
		{name: "stats: path that does not exist → not found", call: stats(a, target), want: codes.NotFound},

		{name: "expand: no volume ID → invalid", call: expand("", target, nil), want: codes.InvalidArgument},
		{name: "expand: no volume path → invalid", call: expand(a, "", nil), want: codes.InvalidArgument},
		{name: "expand: limit below required → invalid", call: expand(a, target, &csi.CapacityRange{RequiredBytes: 2 * mib, LimitBytes: mib}), want: codes.InvalidArgument},
		{name: "expand: negative size → invalid", call: expand(a, target, &csi.CapacityRange{RequiredBytes: -1}), want: codes.InvalidArgument},
		{name: "expand: no such volume → not found", call: expand(missing.String(), "some/path", nil), want: codes.NotFound},
		{name: "expand: not staged → failed precondition", call: expand(a, target, nil), want: codes.FailedPrecondition},

		{name: "health: no volume ID → invalid", call: health("", ""), want: codes.InvalidArgument},
		{name: "health: publish path outside → invalid", call: health(a, "/etc"), want: codes.InvalidArgument},
		{name: "health: no such volume → not found", call: health(missing.String(), ""), want: codes.NotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantCode(t, tc.call(), tc.want)
		})
	}
	if len(f.loop.Attached()) != 0 || len(f.mounter.GetLog()) != 0 || len(f.exec.calls) != 0 {
		t.Errorf("bad requests touched the system: loop %v, mounts %v, commands %v", f.loop.Attached(), f.mounter.GetLog(), f.exec.calls)
	}
	if _, err := os.Stat(filepath.Join(outside, "s")); !os.IsNotExist(err) {
		t.Errorf("something was created outside the kubelet directory: %v", err)
	}
}

// FuzzStageArgs feeds arbitrary volume IDs and staging paths through the
// request checks: whatever is accepted names a served pool and a clean path
// strictly below the kubelet directory. The seeds run with the normal tests.
func FuzzStageArgs(f *testing.F) {
	for _, seed := range []struct{ id, path string }{
		{id: "p1.0123456789abcdef0123456789abcdef", path: "/kubelet/plugins/x/globalmount"},
		{id: "p1.0123456789abcdef0123456789abcdef", path: "/kubelet/../etc"},
		{id: "p1.0123456789ABCDEF0123456789abcdef", path: "/kubelet/a"},
		{id: "../p1.0123456789abcdef0123456789abcdef", path: "/kubelet/a"},
		{id: "p2.0123456789abcdef0123456789abcdef", path: "/kubelet/a"},
		{id: "p1.0123456789abcdef0123456789abcdef", path: "/kubelet"},
		{id: "p1.0123456789abcdef0123456789abcdef", path: "/kubelet-x/a"},
		{id: "p1.0123456789abcdef0123456789abcdef", path: "//kubelet//a/./b/"},
		{id: "p1.0123456789abcdef0123456789abcdef", path: "kubelet/a"},
		{id: "p1.0123456789abcdef0123456789abcdef\x00", path: "/kubelet/a\x00b"},
		{id: "", path: ""},
	} {
		f.Add(seed.id, seed.path)
	}
	n := &node{
		Config:      Config{NodeID: testNode},
		kubeletDir:  "/kubelet",
		kubeletReal: "/kubelet",
		pools:       map[string]*pool.Pool{"p1": {Name: "p1"}},
	}
	c := volspectest.Mount("ext4", snw)
	f.Fuzz(func(t *testing.T, id, path string) {
		a, err := n.stageArgs(&csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: path, VolumeCapability: c})
		if err != nil {
			if code := toStatus(err); status.Code(code) != codes.InvalidArgument && status.Code(code) != codes.NotFound {
				t.Fatalf("stageArgs(%q, %q) = %v, want INVALID_ARGUMENT or NOT_FOUND", id, path, code)
			}
			return
		}
		if a.id.String() != id || a.id.Pool != "p1" {
			t.Errorf("accepted volume ID %q as %+v", id, a.id)
		}
		if !strings.HasPrefix(a.staging, "/kubelet/") || filepath.Clean(a.staging) != a.staging ||
			strings.ContainsRune(a.staging, 0) || slices.Contains(strings.Split(a.staging, "/"), "..") {
			t.Errorf("accepted staging path %q as %q", path, a.staging)
		}
	})
}
