package attach

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestMetrics(t *testing.T) {
	f := newFixture(t, allCaps,
		vaObj("ok", "pv1"), pvObj("pv1", "pool.vol1"),
		vaObj("full", "pv2"), pvObj("pv2", "pool.vol2"),
		vaObj("gone", "pv3", deleting, withFinalizers(finalizer), withNodeIDAnnotation(testNodeID)), pvObj("pv3", "pool.vol3"),
		csiNodeObj(testNode, testNodeID))
	for _, name := range []string{"ok", "full", "gone"} {
		f.c.vaAdded(f.va(name))
	}
	f.Clock.Step(90 * time.Second)
	f.c.vaAdded(f.va("ok")) // queued again: still pending since the first time

	check := func(want string) {
		t.Helper()
		names := []string{
			"loopvol_attacher_attaches_total", "loopvol_attacher_attach_errors_total",
			"loopvol_attacher_detaches_total", "loopvol_attacher_detach_errors_total",
			"loopvol_attacher_queue_depth", "loopvol_attacher_queue_oldest_item_age_seconds",
		}
		if err := testutil.GatherAndCompare(f.Registry, strings.NewReader(want), names...); err != nil {
			t.Error(err)
		}
	}
	const help = `
# HELP loopvol_attacher_attaches_total VolumeAttachments marked attached (after a successful ControllerPublishVolume, or without one for drivers that do not publish).
# TYPE loopvol_attacher_attaches_total counter
# HELP loopvol_attacher_detaches_total VolumeAttachments detached (ControllerUnpublishVolume succeeded and the finalizer was removed).
# TYPE loopvol_attacher_detaches_total counter
# HELP loopvol_attacher_queue_depth VolumeAttachments waiting for an attach or a detach: queued, in backoff after a failure, or being processed.
# TYPE loopvol_attacher_queue_depth gauge
# HELP loopvol_attacher_queue_oldest_item_age_seconds Age of the oldest VolumeAttachment waiting for an attach or a detach (0 when none waits): how long the worst backlog has lasted.
# TYPE loopvol_attacher_queue_oldest_item_age_seconds gauge
`
	check(help + `
loopvol_attacher_attaches_total 0
loopvol_attacher_detaches_total 0
loopvol_attacher_queue_depth{operation="attach"} 2
loopvol_attacher_queue_depth{operation="detach"} 1
loopvol_attacher_queue_oldest_item_age_seconds{operation="attach"} 90
loopvol_attacher_queue_oldest_item_age_seconds{operation="detach"} 90
`)

	// "ok" attaches; "full" fails with RESOURCE_EXHAUSTED and stays pending;
	// "gone" detaches.
	f.c.processNextVA(f.Ctx, f.c.attachQ) // ok
	f.csi.publishErr = status.Error(codes.ResourceExhausted, "full")
	f.c.processNextVA(f.Ctx, f.c.attachQ) // full
	f.c.processNextVA(f.Ctx, f.c.detachQ) // gone
	f.Clock.Step(10 * time.Second)
	check(help + `
# HELP loopvol_attacher_attach_errors_total Failed attach attempts by gRPC code (None: failed before the driver answered, e.g. a missing PersistentVolume or node ID).
# TYPE loopvol_attacher_attach_errors_total counter
loopvol_attacher_attach_errors_total{grpc_status_code="ResourceExhausted"} 1
loopvol_attacher_attaches_total 1
loopvol_attacher_detaches_total 1
loopvol_attacher_queue_depth{operation="attach"} 1
loopvol_attacher_queue_depth{operation="detach"} 0
loopvol_attacher_queue_oldest_item_age_seconds{operation="attach"} 100
loopvol_attacher_queue_oldest_item_age_seconds{operation="detach"} 0
`)
}
