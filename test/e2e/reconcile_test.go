package e2e

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// TestReconcileRepairsHandEdits: statuses someone changed by hand, which the
// attacher's informer filters out as status-only updates, are repaired by
// the ListVolumes reconcile (--reconcile-sync=2s):
//   - "flipped": attached and published, then patched to attached=false;
//   - "claimed": patched to attached=true before any attacher saw it, so the
//     driver never published it.
//
// Both end attached, with the finalizer, and published on the driver.
func TestReconcileRepairsHandEdits(t *testing.T) {
	r := newRig(t)
	node := r.nodeName("a")
	r.createCSINode(node, nodeA)
	vols := r.createVolumes("rec", 2)

	claimed := r.createVAs(vols[1:], node)
	r.patchVAStatus(claimed[0], `{"status":{"attached":true}}`)

	a := r.startAttacher("attacher", "--reconcile-sync=2s")
	flipped := r.createVAs(vols[:1], node)
	r.waitVAs("attached normally", shortWait, flipped, attachedTo(nodeA))
	r.patchVAStatus(flipped[0], `{"status":{"attached":false}}`)
	start := time.Now()

	both := append(flipped, claimed...)
	r.waitVAs("both repaired", shortWait, both, attachedTo(nodeA))
	r.waitPublished("both published on the driver", vols, allOn(vols, nodeA))
	t.Logf("Both hand edits repaired %s after the flip", time.Since(start).Round(time.Millisecond))
	if got := r.scrape(a.metrics).reconcileResyncs(); got < 2 {
		t.Errorf("attacher reconcile re-syncs: %g, want at least 2 (one per hand edit)", got)
	}

	r.deleteVAs(both)
	r.waitVAs("detached", shortWait, both, gone)
	r.checkPublished("after the detaches", vols, nil)
	r.deletePVs(vols)
	r.waitPVsReleased("PersistentVolumes released", vols)
}

// waitPublished waits until the driver's records of vols are want.
func (r *rig) waitPublished(what string, vols []volume, want map[string][]string) {
	r.t.Helper()
	var diffs []string
	err := wait.PollUntilContextTimeout(r.ctx, 200*time.Millisecond, shortWait, true, func(context.Context) (bool, error) {
		got := r.published()
		diffs = diffs[:0]
		for _, v := range vols {
			w := slices.Clone(want[v.handle])
			slices.Sort(w)
			if g := got[v.handle]; !slices.Equal(g, w) {
				diffs = append(diffs, fmt.Sprintf("%s (PV %s): published on %v, want %v", v.handle, v.pv, g, w))
			}
		}
		return len(diffs) == 0, nil
	})
	if err != nil {
		r.t.Fatalf("%s: after %s the driver's records disagree: %v", what, shortWait, diffs)
	}
}
