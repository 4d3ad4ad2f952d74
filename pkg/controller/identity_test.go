package controller

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/loopvol/loopvol/pkg/pool"
)

// TestProbeReadyWhileAPoolIsUsable: a pool that fails its check (here its
// marker is gone) makes Probe log it, not answer not ready, while another
// pool is usable: one broken pool must not take the plugin and its sidecar
// out of service. With no usable pool left it is not ready.
func TestProbeReadyWhileAPoolIsUsable(t *testing.T) {
	f := newFixture(t, map[string]string{"a": "z1", "b": "z1"})
	id := NewIdentity("loopvol.csi.io", "test", true, []*pool.Pool{f.pools["a"], f.pools["b"]})
	probe := func() bool {
		t.Helper()
		resp, err := id.Probe(ctx(t), &csi.ProbeRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetReady().GetValue()
	}
	if !probe() {
		t.Fatal("not ready with both pools usable")
	}
	for _, name := range []string{"b", "a"} {
		if err := os.Remove(filepath.Join(f.root, name, ".loopvol-pool")); err != nil {
			t.Fatal(err)
		}
		if ready, want := probe(), name == "b"; ready != want {
			t.Errorf("pool %s broken too: ready=%t, want %t", name, ready, want)
		}
	}
}
