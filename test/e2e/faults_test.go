package e2e

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/util/wait"
)

// Tests of the attacher under faults (issue 18): a leader frozen past its
// Lease, a publication nobody wants, per-object state after bursts, the
// API server killed, a driver slower than --timeout.

// trackedObjects sums loopvol_attacher_tracked_objects over its maps.
func (s metricSet) trackedObjects() float64 { return s.value("loopvol_attacher_tracked_objects", nil) }

// waitScrape waits until cond holds for a scrape of url and returns it.
func (r *rig) waitScrape(what, url string, timeout time.Duration, cond func(metricSet) bool) metricSet {
	r.t.Helper()
	var last metricSet
	err := wait.PollUntilContextTimeout(r.ctx, 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		s, err := scrapeOnce(ctx, url)
		if err != nil {
			return false, nil
		}
		last = s
		return cond(s), nil
	})
	if err != nil {
		r.t.Fatalf("%s: not reached within %s", what, timeout)
	}
	return last
}

// TestFaultFrozenLeader: the leader holds failed attaches in backoff (the
// node is not known to the driver yet) and is frozen with SIGSTOP for
// longer than the Lease; the standby takes over, attaches everything once
// the node is known, then detaches it all; the old leader is resumed. It
// must publish nothing (its cache still shows the VolumeAttachments live
// and wanting an attach), leave nothing published, and exit: it lost the
// Lease.
func TestFaultFrozenLeader(t *testing.T) {
	r := newRig(t)
	ns := r.env.Namespace(t)
	node := r.nodeName("a")
	const nodeX = "node-x" // no node plugin yet: publishes fail with NOT_FOUND
	r.createCSINode(node, nodeX)
	const n = 16
	vols := r.createVolumes("frozen", n)
	args := []string{
		"--leader-election", "--leader-election-namespace=" + ns,
		"--leader-election-lease-duration=" + leaseDuration.String(),
		"--leader-election-renew-deadline=" + renewDeadline.String(),
		"--leader-election-retry-period=" + retryPeriod.String(),
		"--retry-interval-start=200ms", "--retry-interval-max=1s",
	}
	replicas := []*attacher{r.startAttacher("replica-1", args...), r.startAttacher("replica-2", args...)}
	ids := []string{r.waitIdentity(replicas[0]), r.waitIdentity(replicas[1])}
	holder := r.waitLeaseHolder(ns, func(h string) bool { return h == ids[0] || h == ids[1] }, shortWait)
	leader, standby, standbyID := replicas[0], replicas[1], ids[1]
	if holder == ids[1] {
		leader, standby, standbyID = replicas[1], replicas[0], ids[0]
	}

	names := r.createVAs(vols, node)
	r.waitVAs("attaches failing on the leader", shortWait, names, attachFailedWith(int32(codes.NotFound)))

	if err := syscall.Kill(leader.Pid(), syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	frozen := time.Now()
	t.Cleanup(func() { _ = syscall.Kill(leader.Pid(), syscall.SIGCONT) }) // so that it can be stopped
	r.waitLeaseHolder(ns, func(h string) bool { return h == standbyID }, leaseDuration+shortWait)
	t.Logf("%s froze %s; %s holds the Lease after %s", "SIGSTOP", leader.Name, standby.Name, time.Since(frozen).Round(time.Millisecond))
	r.startNodePlugin(nodeX)
	r.waitVAs("attached by the new leader", shortWait, names, attachedTo(nodeX))
	r.deleteVAs(names)
	r.waitVAs("detached by the new leader", shortWait, names, gone)
	r.checkPublished("after the new leader detached everything", vols, nil)
	before := r.scrape(r.driverMetrics)

	if err := syscall.Kill(leader.Pid(), syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	t.Logf("Resumed %s after %s frozen (lease duration %s)", leader.Name, time.Since(frozen).Round(time.Millisecond), leaseDuration)
	select {
	case <-leader.Done():
	case <-time.After(longWait):
		t.Fatalf("the old leader %s still runs %s after it was resumed; it lost its Lease", leader.Name, longWait)
	}
	after := r.scrape(r.driverMetrics)
	for _, m := range []string{methodPublish, methodUnpublish} {
		expectCount(t, "driver "+m+" calls after the old leader resumed", after.driverCalls(m, "")-before.driverCalls(m, ""), 0)
	}
	r.checkPublished("after the old leader resumed", vols, nil)
	if !strings.Contains(leader.Log(), "Stopping the controllers: the Lease was not renewed within the lease duration") {
		t.Errorf("the old leader did not log why it stopped acting:\n%s", leader.Tail(4096))
	}
	r.deletePVs(vols)
	r.waitPVsReleased("PersistentVolumes released", vols)
}

// TestFaultLeakedPublishRepaired: a volume the driver has published to a
// node with no VolumeAttachment wanting it (what a replica acting after it
// lost its Lease leaves) is unpublished by the reconcile after its grace
// period; the volumes VolumeAttachments want stay published.
func TestFaultLeakedPublishRepaired(t *testing.T) {
	r := newRig(t)
	node := r.nodeName("a")
	r.createCSINode(node, nodeA)
	vols := r.createVolumes("leak", 4)
	wanted, leaked := vols[:2], vols[2:]
	a := r.startAttacher("attacher")
	names := r.createVAs(wanted, node)
	r.waitVAs("attached", shortWait, names, attachedTo(nodeA))
	for _, v := range leaked {
		if _, err := r.ctrl.ControllerPublishVolume(r.ctx, &csi.ControllerPublishVolumeRequest{
			VolumeId: v.handle, NodeId: nodeA, VolumeCapability: mountCapability(),
		}); err != nil {
			t.Fatalf("publish %s behind the attacher's back: %v", v.handle, err)
		}
	}
	start := time.Now()
	err := wait.PollUntilContextTimeout(r.ctx, 200*time.Millisecond, shortWait, true, func(context.Context) (bool, error) {
		got := r.published()
		for _, v := range leaked {
			if len(got[v.handle]) > 0 {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("the leaked publications were not repaired within %s: %v", shortWait, r.published())
	}
	t.Logf("Leaked publications repaired %s after they were made (reconcile every 2 s, grace 4 s)", time.Since(start).Round(time.Millisecond))
	r.checkPublished("the wanted volumes stay published", vols, allOn(wanted, nodeA))
	expectCount(t, "repairs counted", r.scrape(a.metrics).value("loopvol_attacher_leaked_publishes_unpublished_total", nil), float64(len(leaked)))
	r.deleteVAs(names)
	r.waitVAs("detached", shortWait, names, gone)
	r.deletePVs(vols)
	r.waitPVsReleased("PersistentVolumes released", vols)
}

// TestFaultStateFreedAfterBursts: after bursts of attaches and detaches
// the attacher's per-object state is empty again (the gauge on /metrics),
// and its heap does not grow from burst to burst.
func TestFaultStateFreedAfterBursts(t *testing.T) {
	r := newRig(t)
	node := r.nodeName("a")
	r.createCSINode(node, nodeA)
	const n, bursts = 100, 3
	vols := r.createVolumes("burst", n)
	a := r.startAttacher("attacher")
	var heap []float64
	for b := range bursts {
		names := r.createVAs(vols, node)
		r.waitVAs(fmt.Sprintf("burst %d attached", b), longWait, names, attachedTo(nodeA))
		r.deleteVAs(names)
		r.waitVAs(fmt.Sprintf("burst %d detached", b), longWait, names, gone)
		s := r.waitScrape(fmt.Sprintf("burst %d: per-object state empty", b), a.metrics, shortWait,
			func(s metricSet) bool { return s.trackedObjects() == 0 })
		heap = append(heap, s.value("go_memstats_heap_objects", nil))
	}
	rss, _ := a.PeakRSS()
	t.Logf("After %d bursts of %d attach+detach: tracked objects 0, heap objects per burst %v, peak RSS %.1f MB", bursts, n, heap, float64(rss)/(1<<20))
	r.checkPublished("after the bursts", vols, nil)
	r.deletePVs(vols)
	r.waitPVsReleased("PersistentVolumes released", vols)
}

// TestFaultAPIServerOutage: kube-apiserver is killed for 30 s in the middle
// of a burst of attaches and detaches. While it is gone the attacher calls
// the driver at most a few times per VolumeAttachment (the calls in flight
// when it went), and once it is back everything is attached, detached and
// released (within seconds: the test logs how long).
func TestFaultAPIServerOutage(t *testing.T) {
	r := newRig(t)
	node := r.nodeName("a")
	r.createCSINode(node, nodeA)
	const n = 100
	vols := r.createVolumes("outage", 2*n)
	old, fresh := vols[:n], vols[n:]
	// A lower API rate than the default 150, so that the kill lands
	// mid-burst: the burst below is some 600 requests.
	a := r.startAttacher("attacher", "--kube-api-qps=100", "--kube-api-burst=100")
	oldNames := r.createVAs(old, node)
	r.waitVAs("first attached", longWait, oldNames, attachedTo(nodeA))

	// A burst of detaches (and PV deletions) and attaches at once.
	r.deleteVAs(oldNames)
	r.deletePVs(old)
	freshNames := r.createVAs(fresh, node)
	r.waitAttachedCount(n/5, freshNames)
	left := r.scrape(a.metrics)
	restart, err := r.env.KillAPIServer()
	if err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	atKill := r.scrape(r.driverMetrics)
	const outage = 30 * time.Second
	time.Sleep(outage) // the fault itself: how long the API server stays away
	during := r.scrape(r.driverMetrics)
	if err := restart(); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	t.Logf("kube-apiserver was away %s; at the kill %g attaches and %g detaches were pending", back.Sub(killed).Round(time.Millisecond),
		left.value("loopvol_attacher_queue_depth", map[string]string{"operation": "attach"}),
		left.value("loopvol_attacher_queue_depth", map[string]string{"operation": "detach"}))
	calls := during.driverCalls(methodPublish, "") + during.driverCalls(methodUnpublish, "") -
		atKill.driverCalls(methodPublish, "") - atKill.driverCalls(methodUnpublish, "")
	t.Logf("Driver publish+unpublish calls during the outage: %g for %d VolumeAttachments (%.2f per VolumeAttachment)", calls, 2*n, calls/float64(2*n))
	// At most the calls in flight at the kill: one per worker of each queue.
	if calls > 64 {
		t.Errorf("driver calls while the API server was away: %g, want at most 64 (the calls in flight at the kill)", calls)
	}

	r.waitVAs("fresh attached after the API server returned", shortWait, freshNames, attachedTo(nodeA))
	r.waitVAs("old detached after the API server returned", shortWait, oldNames, gone)
	r.waitPVsReleasedNoCleanup("old PersistentVolumes lost the finalizer", old)
	// A figure, not a bound (the waits above are the bound): what was
	// left is at most the whole burst, some 600 requests, 6 s at 100
	// requests/s plus the informers' relist on a quiet machine; make test
	// runs this beside the real cluster, which takes the cores it wants.
	t.Logf("Everything attached, detached and released %s after the API server returned",
		time.Since(back).Round(time.Millisecond))
	if !strings.Contains(a.Log(), "The API server is back; retrying what failed meanwhile") {
		t.Errorf("the attacher did not log the API server's return")
	}
	r.checkPublished("after the outage", vols, allOn(fresh, nodeA))
	r.waitPVsReleased("old PersistentVolumes released", old)
	r.deleteVAs(freshNames)
	r.waitVAs("fresh detached", shortWait, freshNames, gone)
	r.deletePVs(fresh)
	r.waitPVsReleased("PersistentVolumes released", fresh)
}

// waitPVsReleasedNoCleanup waits until every PV of vols has lost the
// attacher's finalizer (or is gone).
func (r *rig) waitPVsReleasedNoCleanup(what string, vols []volume) {
	r.t.Helper()
	err := wait.PollUntilContextTimeout(r.ctx, 200*time.Millisecond, shortWait, true, func(ctx context.Context) (bool, error) {
		list, err := r.client.CoreV1().PersistentVolumes().List(ctx, r.listOptions())
		if err != nil {
			return false, nil
		}
		want := map[string]bool{}
		for _, v := range vols {
			want[v.pv] = true
		}
		for _, pv := range list.Items {
			if want[pv.Name] {
				for _, f := range pv.Finalizers {
					if f == finalizer {
						return false, nil
					}
				}
			}
		}
		return true, nil
	})
	if err != nil {
		r.t.Fatalf("%s: not within %s", what, shortWait)
	}
}

// slowDriver stands between the attacher and the real driver and delays
// each ControllerPublishVolume by delay; a call whose deadline passes in
// the delay fails with DEADLINE_EXCEEDED without reaching the driver.
type slowDriver struct {
	csi.UnimplementedIdentityServer
	csi.UnimplementedControllerServer
	id     csi.IdentityClient
	ctrl   csi.ControllerClient
	delay  time.Duration
	passed atomic.Int64
}

func (s *slowDriver) GetPluginInfo(ctx context.Context, req *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return s.id.GetPluginInfo(ctx, req)
}

func (s *slowDriver) GetPluginCapabilities(ctx context.Context, req *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	return s.id.GetPluginCapabilities(ctx, req)
}

func (s *slowDriver) Probe(ctx context.Context, req *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	return s.id.Probe(ctx, req)
}

func (s *slowDriver) ControllerGetCapabilities(ctx context.Context, req *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	return s.ctrl.ControllerGetCapabilities(ctx, req)
}

func (s *slowDriver) ListVolumes(ctx context.Context, req *csi.ListVolumesRequest) (*csi.ListVolumesResponse, error) {
	return s.ctrl.ListVolumes(ctx, req)
}

func (s *slowDriver) ControllerUnpublishVolume(ctx context.Context, req *csi.ControllerUnpublishVolumeRequest) (*csi.ControllerUnpublishVolumeResponse, error) {
	return s.ctrl.ControllerUnpublishVolume(ctx, req)
}

func (s *slowDriver) ControllerPublishVolume(ctx context.Context, req *csi.ControllerPublishVolumeRequest) (*csi.ControllerPublishVolumeResponse, error) {
	select {
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	case <-time.After(s.delay):
	}
	s.passed.Add(1)
	return s.ctrl.ControllerPublishVolume(ctx, req)
}

// startSlowDriver serves a slowDriver in front of the rig's driver and
// returns its socket.
func (r *rig) startSlowDriver(delay time.Duration) (string, *slowDriver) {
	r.t.Helper()
	sock := filepath.Join(r.dir, "slow.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		r.t.Fatal(err)
	}
	s := &slowDriver{id: csi.NewIdentityClient(r.driver.Conn), ctrl: r.ctrl, delay: delay}
	srv := grpc.NewServer()
	csi.RegisterIdentityServer(srv, s)
	csi.RegisterControllerServer(srv, s)
	go func() { _ = srv.Serve(ln) }()
	r.t.Cleanup(srv.Stop)
	return "unix://" + sock, s
}

// TestFaultSlowDriver: every ControllerPublishVolume takes 3 s and
// --timeout is 2 s. The first call of each VolumeAttachment times out, the
// cause is logged once, the timeouts are counted, and the next call, with
// twice the timeout, attaches it.
func TestFaultSlowDriver(t *testing.T) {
	r := newRig(t)
	node := r.nodeName("a")
	r.createCSINode(node, nodeA)
	const n = 8
	vols := r.createVolumes("slow", n)
	sock, slow := r.startSlowDriver(3 * time.Second)
	a := r.startAttacher("attacher", "--csi-address="+sock, "--timeout=2s", "--retry-interval-start=200ms")
	names := r.createVAs(vols, node)
	start := time.Now()
	r.waitVAs("attached through the slow driver", longWait, names, attachedTo(nodeA))
	t.Logf("%d VolumeAttachments attached through a 3 s ControllerPublishVolume with --timeout=2s in %s; %d calls reached the driver",
		n, time.Since(start).Round(time.Millisecond), slow.passed.Load())
	timeouts := r.scrape(a.metrics).value("loopvol_attacher_csi_call_timeouts_total", map[string]string{"method": "ControllerPublishVolume"})
	if timeouts < n || timeouts > 2*n {
		t.Errorf("timeouts counted: %g, want between %d and %d (about one per VolumeAttachment)", timeouts, n, 2*n)
	}
	if got := strings.Count(a.Log(), "The driver took longer than the call timeout"); got != 1 {
		t.Errorf("the cause was logged %d times at level 0, want once", got)
	}
	r.checkPublished("after the slow attaches", vols, allOn(vols, nodeA))
	r.deleteVAs(names)
	r.waitVAs("detached", shortWait, names, gone)
	r.deletePVs(vols)
	r.waitPVsReleased("PersistentVolumes released", vols)
}
