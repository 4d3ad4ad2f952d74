package node

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/loopvol/loopvol/pkg/pool"
	"github.com/loopvol/loopvol/pkg/statusapi"
	"github.com/loopvol/loopvol/pkg/volspec/volspectest"
)

// TestNodeStatusPools: the pool's use as GetCapacity counts it, whether
// other nodes serve it, and its health, on fakes.
func TestNodeStatusPools(t *testing.T) {
	f := newFixture(t)
	f.volume("a", pool.AccessMount, "ext4")
	f.volume("b", pool.AccessBlock, "")
	st, err := f.srv.NodeStatus(f.ctx, &statusapi.NodeStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if st.NodeID != testNode || st.Zone != testZone || st.MaxVolumes != 16 || st.KubeletDir != f.kubelet || st.Started.IsZero() {
		t.Errorf("node fields = %+v", st)
	}
	if len(st.Pools) != 1 {
		t.Fatalf("pools = %+v, want p1", st.Pools)
	}
	p := st.Pools[0]
	u, err := f.pool.Usage()
	if err != nil {
		t.Fatal(err)
	}
	if p.Name != "p1" || p.Path != f.pool.Path || p.Volumes != 2 || p.Shared || p.Health != statusapi.HealthOK ||
		p.TotalBytes != u.TotalBytes || p.PromisedBytes != u.PromisedBytes || p.AvailableBytes == 0 {
		t.Errorf("pool = %+v, want p1 with 2 volumes, local, ok, its use as pool.Usage counts it (%+v)", p, u)
	}
	if len(st.Volumes) != 0 || len(st.StrayDevices) != 0 {
		t.Errorf("nothing is staged, yet volumes %+v, stray devices %+v", st.Volumes, st.StrayDevices)
	}

	// A second node serving the pool makes it shared; its marker gone
	// makes it unusable.
	if err := f.pool.WriteNode(pool.NodeRecord{ID: "node-b", Zone: testZone, LastStart: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(f.pool.Path, ".loopvol-pool")); err != nil {
		t.Fatal(err)
	}
	st, err = f.srv.NodeStatus(f.ctx, &statusapi.NodeStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if p := st.Pools[0]; !p.Shared || p.Health != reasonPoolUnusable || p.Message == "" {
		t.Errorf("pool = %+v, want shared and %s with a message", p, reasonPoolUnusable)
	}
}

// TestNodeStatusVolumes: staged volumes with their device, staging and
// target paths on fakes; a volume detached under its stage is reported
// not attached, with the health condition saying so.
func TestNodeStatusVolumes(t *testing.T) {
	f := newFixture(t)
	id := f.volume("fs", pool.AccessMount, "ext4", pool.Attachment{Node: testNode})
	c := volspectest.Mount("ext4", snw)
	stage, publish := f.stageAndPublish(id, c, "pod1")
	st, err := f.srv.NodeStatus(f.ctx, &statusapi.NodeStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Volumes) != 1 {
		t.Fatalf("volumes = %+v, want the staged one", st.Volumes)
	}
	v := st.Volumes[0]
	if v.VolumeID != id.String() || v.Pool != "p1" || v.Image != f.pool.ImagePath(id) || !v.Attached || v.Block ||
		v.FsType != "ext4" || v.SizeBytes != 16*mib || v.Staged.IsZero() || v.Device == "" ||
		v.StagingPath != stage.StagingTargetPath || len(v.TargetPaths) != 1 || v.TargetPaths[0] != publish.TargetPath ||
		v.Health != statusapi.HealthOK {
		t.Errorf("volume = %+v, want it staged at %s and published at %s, healthy", v, stage.StagingTargetPath, publish.TargetPath)
	}

	// Detached under it (a forced detach): still staged here, not attached.
	unlock, err := f.pool.Lock(id)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := f.pool.ReadVolume(id)
	if err != nil {
		t.Fatal(err)
	}
	rec.Attachments = nil
	if err := f.pool.WriteVolume(rec); err != nil {
		t.Fatal(err)
	}
	unlock()
	st, err = f.srv.NodeStatus(f.ctx, &statusapi.NodeStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if v := st.Volumes[0]; v.Attached || v.Health != reasonNotAttached || len(v.Conditions) == 0 {
		t.Errorf("volume detached under its stage = %+v, want not attached and %s", v, reasonNotAttached)
	}
}

// TestNodeStatusKubeletDirHasPod: whether kubelet keeps the plugin's own
// Pod directory under the kubelet directory it was given, only when it was
// given its Pod's UID, and never through a symbolic link.
func TestNodeStatusKubeletDirHasPod(t *testing.T) {
	f := newFixture(t)
	has := func() *bool {
		t.Helper()
		st, err := f.srv.NodeStatus(f.ctx, &statusapi.NodeStatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return st.KubeletDirHasPod
	}
	if got := has(); got != nil {
		t.Errorf("no pod UID given: KubeletDirHasPod = %v, want nil", *got)
	}
	const uid = "7d9aeb6f-53b7-4ac8-bf9a-f11ce7633dec"
	f.srv.node.PodUID = uid
	if got := has(); got == nil || *got {
		t.Errorf("no pods/%s under the kubelet directory: KubeletDirHasPod = %v, want false", uid, got)
	}
	elsewhere := t.TempDir()
	if err := os.MkdirAll(filepath.Join(f.kubelet, "pods"), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(elsewhere, filepath.Join(f.kubelet, "pods", uid)); err != nil {
		t.Fatal(err)
	}
	if got := has(); got == nil || *got {
		t.Errorf("pods/%s a symbolic link to a directory: KubeletDirHasPod = %v, want false", uid, got)
	}
	if err := os.Remove(filepath.Join(f.kubelet, "pods", uid)); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(f.kubelet, "pods", uid), 0o750); err != nil {
		t.Fatal(err)
	}
	if got := has(); got == nil || !*got {
		t.Errorf("pods/%s a directory: KubeletDirHasPod = %v, want true", uid, got)
	}
}

func TestValidatePodUID(t *testing.T) {
	for uid, ok := range map[string]bool{
		"": true, "7d9aeb6f-53b7-4ac8-bf9a-f11ce7633dec": true, "9f86d081884c7d659a2feaa0c55ad015": true, // a static Pod's
		"../../etc": false, "..": false, ".": false, "-x": false, "a/b": false, "a b": false,
		"7d9aeb6f-53b7-4ac8-bf9a-f11ce7633dec/..": false, strings.Repeat("a", 65): false,
	} {
		if err := ValidatePodUID(uid); (err == nil) != ok {
			t.Errorf("ValidatePodUID(%q) = %v, want ok %v", uid, err, ok)
		}
	}
}
