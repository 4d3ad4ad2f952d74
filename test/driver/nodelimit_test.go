package driver

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/loopvol/loopvol/pkg/pool"
	"github.com/loopvol/loopvol/test/internal/driverproc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestTwoControllerProcessesKeepTheNodeLimit: a node plugin registers
// node-x with --max-volumes-per-node=N in a pool that two controller
// processes serve; 2N publishes of different volumes to node-x, all at once,
// half through each process, round after round: exactly N succeed, the rest
// are RESOURCE_EXHAUSTED, and the records in the pool show N attachments.
func TestTwoControllerProcessesKeepTheNodeLimit(t *testing.T) {
	driverproc.RequireRoot(t)
	const limit, rounds = 3, 5
	dir := t.TempDir()
	poolDir := filepath.Join(dir, "pool")
	kubelet := filepath.Join(dir, "kubelet")
	nodeDir := filepath.Join(dir, "node")
	for _, d := range []string{poolDir, kubelet, nodeDir} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	ctrls, _ := controllers(t, 2, "--zone=z", "--pool=p="+poolDir)
	driverproc.Start(t, nodeDir, "--mode=node", "--node-id=node-x", "--zone=z", "--pool=p="+poolDir,
		"--kubelet-dir="+kubelet, fmt.Sprintf("--max-volumes-per-node=%d", limit))
	// The test's own handle on the pool, to read the records as they are.
	p, err := pool.Open(pool.Options{Name: "p", Zone: "z", Path: poolDir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	cap := blockCap(snw)
	var ids []string
	for i := 0; i < 2*limit; i++ {
		resp, err := ctrls[i%2].CreateVolume(bg(), &csi.CreateVolumeRequest{Name: fmt.Sprintf("v-%d", i), CapacityRange: &csi.CapacityRange{RequiredBytes: 4 * mib}, VolumeCapabilities: []*csi.VolumeCapability{cap}})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, resp.Volume.VolumeId)
	}
	for round := 0; round < rounds; round++ {
		got := make([]codes.Code, len(ids))
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i, id := range ids {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				_, err := ctrls[i%2].ControllerPublishVolume(bg(), &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "node-x", VolumeCapability: cap})
				got[i] = status.Code(err)
				if err != nil && status.Code(err) != codes.ResourceExhausted {
					t.Errorf("round %d: ControllerPublishVolume %s: %v", round, id, err)
				}
			}()
		}
		close(start)
		wg.Wait()
		ok := 0
		for _, code := range got {
			if code == codes.OK {
				ok++
			}
		}
		attached, err := p.CountAttachments("node-x")
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("round %d: %v", round, got)
		if ok != limit || attached != limit {
			t.Fatalf("round %d: %d publishes succeeded, %d attachments in the pool (%v); want %d", round, ok, attached, got, limit)
		}
		for i, id := range ids {
			if _, err := ctrls[(i+1)%2].ControllerUnpublishVolume(bg(), &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: "node-x"}); err != nil {
				t.Fatal(err)
			}
		}
	}
}
