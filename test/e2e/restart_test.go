package e2e

import (
	"context"
	"net/http"
	"testing"
	"time"

	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
)

// TestAttacherKilledMidway: the attacher is killed with SIGKILL while it
// attaches 200 VolumeAttachments (slowed by a low API rate so that the kill
// lands in the middle) and started again: all end attached, the driver's
// records match the objects, and after deletion no VolumeAttachment or PV
// keeps a finalizer and no volume stays published.
func TestAttacherKilledMidway(t *testing.T) {
	r := newRig(t)
	node := r.nodeName("a")
	r.createCSINode(node, nodeA)
	const (
		n       = 200
		killAt  = 40
		workers = 32 // the attacher's default --worker-threads
	)
	vols := r.createVolumes("kill", n)
	// About 3 writes per attach: some 13 attaches/s.
	a := r.startAttacher("attacher", "--kube-api-qps=40", "--kube-api-burst=40")

	names := r.createVAs(vols, node)
	attached := r.waitAttachedCount(killAt, names)
	a.Kill()
	// What happened between the count and the kill is unknown; the
	// objects are read again below.
	if attached >= n {
		t.Fatalf("all %d VolumeAttachments were attached before the kill; lower the attacher's --kube-api-qps so the kill lands mid-way", n)
	}
	atKill := r.scrape(r.driverMetrics).driverCalls(methodPublish, "OK")
	t.Logf("Killed the attacher (SIGKILL) with %d of %d VolumeAttachments seen attached and %g ControllerPublishVolume calls done", attached, n, atKill)

	start := time.Now()
	a = r.startAttacher("attacher")
	r.waitVAs("all attached after the restart", longWait, names, attachedTo(nodeA))
	t.Logf("The restarted attacher finished the remaining attaches in %s", time.Since(start).Round(time.Millisecond))
	r.checkPublished("after the restart", vols, allOn(vols, nodeA))

	// A publish that the killed process did but could not record is done
	// again (idempotent), so there may be a few more calls than objects,
	// never more than one per worker that was busy at the kill.
	publishes := r.scrape(r.driverMetrics).driverCalls(methodPublish, "OK")
	t.Logf("ControllerPublishVolume calls for %d VolumeAttachments: %g (%g repeated after the kill)", n, publishes, publishes-n)
	if publishes < n || publishes > n+workers {
		t.Errorf("driver ControllerPublishVolume OK calls: %g, want between %d and %d", publishes, n, n+workers)
	}

	r.deleteVAs(names)
	r.waitVAs("all detached", longWait, names, gone)
	r.checkPublished("after the detaches", vols, nil)
	r.deletePVs(vols)
	r.waitPVsReleased("PersistentVolumes released", vols)
	expectCount(t, "restarted attacher's detaches", r.scrape(a.metrics).detaches(), n)
}

// waitAttachedCount watches the named VolumeAttachments until at least
// want of them are attached and returns how many are (it may be more: the
// count is taken at the event that crossed want).
func (r *rig) waitAttachedCount(want int, names []string) int {
	r.t.Helper()
	ours := make(map[string]bool, len(names))
	for _, name := range names {
		ours[name] = true
	}
	attached := map[string]bool{}
	ctx, cancel := context.WithTimeout(r.ctx, longWait)
	defer cancel()
	opts := r.listOptions()
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = opts.LabelSelector
			return r.client.StorageV1().VolumeAttachments().List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = opts.LabelSelector
			return r.client.StorageV1().VolumeAttachments().Watch(ctx, o)
		},
	}
	_, err := watchtools.UntilWithSync(ctx, lw, &storagev1.VolumeAttachment{}, nil, func(ev watch.Event) (bool, error) {
		va, ok := ev.Object.(*storagev1.VolumeAttachment)
		if !ok || !ours[va.Name] {
			return false, nil
		}
		if ev.Type != watch.Deleted && va.Status.Attached {
			attached[va.Name] = true
		} else {
			delete(attached, va.Name)
		}
		return len(attached) >= want, nil
	})
	if err != nil {
		r.t.Fatalf("waiting for %d of %d VolumeAttachments to be attached: %v (%d were after %s)", want, len(names), err, len(attached), longWait)
	}
	return len(attached)
}

// TestDriverRestart: the driver stops (SIGTERM, its socket goes) while the
// attacher runs; a VolumeAttachment created meanwhile waits in the queue
// (no attach error, no Event) until the driver is started again on the same
// socket, then attaches with exactly one ControllerPublishVolume.
func TestDriverRestart(t *testing.T) {
	r := newRig(t)
	node := r.nodeName("a")
	r.createCSINode(node, nodeA)
	a := r.startAttacher("attacher")
	vols := r.createVolumes("restart", 2)

	before := r.createVAs(vols[:1], node)
	r.waitVAs("attached before the driver stops", shortWait, before, attachedTo(nodeA))
	expectCount(t, "driver ControllerPublishVolume calls before the stop", r.scrape(r.driverMetrics).driverCalls(methodPublish, ""), 1)

	r.driver.Stop()
	r.waitHealthz(a, http.StatusServiceUnavailable, "the attacher noticed that the driver is gone")
	during := r.createVAs(vols[1:], node)
	// Seen and queued, not failed: the workers wait for the driver.
	r.waitMetric(a, "a VolumeAttachment waits in the attach queue", func(m metricSet) bool {
		return m.value("loopvol_attacher_queue_depth", map[string]string{"operation": "attach"}) == 1
	})
	if va := r.getVA(during[0]); va.Status.Attached || va.Status.AttachError != nil {
		t.Fatalf("VolumeAttachment created while the driver is down: %s; want it untouched until the driver is back", describeVA(va))
	}

	start := time.Now()
	r.startDriver()
	r.waitVAs("attached after the driver came back", shortWait, during, attachedTo(nodeA))
	t.Logf("Attached %s after the driver was started again", time.Since(start).Round(time.Millisecond))
	r.waitHealthz(a, http.StatusOK, "the attacher reports healthy again")
	r.checkPublished("after the driver restart", vols, allOn(vols, nodeA))

	dm, am := r.scrape(r.driverMetrics), r.scrape(a.metrics)
	expectCount(t, "restarted driver's ControllerPublishVolume calls", dm.driverCalls(methodPublish, ""), 1)
	expectCount(t, "attacher ControllerPublishVolume calls in all", am.sidecarCalls(methodPublish, ""), 2)
	expectCount(t, "attacher attach errors", am.attachErrors(), 0)

	names := append(before, during...)
	r.deleteVAs(names)
	r.waitVAs("all detached", shortWait, names, gone)
	r.checkPublished("after the detaches", vols, nil)
	r.deletePVs(vols)
	r.waitPVsReleased("PersistentVolumes released", vols)
}

// waitHealthz waits until the attacher's /healthz answers code.
func (r *rig) waitHealthz(a *attacher, code int, what string) {
	r.t.Helper()
	last := 0
	err := wait.PollUntilContextTimeout(r.ctx, 200*time.Millisecond, shortWait, true, func(ctx context.Context) (bool, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.healthz, nil)
		if err != nil {
			return false, err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		last = resp.StatusCode
		return last == code, nil
	})
	if err != nil {
		r.t.Fatalf("%s: /healthz of attacher %s answered %d, not %d, for %s", what, a.Name, last, code, shortWait)
	}
}

// waitMetric waits until ok holds for the attacher's metrics.
func (r *rig) waitMetric(a *attacher, what string, ok func(metricSet) bool) {
	r.t.Helper()
	err := wait.PollUntilContextTimeout(r.ctx, 200*time.Millisecond, shortWait, true, func(ctx context.Context) (bool, error) {
		m, err := scrapeOnce(ctx, a.metrics)
		return err == nil && ok(m), nil
	})
	if err != nil {
		m, _ := scrapeOnce(r.ctx, a.metrics)
		r.t.Fatalf("%s: not so after %s; attacher %s queue depth by operation: %s",
			what, shortWait, a.Name, m.byLabel("loopvol_attacher_queue_depth", "operation"))
	}
}
