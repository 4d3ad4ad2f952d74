package driver

import (
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/loopvol/loopvol/test/internal/driverproc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/loopvol/loopvol/internal/harness/testfs"
)

// TestFullPoolAffectsOnlyItself: a pool on its own small loop-mounted
// filesystem, which another writer then fills to ENOSPC (blocks, then
// inodes), beside a healthy pool. The full pool must fail only what would
// land in it: CreateVolume places new volumes in the other pool (and
// answers RESOURCE_EXHAUSTED only when the request names the full one), a
// volume already in the full pool is still found by name, CreateSnapshot,
// CreateVolumeGroupSnapshot and ControllerPublishVolume (with a per-node
// limit, so the node is locked in every pool it serves) work in the
// healthy pool, Probe stays ready, and /metrics says which pool is not
// usable. Before the fix the name, node and group lock files that could not
// be created in the full pool failed all of it.
func TestFullPoolAffectsOnlyItself(t *testing.T) {
	driverproc.RequireRoot(t)
	dir := t.TempDir()
	good, kubelet, fs := filepath.Join(dir, "good"), filepath.Join(dir, "kubelet"), filepath.Join(dir, "fullfs")
	for _, d := range []string{good, kubelet, fs, filepath.Join(dir, "a")} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { forceCleanup(t, dir) })
	testfs.MountSmallExt4(t, filepath.Join(dir, "fullfs.img"), fs)
	full := filepath.Join(fs, "pool")
	const addr = "127.0.0.1:39811"
	d := driverproc.Start(t, filepath.Join(dir, "a"), "--mode=all", "--node-id=node-a", "--zone=z1",
		"--pool=full="+full, "--pool=good="+good, "--kubelet-dir="+kubelet, "--max-volumes-per-node=8", "--http-endpoint="+addr)
	ctrl := csi.NewControllerClient(d.Conn)
	create := func(name, poolName string) (*csi.Volume, error) {
		req := &csi.CreateVolumeRequest{Name: name, CapacityRange: &csi.CapacityRange{RequiredBytes: 2 * mib},
			VolumeCapabilities: []*csi.VolumeCapability{blockCap(snw)}}
		if poolName != "" {
			req.Parameters = map[string]string{"pool": poolName}
		}
		resp, err := ctrl.CreateVolume(bg(), req)
		return resp.GetVolume(), err
	}
	before, err := create("before", "full")
	if err != nil {
		t.Fatalf("CreateVolume in the full pool before it filled: %v", err)
	}
	ready, err := create("ready", "good")
	if err != nil {
		t.Fatalf("CreateVolume in the healthy pool: %v", err)
	}

	testfs.FillToENOSPC(t, fs)
	if _, err := os.Create(filepath.Join(fs, "pool", "probe")); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("a file created in the filled pool: %v, want ENOSPC", err)
	}

	if resp, err := csi.NewIdentityClient(d.Conn).Probe(bg(), &csi.ProbeRequest{}); err != nil || !resp.GetReady().GetValue() {
		t.Errorf("Probe with one pool full and one usable: ready=%v, %v; want ready", resp.GetReady().GetValue(), err)
	}
	if v, err := create("after", ""); err != nil {
		t.Errorf("CreateVolume with one pool full: %v", err)
	} else if got := v.GetVolumeContext()["loopvol.csi.io/pool"]; got != "good" {
		t.Errorf("CreateVolume placed the volume in pool %q, want good", got)
	} else if again, err := create("after", ""); err != nil || again.GetVolumeId() != v.GetVolumeId() {
		t.Errorf("CreateVolume again: %s, %v; want %s", again.GetVolumeId(), err, v.GetVolumeId())
	}
	if again, err := create("before", "full"); err != nil || again.GetVolumeId() != before.GetVolumeId() {
		t.Errorf("CreateVolume of the volume in the full pool again: %s, %v; want %s", again.GetVolumeId(), err, before.GetVolumeId())
	}
	if _, err := create("into-full", "full"); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("CreateVolume naming the full pool: %v; want RESOURCE_EXHAUSTED", err)
	}
	if _, err := ctrl.CreateSnapshot(bg(), &csi.CreateSnapshotRequest{Name: "snap-after", SourceVolumeId: ready.GetVolumeId()}); err != nil {
		t.Errorf("CreateSnapshot in the healthy pool: %v", err)
	}
	if _, err := csi.NewGroupControllerClient(d.Conn).CreateVolumeGroupSnapshot(bg(), &csi.CreateVolumeGroupSnapshotRequest{Name: "group-after", SourceVolumeIds: []string{ready.GetVolumeId()}}); err != nil {
		t.Errorf("CreateVolumeGroupSnapshot in the healthy pool: %v", err)
	}
	if _, err := ctrl.ControllerPublishVolume(bg(), &csi.ControllerPublishVolumeRequest{VolumeId: ready.GetVolumeId(), NodeId: "node-a", VolumeCapability: blockCap(snw)}); err != nil {
		t.Errorf("ControllerPublishVolume in the healthy pool: %v", err)
	}

	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`loopvol_pool_usable{pool="full",zone="z1"} 0`, `loopvol_pool_usable{pool="good",zone="z1"} 1`} {
		if !strings.Contains(string(body), want+"\n") {
			t.Errorf("metrics lack %q", want)
		}
	}
}
