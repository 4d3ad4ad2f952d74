package node

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2/ktesting"
	mount "k8s.io/mount-utils"
	utilexec "k8s.io/utils/exec"
	testingexec "k8s.io/utils/exec/testing"

	"github.com/loopvol/loopvol/pkg/loop/looptest"
	"github.com/loopvol/loopvol/pkg/pool"
	"github.com/loopvol/loopvol/pkg/volspec"
)

const (
	testNode = "node-a"
	testZone = "zone-1"
	mib      = int64(1) << 20
)

// fixture is a node server on fakes: loop devices (looptest), mounts
// (FakeMounter) and commands (fakeExec). The pool and the kubelet directory
// are real directories in t.TempDir().
type fixture struct {
	t       *testing.T
	ctx     context.Context
	kubelet string
	pool    *pool.Pool
	loop    *looptest.Fake
	mounter *mount.FakeMounter
	exec    *fakeExec
	cfg     Config
	srv     *Server
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	dir := t.TempDir()
	f := &fixture{
		t:       t,
		ctx:     ctx,
		kubelet: filepath.Join(dir, "kubelet"),
		loop:    looptest.New(testNode),
		mounter: mount.NewFakeMounter(nil),
		exec:    &fakeExec{formatted: map[string]string{}},
	}
	if err := os.MkdirAll(f.kubelet, 0o750); err != nil {
		t.Fatal(err)
	}
	p, err := pool.Open(pool.Options{Name: "p1", Zone: testZone, Path: filepath.Join(dir, "pool")})
	if err != nil {
		t.Fatal(err)
	}
	f.pool = p
	f.cfg = Config{
		NodeID:     testNode,
		Zone:       testZone,
		MaxVolumes: 16,
		KubeletDir: f.kubelet,
		Pools:      map[string]*pool.Pool{"p1": p},
		Loop:       f.loop,
		Mounter:    &mount.SafeFormatAndMount{Interface: f.mounter, Exec: f.exec},
		mounts:     fakeMounts{m: f.mounter},
	}
	f.srv, err = New(f.cfg)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// volume creates a volume in the pool, attached to the given nodes.
func (f *fixture) volume(name, accessType, fsType string, attachments ...pool.Attachment) pool.VolumeID {
	f.t.Helper()
	id := pool.DeriveVolumeID(f.pool.Name, name)
	unlock, err := f.pool.Lock(id)
	if err != nil {
		f.t.Fatal(err)
	}
	defer unlock()
	v, err := f.pool.CreateVolume(f.ctx, pool.VolumeSpec{Name: name, SizeBytes: 16 * mib, AccessType: accessType, FsType: fsType})
	if err != nil {
		f.t.Fatal(err)
	}
	v.Attachments = append(v.Attachments, attachments...)
	if err := f.pool.WriteVolume(v); err != nil {
		f.t.Fatal(err)
	}
	return id
}

func (f *fixture) path(elem ...string) string {
	return filepath.Join(append([]string{f.kubelet}, elem...)...)
}

func (f *fixture) stageReq(id pool.VolumeID, c *csi.VolumeCapability) *csi.NodeStageVolumeRequest {
	return &csi.NodeStageVolumeRequest{VolumeId: id.String(), StagingTargetPath: f.path("staging", id.Hash), VolumeCapability: c}
}

func (f *fixture) publishReq(id pool.VolumeID, c *csi.VolumeCapability, target string) *csi.NodePublishVolumeRequest {
	return &csi.NodePublishVolumeRequest{
		VolumeId:          id.String(),
		StagingTargetPath: f.path("staging", id.Hash),
		TargetPath:        f.path("pods", target),
		VolumeCapability:  c,
	}
}

// stageAndPublish stages the volume and publishes it at target.
func (f *fixture) stageAndPublish(id pool.VolumeID, c *csi.VolumeCapability, target string) (*csi.NodeStageVolumeRequest, *csi.NodePublishVolumeRequest) {
	f.t.Helper()
	stage, publish := f.stageReq(id, c), f.publishReq(id, c, target)
	if _, err := f.srv.NodeStageVolume(f.ctx, stage); err != nil {
		f.t.Fatalf("NodeStageVolume: %v", err)
	}
	if _, err := f.srv.NodePublishVolume(f.ctx, publish); err != nil {
		f.t.Fatalf("NodePublishVolume: %v", err)
	}
	return stage, publish
}

func (f *fixture) mountsAt(path string) []mount.MountPoint {
	mps, _ := f.mounter.List()
	var out []mount.MountPoint
	for _, mp := range mps {
		if mp.Path == path {
			out = append(out, mp)
		}
	}
	return out
}

const (
	snw  = csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER
	snsw = csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER
	mnro = csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY
	mnmw = csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER
)

func wantCode(t *testing.T, err error, want codes.Code) {
	t.Helper()
	if got := status.Code(err); got != want {
		t.Errorf("code = %v (%v), want %v", got, err, want)
	}
}

// fakeExec answers the commands mount-utils runs: blkid reports what mkfs
// made, mkfs records it, the resize tools succeed. It records every command.
type fakeExec struct {
	mu        sync.Mutex
	formatted map[string]string // device → filesystem
	calls     []string
}

var _ utilexec.Interface = (*fakeExec)(nil)

func (e *fakeExec) Command(cmd string, args ...string) utilexec.Cmd {
	action := func() ([]byte, []byte, error) { return e.run(cmd, args) }
	return testingexec.InitFakeCmd(&testingexec.FakeCmd{
		CombinedOutputScript: []testingexec.FakeAction{action},
		OutputScript:         []testingexec.FakeAction{action},
		RunScript:            []testingexec.FakeAction{action},
	}, cmd, args...)
}

func (e *fakeExec) CommandContext(_ context.Context, cmd string, args ...string) utilexec.Cmd {
	return e.Command(cmd, args...)
}

func (e *fakeExec) LookPath(file string) (string, error) { return "/usr/sbin/" + file, nil }

func (e *fakeExec) run(cmd string, args []string) ([]byte, []byte, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.calls = append(e.calls, strings.Join(append([]string{cmd}, args...), " "))
	dev := ""
	if len(args) > 0 {
		dev = args[len(args)-1]
	}
	switch {
	case cmd == "blkid":
		if fs, ok := e.formatted[dev]; ok {
			return []byte("DEVNAME=" + dev + "\nTYPE=" + fs + "\n"), nil, nil
		}
		return nil, nil, testingexec.FakeExitError{Status: 2}
	case strings.HasPrefix(cmd, "mkfs."):
		e.formatted[dev] = strings.TrimPrefix(cmd, "mkfs.")
		return nil, nil, nil
	case cmd == "blockdev" && args[0] == "--getro":
		return []byte("0"), nil, nil
	case cmd == "blockdev" && args[0] == "--getsize64":
		return []byte(fmt.Sprint(1 << 30)), nil, nil
	case cmd == "dumpe2fs":
		return []byte("Block count: 1024\nBlock size: 4096\n"), nil, nil
	}
	return nil, nil, nil // fsck, resize2fs, xfs_growfs
}

func (e *fakeExec) ran(prefix string) []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []string
	for _, c := range e.calls {
		if strings.HasPrefix(c, prefix) {
			out = append(out, c)
		}
	}
	return out
}

func TestNewWritesNodeRecords(t *testing.T) {
	f := newFixture(t)
	rec, err := f.pool.ReadNode(testNode)
	if err != nil {
		t.Fatalf("ReadNode: %v", err)
	}
	if rec.Zone != testZone || rec.MaxVolumes != 16 || rec.LastStart.IsZero() {
		t.Errorf("node record = %+v", rec)
	}
}

func TestConfigValidate(t *testing.T) {
	f := newFixture(t)
	for _, tc := range []struct {
		name   string
		mutate func(*Config)
	}{
		{name: "bad node ID", mutate: func(c *Config) { c.NodeID = "../x" }},
		{name: "no zone", mutate: func(c *Config) { c.Zone = "" }},
		{name: "relative kubelet dir", mutate: func(c *Config) { c.KubeletDir = "var/lib/kubelet" }},
		{name: "root kubelet dir", mutate: func(c *Config) { c.KubeletDir = "/" }},
		{name: "negative max volumes", mutate: func(c *Config) { c.MaxVolumes = -1 }},
		{name: "no loop", mutate: func(c *Config) { c.Loop = nil }},
		{name: "no mounter", mutate: func(c *Config) { c.Mounter = nil }},
		{name: "pool under wrong name", mutate: func(c *Config) { c.Pools = map[string]*pool.Pool{"other": f.pool} }},
		{name: "no pool of the zone", mutate: func(c *Config) { c.Zone = "zone-2" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := f.cfg
			tc.mutate(&cfg)
			if _, err := New(cfg); err == nil {
				t.Errorf("New succeeded, want an error")
			}
		})
	}
}

func TestInfoAndCapabilities(t *testing.T) {
	f := newFixture(t)
	info, err := f.srv.NodeGetInfo(f.ctx, &csi.NodeGetInfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if info.GetNodeId() != testNode || info.GetMaxVolumesPerNode() != 16 ||
		info.GetAccessibleTopology().GetSegments()[volspec.TopologyKey] != testZone {
		t.Errorf("NodeGetInfo = %v", info)
	}
	caps, err := f.srv.NodeGetCapabilities(f.ctx, &csi.NodeGetCapabilitiesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var got []csi.NodeServiceCapability_RPC_Type
	for _, c := range caps.GetCapabilities() {
		got = append(got, c.GetRpc().GetType())
	}
	for _, want := range []csi.NodeServiceCapability_RPC_Type{
		csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME,
		csi.NodeServiceCapability_RPC_GET_VOLUME_STATS,
		csi.NodeServiceCapability_RPC_GET_VOLUME_HEALTH,
		csi.NodeServiceCapability_RPC_EXPAND_VOLUME,
		csi.NodeServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER,
	} {
		if !slices.Contains(got, want) {
			t.Errorf("capabilities %v lack %v", got, want)
		}
	}
}
