package controller

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/loopvol/loopvol/pkg/pool"
	"github.com/loopvol/loopvol/pkg/volspec/volspectest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// sharedControllers opens each pool directory once per controller, as
// controller processes sharing the pools would: each server has its own
// in-process locks, so only the pools' file locks keep them apart. Every
// controller serves every pool; the node is registered in each with the
// limit max.
func sharedControllers(t *testing.T, pools []string, n int, node string, max int64) []*Server {
	t.Helper()
	root := t.TempDir()
	var out []*Server
	for i := 0; i < n; i++ {
		var list []*pool.Pool
		for _, name := range pools {
			p, err := pool.Open(pool.Options{Name: name, Zone: "z", Path: filepath.Join(root, name)})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { p.Close() })
			if i == 0 {
				if err := p.WriteNode(pool.NodeRecord{ID: node, Zone: "z", MaxVolumes: max}); err != nil {
					t.Fatal(err)
				}
			}
			list = append(list, p)
		}
		s, err := New(Config{Pools: list})
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	return out
}

// attachedTo counts the node's attachments as the records on disk say.
func attachedTo(t *testing.T, s *Server, node string) int {
	t.Helper()
	n, err := s.countAttachments(node)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestTwoControllersKeepTheNodeLimit: two controllers on the same pools
// publish 2N different volumes to one node whose limit is N, all at once,
// half through each controller, round after round: exactly N publishes
// succeed, every other one is RESOURCE_EXHAUSTED, and the records on disk
// show N attachments. With the volumes in two pools the limit is the sum
// over both.
func TestTwoControllersKeepTheNodeLimit(t *testing.T) {
	const limit, rounds = 4, 8
	for _, pools := range [][]string{{"shared"}, {"a", "b"}} {
		t.Run(fmt.Sprintf("%d pools", len(pools)), func(t *testing.T) {
			ctrls := sharedControllers(t, pools, 2, "n1", limit)
			c := ctx(t)
			cap := volspectest.Block(snw)
			var ids []string
			for i := 0; i < 2*limit; i++ {
				req := createReq(fmt.Sprintf("v-%d", i), 4*mib, cap)
				req.Parameters = map[string]string{ParameterPool: pools[i%len(pools)]}
				resp, err := ctrls[0].CreateVolume(c, req)
				if err != nil {
					t.Fatal(err)
				}
				ids = append(ids, resp.Volume.VolumeId)
			}
			for round := 0; round < rounds; round++ {
				var wg sync.WaitGroup
				codesSeen := make([]codes.Code, len(ids))
				start := make(chan struct{})
				for i, id := range ids {
					wg.Add(1)
					go func() {
						defer wg.Done()
						<-start
						_, err := ctrls[i%2].ControllerPublishVolume(c, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "n1", VolumeCapability: cap})
						codesSeen[i] = status.Code(err)
						if err != nil && status.Code(err) != codes.ResourceExhausted {
							t.Errorf("round %d: ControllerPublishVolume %s: %v", round, id, err)
						}
					}()
				}
				close(start)
				wg.Wait()
				ok := 0
				for _, code := range codesSeen {
					if code == codes.OK {
						ok++
					}
				}
				if got := attachedTo(t, ctrls[1], "n1"); ok != limit || got != limit {
					t.Fatalf("round %d: %d publishes succeeded, %d attachments on disk (%v); want %d", round, ok, got, codesSeen, limit)
				}
				for i, id := range ids {
					if _, err := ctrls[(i+1)%2].ControllerUnpublishVolume(c, &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: "n1"}); err != nil {
						t.Fatal(err)
					}
				}
			}
		})
	}
}

// TestNodeLockBounded: while another controller holds the node's lock, a
// publish to that node waits for it and succeeds when it is released; one
// whose caller gives up first answers ABORTED and attaches nothing.
func TestNodeLockBounded(t *testing.T) {
	ctrls := sharedControllers(t, []string{"shared"}, 2, "n1", 8)
	c := ctx(t)
	cap := volspectest.Block(snw)
	var ids []string
	for i := 0; i < 2; i++ {
		resp, err := ctrls[0].CreateVolume(c, createReq(fmt.Sprintf("v-%d", i), 4*mib, cap))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, resp.Volume.VolumeId)
	}
	unlock, err := ctrls[0].lockNode(c, "n1")
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(c, 100*time.Millisecond)
	defer cancel()
	_, err = ctrls[1].ControllerPublishVolume(short, &csi.ControllerPublishVolumeRequest{VolumeId: ids[0], NodeId: "n1", VolumeCapability: cap})
	wantCode(t, err, codes.Aborted)
	if got := attachedTo(t, ctrls[1], "n1"); got != 0 {
		t.Fatalf("%d attachments after an aborted publish", got)
	}
	done := make(chan error, 1)
	go func() {
		_, err := ctrls[1].ControllerPublishVolume(c, &csi.ControllerPublishVolumeRequest{VolumeId: ids[1], NodeId: "n1", VolumeCapability: cap})
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("publish went through while the other controller held the node lock: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	unlock()
	if err := <-done; err != nil {
		t.Fatalf("publish after the lock was released: %v", err)
	}
	if got := attachedTo(t, ctrls[0], "n1"); got != 1 {
		t.Fatalf("%d attachments, want 1", got)
	}
}
