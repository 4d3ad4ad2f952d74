package registrar

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"k8s.io/apimachinery/pkg/util/wait"
)

const (
	driver     = "loopvol.csi.io"
	testNode   = "node-1"
	testNodeID = "node-1-id"
	zoneKey    = "topology.loopvol.csi.io/zone"
	endpoint   = "/var/lib/kubelet/plugins/loopvol.csi.io/csi.sock"
)

// testNow is the time of the tests' fake clocks.
var testNow = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// fakeDriver is a CSI driver whose NodeGetInfo answer, health and errors
// the test sets, and which counts its NodeGetInfo calls.
type fakeDriver struct {
	mu      sync.Mutex
	info    *csi.NodeGetInfoResponse
	err     error
	healthy error
	calls   int
}

func newFakeDriver(maxVolumes int64) *fakeDriver {
	return &fakeDriver{info: nodeInfo(testNodeID, maxVolumes, map[string]string{zoneKey: "z1"})}
}

func nodeInfo(id string, maxVolumes int64, segments map[string]string) *csi.NodeGetInfoResponse {
	return &csi.NodeGetInfoResponse{
		NodeId:             id,
		MaxVolumesPerNode:  maxVolumes,
		AccessibleTopology: &csi.Topology{Segments: segments},
	}
}

func (d *fakeDriver) NodeGetInfo(context.Context) (*csi.NodeGetInfoResponse, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.calls++
	return d.info, d.err
}

func (d *fakeDriver) Healthy() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.healthy
}

func (d *fakeDriver) WaitReady(context.Context) error { return nil }

func (d *fakeDriver) setMaxVolumes(n int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.info = nodeInfo(d.info.GetNodeId(), n, d.info.GetAccessibleTopology().GetSegments())
}

func (d *fakeDriver) setHealthy(err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.healthy = err
}

func (d *fakeDriver) callCount() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.calls
}

// eventually waits until cond holds, and fails the test with what after a
// generous timeout. It is for asynchronous outcomes (a socket re-created, a
// sync done), never a measurement of how long they took.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 5*time.Millisecond, 30*time.Second, true,
		func(context.Context) (bool, error) { return cond(), nil })
	if err != nil {
		t.Fatalf("%s: not reached after 30s", what)
	}
}
