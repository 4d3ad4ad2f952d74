package e2e

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// TestAttachDetach: one volume attached and detached (its PV deleted first,
// so the PV finalizer must wait for the VolumeAttachment), then 200
// VolumeAttachments created at once: each attached with exactly one
// ControllerPublishVolume (driver and attacher counts agree, the 2 s
// reconcile never re-publishes), the driver's records match, and after
// deletion every finalizer is gone and every volume unpublished.
func TestAttachDetach(t *testing.T) {
	r := newRig(t)
	node := r.nodeName("a")
	r.createCSINode(node, nodeA)
	a := r.startAttacher("attacher")

	// One volume.
	one := r.createVolumes("one", 1)
	names := r.createVAs(one, node)
	took := r.waitVAs("one VolumeAttachment attached", shortWait, names, attachedTo(nodeA))
	t.Logf("One VolumeAttachment attached after %s", took.Round(time.Millisecond))
	r.checkPublished("after one attach", one, allOn(one, nodeA))
	if pv := r.getPV(one[0].pv); !slices.Contains(pv.Finalizers, finalizer) {
		t.Fatalf("PersistentVolume %s of an attached volume lacks the finalizer %s: finalizers %v", pv.Name, finalizer, pv.Finalizers)
	}
	expectCount(t, "driver ControllerPublishVolume OK calls after one attach", r.scrape(r.driverMetrics).driverCalls(methodPublish, "OK"), 1)

	// The PV goes first: it must keep the finalizer while the
	// VolumeAttachment needs it. Nothing here waits for the attacher, so
	// the check below sees the state right after the delete.
	r.deletePVs(one)
	if pv := r.getPV(one[0].pv); pv.DeletionTimestamp == nil || !slices.Contains(pv.Finalizers, finalizer) {
		t.Fatalf("PersistentVolume %s, deleted while its VolumeAttachment exists: deletionTimestamp %v, finalizers %v; want it kept by %s",
			pv.Name, pv.DeletionTimestamp, pv.Finalizers, finalizer)
	}
	r.deleteVAs(names)
	r.waitVAs("one VolumeAttachment detached", shortWait, names, gone)
	r.waitPVsReleased("one PersistentVolume released", one)
	r.checkPublished("after one detach", one, nil)
	dm := r.scrape(r.driverMetrics)
	expectCount(t, "driver ControllerUnpublishVolume OK calls after one detach", dm.driverCalls(methodUnpublish, "OK"), 1)

	// 200 at once.
	const n = 200
	many := r.createVolumes("many", n)
	start := time.Now()
	names = r.createVAs(many, node)
	r.waitVAs("200 VolumeAttachments attached", longWait, names, attachedTo(nodeA))
	took = time.Since(start)
	t.Logf("%d VolumeAttachments attached %s after the first was created (%.0f attaches/s)", n, took.Round(time.Millisecond), n/took.Seconds())
	r.checkPublished("after 200 attaches", many, allOn(many, nodeA))
	if rss, err := a.PeakRSS(); err == nil {
		t.Logf("Attacher peak RSS after %d attaches: %.1f MiB", n+1, float64(rss)/(1<<20))
	}

	dm, am := r.scrape(r.driverMetrics), r.scrape(a.metrics)
	expectCount(t, "driver ControllerPublishVolume OK calls", dm.driverCalls(methodPublish, "OK"), n+1)
	expectCount(t, "driver ControllerPublishVolume calls (any code)", dm.driverCalls(methodPublish, ""), n+1)
	expectCount(t, "attacher ControllerPublishVolume OK calls", am.sidecarCalls(methodPublish, "OK"), n+1)
	expectCount(t, "attacher attaches", am.attaches(), n+1)
	expectCount(t, "attacher attach errors", am.attachErrors(), 0)
	if resyncs := am.reconcileResyncs(); resyncs != 0 {
		// What the reconcile saw, and what the driver could not read while
		// it listed: the lines the log's tail would not show.
		t.Errorf("attacher reconcile re-syncs (nothing disagreed): %g, want 0; the attacher's reasons:\n%s\nthe driver's unreadable records:\n%s",
			resyncs, linesWith(a.Log(), "disagrees with the driver"), linesWith(r.driver.Log(), "cannot be read"))
	}

	start = time.Now()
	r.deleteVAs(names)
	r.waitVAs("200 VolumeAttachments detached", longWait, names, gone)
	t.Logf("%d VolumeAttachments detached and gone %s after the first delete", n, time.Since(start).Round(time.Millisecond))
	r.checkPublished("after 200 detaches", many, nil)
	r.deletePVs(many)
	r.waitPVsReleased("200 PersistentVolumes released", many)

	dm, am = r.scrape(r.driverMetrics), r.scrape(a.metrics)
	expectCount(t, "driver ControllerUnpublishVolume OK calls", dm.driverCalls(methodUnpublish, "OK"), n+1)
	expectCount(t, "attacher detaches", am.detaches(), n+1)
	expectCount(t, "driver ControllerPublishVolume calls in all (none during the detaches)", dm.driverCalls(methodPublish, ""), n+1)
}

// expectCount fails the test when a counter is not exactly want.
func expectCount(t *testing.T, what string, got, want float64) {
	t.Helper()
	if got != want {
		t.Errorf("%s: %g, want %g", what, got, want)
	}
}

// linesWith is the lines of log that contain substr.
func linesWith(log, substr string) string {
	var out strings.Builder
	for l := range strings.Lines(log) {
		if strings.Contains(l, substr) {
			out.WriteString(l)
		}
	}
	return out.String()
}
