package controller

import (
	"context"
	"fmt"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-logr/logr"
	"k8s.io/klog/v2"

	"github.com/loopvol/loopvol/pkg/volspec/volspectest"
)

// BenchmarkCreatePublish times CreateVolume and ControllerPublishVolume of
// one 16 MiB volume in a pool that already holds 200 volumes (100 of them
// attached to the node), on the real filesystem of the temp dir: both calls
// read the pool (capacity, the node's attachment count), so their cost grows
// with it. Run with -benchtime 200x; figures go to docs/benchmarks.md.
func BenchmarkCreatePublish(b *testing.B) {
	for _, call := range []string{"CreateVolume", "ControllerPublishVolume"} {
		b.Run(call, func(b *testing.B) {
			f := newFixture(b, map[string]string{"p1": "z1"})
			f.addNode(b, "p1", "n1", 100000)
			c := klog.NewContext(context.Background(), logr.Discard())
			cap := volspectest.Block(snw)
			for i := range 200 {
				resp, err := f.s.CreateVolume(c, createReq(fmt.Sprintf("seed-%d", i), 16*mib, cap))
				if err != nil {
					b.Fatal(err)
				}
				if i%2 == 0 {
					if _, err := f.s.ControllerPublishVolume(c, &csi.ControllerPublishVolumeRequest{VolumeId: resp.Volume.VolumeId, NodeId: "n1", VolumeCapability: cap}); err != nil {
						b.Fatal(err)
					}
				}
			}
			ids := make([]string, b.N)
			if call == "ControllerPublishVolume" {
				for i := range b.N {
					resp, err := f.s.CreateVolume(c, createReq(fmt.Sprintf("v-%d", i), 16*mib, cap))
					if err != nil {
						b.Fatal(err)
					}
					ids[i] = resp.Volume.VolumeId
				}
			}
			b.ResetTimer()
			for i := range b.N {
				var err error
				if call == "CreateVolume" {
					_, err = f.s.CreateVolume(c, createReq(fmt.Sprintf("v-%d", i), 16*mib, cap))
				} else {
					_, err = f.s.ControllerPublishVolume(c, &csi.ControllerPublishVolumeRequest{VolumeId: ids[i], NodeId: "n1", VolumeCapability: cap})
				}
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
