package capacity

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	"github.com/loopvol/loopvol/internal/kube"
	"github.com/loopvol/loopvol/internal/kube/kubetest"
	"github.com/loopvol/loopvol/pkg/csiclient"
)

// published starts a fixture of twoZones with classes and drains it: the
// objects exist, the queue is empty and the record of calls and writes is
// cleared.
func published(t *testing.T, objs []runtime.Object, opts ...option) *fixture {
	t.Helper()
	f := newFixture(t, topoCaps, with(twoZones(), objs...), opts...)
	f.drain()
	f.csi.TakeCalls()
	f.writes()
	f.Clock.Step(time.Hour) // PV events refresh at once, not after a refresh delay
	return f
}

// objectOf returns the name of the API server's object of class in zone.
func (f *fixture) objectOf(class, zone string) *storagev1.CSIStorageCapacity {
	f.T.Helper()
	for _, o := range f.apiObjects() {
		if o.StorageClassName == class && o.NodeTopology != nil && o.NodeTopology.MatchLabels[zoneKey] == zone {
			return o
		}
	}
	f.T.Fatalf("no object of class %s in zone %s: %v", class, zone, f.state())
	return nil
}

func TestOwnWritesQueueNothing(t *testing.T) {
	f := newFixture(t, topoCaps, with(twoZones(), class("fast")))
	f.drain() // observes each create after it
	kubetest.Diff(t, "GetCapacity calls", []getCapacityCall{{Pool: "fast-pool", Zone: "z1"}, {Pool: "fast-pool", Zone: "z2"}}, f.csi.TakeCalls())
	if n := len(f.writes()); n != 2 {
		t.Errorf("%d writes, want 2 creates", n)
	}
	if n := f.c.q.Q.Len(); n != 0 {
		t.Errorf("the controller's own creates coming back queued %d items", n)
	}
	// A change of the figures: one patch each, and the patches coming back
	// queue nothing either.
	f.csi.setFree("z1", 9*gi)
	f.csi.setFree("z2", 19*gi)
	f.c.enqueueAll()
	f.drain()
	kubetest.Diff(t, "API writes", []apiAction{
		patch(f.objectOf("fast", "z1").Name, `{"capacity":"9Gi","maximumVolumeSize":"4608Mi"}`),
		patch(f.objectOf("fast", "z2").Name, `{"capacity":"19Gi","maximumVolumeSize":"9728Mi"}`),
	}, f.writes())
	if n := len(f.csi.TakeCalls()); n != 2 {
		t.Errorf("%d GetCapacity calls for two items, want 2 (the patches coming back must not sync again)", n)
	}
}

func TestCacheLagNeverWritesTwice(t *testing.T) {
	f := newFixture(t, topoCaps, with(twoZones(), class("fast")))
	it := workItem{class: "fast", segment: zoneKey + "=z1"}
	// Sync the z1 item twice before the cache sees the create: one create.
	for range 2 {
		if err := f.c.sync(f.Ctx, it); err != nil {
			t.Fatal(err)
		}
	}
	kubetest.Diff(t, "writes of two syncs before the create is seen", []apiAction{create(desc("fast", "z1", "10Gi", "5Gi", "external-provisioner", ""))}, f.writes())

	// A changed figure, patched; synced again before the cache sees the
	// patch: one patch.
	f.observe()
	f.csi.setFree("z1", 8*gi)
	for range 2 {
		if err := f.c.sync(f.Ctx, it); err != nil {
			t.Fatal(err)
		}
	}
	name := f.objectOf("fast", "z1").Name
	kubetest.Diff(t, "writes of two syncs before the patch is seen", []apiAction{patch(name, `{"capacity":"8Gi","maximumVolumeSize":"4Gi"}`)}, f.writes())
	// Another change while the cache is still behind: patched once more,
	// from the controller's own last write.
	f.csi.setFree("z1", 7*gi)
	if err := f.c.sync(f.Ctx, it); err != nil {
		t.Fatal(err)
	}
	kubetest.Diff(t, "writes of a sync over its own unseen patch", []apiAction{patch(name, `{"capacity":"7Gi","maximumVolumeSize":"3584Mi"}`)}, f.writes())
	f.observe()
	if err := f.c.sync(f.Ctx, it); err != nil {
		t.Fatal(err)
	}
	kubetest.Diff(t, "writes once the cache caught up", []apiAction(nil), f.writes())
}

func TestHandEditsRepaired(t *testing.T) {
	f := published(t, []runtime.Object{class("fast")})
	z1 := f.objectOf("fast", "z1")

	// Someone changes the capacity: restored.
	edited := z1.DeepCopy()
	edited.Capacity = resource.NewQuantity(1, resource.BinarySI)
	edited.ResourceVersion = "900"
	if err := f.Client.Tracker().Update(cscResource, edited, ns); err != nil {
		t.Fatal(err)
	}
	f.observe()
	f.drain()
	kubetest.Diff(t, "writes after a hand edit", []apiAction{patch(z1.Name, `{"capacity":"10Gi"}`)}, f.writes())

	// Someone deletes it: made again.
	if err := f.Client.Tracker().Delete(cscResource, ns, z1.Name); err != nil {
		t.Fatal(err)
	}
	f.Client.ClearActions()
	f.observe()
	f.drain()
	kubetest.Diff(t, "writes after a hand delete", []apiAction{create(desc("fast", "z1", "10Gi", "5Gi", "external-provisioner", ""))}, f.writes())
	if len(f.apiObjects()) != 2 {
		t.Errorf("objects after the repair: %v", f.state())
	}
}

func TestClassesComeAndGo(t *testing.T) {
	f := published(t, []runtime.Object{class("fast")})
	fastZ1, fastZ2 := f.objectOf("fast", "z1").Name, f.objectOf("fast", "z2").Name

	f.update(class("slow"))
	f.drain()
	kubetest.Diff(t, "writes after a class was added", []apiAction{
		create(desc("slow", "z1", "10Gi", "5Gi", "external-provisioner", "")),
		create(desc("slow", "z2", "20Gi", "10Gi", "external-provisioner", "")),
	}, f.writes())

	// A metadata-only update of the class queues nothing.
	relabelled := class("slow")
	relabelled.Labels = map[string]string{"x": "y"}
	relabelled.ResourceVersion = "2"
	f.update(relabelled)
	if n := f.c.q.Q.Len(); n != 0 {
		t.Errorf("a label on a class queued %d items", n)
	}

	f.remove(class("fast"))
	f.drain()
	kubetest.Diff(t, "writes after a class was deleted", []apiAction{deleteAction(fastZ1), deleteAction(fastZ2)}, f.writes())
	kubetest.Diff(t, "calls after a class was deleted", []getCapacityCall{{Pool: "slow-pool", Zone: "z1"}, {Pool: "slow-pool", Zone: "z2"}}, f.csi.TakeCalls())
}

func TestSegmentsFollowNodes(t *testing.T) {
	f := published(t, []runtime.Object{class("fast")})
	z2 := f.objectOf("fast", "z2").Name

	// n1 moves from z1 to z3: z3 appears; z1 stays (n3 is still there).
	f.update(node("n1", "z3"))
	f.drain()
	kubetest.Diff(t, "writes after n1 moved to z3", []apiAction{create(desc("fast", "z3", "0", "0", "external-provisioner", ""))}, f.writes())

	// A Node change that leaves the labels alone queues nothing.
	same := node("n1", "z3")
	same.ResourceVersion = "5"
	same.Annotations = map[string]string{"a": "b"}
	f.update(same)
	if n := f.c.q.Q.Len(); n != 0 {
		t.Errorf("a Node update without label changes queued %d items", n)
	}

	// n2 (the only node of z2) loses the label: z2 goes.
	f.update(node("n2", ""))
	f.drain()
	kubetest.Diff(t, "writes after z2's only node lost its label", []apiAction{deleteAction(z2)}, f.writes())

	// n2's CSINode appears again with the label back; then the CSINode of
	// n3 drops the driver and n1 its Node: only z3 of n1... is gone too.
	f.update(node("n2", "z2"))
	f.drain()
	kubetest.Diff(t, "writes after z2 came back", []apiAction{create(desc("fast", "z2", "20Gi", "10Gi", "external-provisioner", ""))}, f.writes())
	z1 := f.objectOf("fast", "z1").Name
	noDriver := csiNode("n3")
	noDriver.Spec.Drivers = noDriver.Spec.Drivers[:1]
	noDriver.ResourceVersion = "2"
	f.update(noDriver)
	f.drain()
	kubetest.Diff(t, "writes after z1's last node dropped the driver", []apiAction{deleteAction(z1)}, f.writes())
	z3 := f.objectOf("fast", "z3").Name
	f.remove(node("n1", "z3"))
	f.drain()
	kubetest.Diff(t, "writes after z3's node was deleted", []apiAction{deleteAction(z3)}, f.writes())
}

func TestPersistentVolumesRefreshTheirSegments(t *testing.T) {
	f := published(t, []runtime.Object{class("fast"), class("slow")})

	// A volume in z1 of class fast: both classes' z1 objects are refreshed
	// (they may share the pool), z2's are not.
	f.csi.setFree("z1", 9*gi)
	v := pv("pv1", "fast", "z1", gi)
	f.update(v)
	f.drain()
	kubetest.Diff(t, "calls after a PV was created in z1", []getCapacityCall{{Pool: "fast-pool", Zone: "z1"}, {Pool: "slow-pool", Zone: "z1"}}, f.csi.TakeCalls())
	kubetest.Diff(t, "writes after a PV was created in z1", []apiAction{
		patch(f.objectOf("fast", "z1").Name, `{"capacity":"9Gi","maximumVolumeSize":"4608Mi"}`),
		patch(f.objectOf("slow", "z1").Name, `{"capacity":"9Gi","maximumVolumeSize":"4608Mi"}`),
	}, f.writes())

	// The refresh delay counts from the last sync.
	f.Clock.Step(time.Second)

	// A resize: refreshed.
	resized := v.DeepCopy()
	resized.ResourceVersion = "2"
	resized.Spec.Capacity["storage"] = *resource.NewQuantity(2*gi, resource.BinarySI)
	f.update(resized)
	f.drain()
	kubetest.Diff(t, "calls after a PV was resized", []getCapacityCall{{Pool: "fast-pool", Zone: "z1"}, {Pool: "slow-pool", Zone: "z1"}}, f.csi.TakeCalls())

	// Another update (the status, a label) or a resync: nothing.
	relabelled := resized.DeepCopy()
	relabelled.ResourceVersion = "3"
	relabelled.Labels = map[string]string{"a": "b"}
	f.update(relabelled)
	f.update(relabelled)
	if n := f.c.q.Q.Len(); n != 0 {
		t.Errorf("a PV update that leaves size, class and affinity alone queued %d items", n)
	}

	// Deleted: refreshed, back to the old figure.
	f.Clock.Step(time.Second)
	f.csi.setFree("z1", 10*gi)
	f.remove(relabelled)
	f.drain()
	kubetest.Diff(t, "writes after the PV was deleted", []apiAction{
		patch(f.objectOf("fast", "z1").Name, `{"capacity":"10Gi","maximumVolumeSize":"5Gi"}`),
		patch(f.objectOf("slow", "z1").Name, `{"capacity":"10Gi","maximumVolumeSize":"5Gi"}`),
	}, f.writes())

	// A volume without node affinity may be anywhere: every segment.
	f.Clock.Step(time.Second)
	f.csi.TakeCalls()
	f.update(pv("pv2", "fast", "", gi))
	f.drain()
	kubetest.Diff(t, "calls after a PV without affinity", []getCapacityCall{
		{Pool: "fast-pool", Zone: "z1"}, {Pool: "fast-pool", Zone: "z2"}, {Pool: "slow-pool", Zone: "z1"}, {Pool: "slow-pool", Zone: "z2"},
	}, f.csi.TakeCalls())

	// A volume in a zone without nodes here: nothing.
	f.update(pv("pv4", "fast", "z9", gi))
	if n := f.c.q.Q.Len(); n != 0 {
		t.Errorf("a PV in a zone the controller does not publish queued %d items", n)
	}

	// Another driver's volume: nothing.
	other := pv("pv3", "fast", "z1", gi)
	other.Spec.CSI.Driver = "other.csi.io"
	f.update(other)
	if n := f.c.q.Q.Len(); n != 0 {
		t.Errorf("another driver's PV queued %d items", n)
	}
}

// TestPersistentVolumeBurstCoalesced: 200 volumes created at once in z1
// cost two syncs of the z1 object (the first at once, the rest folded into
// one at the end of the refresh delay) and two writes, not 200.
func TestPersistentVolumeBurstCoalesced(t *testing.T) {
	const delay = 2 * time.Second
	f := published(t, []runtime.Object{class("fast")}, withRefreshDelay(delay))
	for i := range 200 {
		f.csi.setFree("z1", 10*gi-int64(i+1)*(16<<20))
		f.update(pv("pv-"+itoa(i), "fast", "z1", 16<<20))
		if i == 0 {
			f.drain() // the first refreshes at once
		}
	}
	f.drain()
	kubetest.Diff(t, "calls during the burst", []getCapacityCall{{Pool: "fast-pool", Zone: "z1"}}, f.csi.TakeCalls())
	// The rest come as one delayed refresh. Get blocks until the delaying
	// queue hands it over (real time: the queue's clock is not the fake).
	f.c.processNextItem(f.Ctx)
	f.observe()
	kubetest.Diff(t, "calls after the delay", []getCapacityCall{{Pool: "fast-pool", Zone: "z1"}}, f.csi.TakeCalls())
	want := resource.NewQuantity(10*gi-200*(16<<20), resource.BinarySI)
	if got := f.objectOf("fast", "z1").Capacity; got.Cmp(*want) != 0 {
		t.Errorf("capacity after the burst %s, want %s", got, want)
	}
	if n := len(f.writes()); n != 2 {
		t.Errorf("%d writes for a burst of 200 volumes, want 2", n)
	}
}

func itoa(i int) string { return resource.NewQuantity(int64(i), resource.DecimalSI).String() }

func TestGetCapacityErrors(t *testing.T) {
	f := published(t, []runtime.Object{class("fast")})
	f.csi.err = status.Error(codes.InvalidArgument, "parameter \"pool\" is not known")
	f.c.enqueueAll()
	f.drain()
	kubetest.Diff(t, "writes when GetCapacity fails", []apiAction(nil), f.writes())
	if len(f.apiObjects()) != 2 {
		t.Errorf("objects after GetCapacity failed (they must stay): %v", f.state())
	}
	it := workItem{class: "fast", segment: zoneKey + "=z1"}
	if n := f.c.q.Failures(it); n != 1 {
		t.Errorf("failures of %v: %d, want 1", it, n)
	}
	if !csiclient.IsFinal(f.c.sync(f.Ctx, it)) {
		t.Error("an InvalidArgument from GetCapacity is not treated as final")
	}
}

func TestRunRefusesDriverWithoutGetCapacity(t *testing.T) {
	f := newFixture(t, topoCaps, twoZones())
	f.csi.Caps = csiclient.Capabilities{ControllerService: true, Topology: true}
	c, err := New(Config{
		DriverName: driver, Client: f.Client, Informers: kube.NewInformers(f.Client, 0), CSI: f.csi, Namespace: ns,
		PollInterval: time.Minute, Workers: 1, RetryIntervalStart: time.Second, RetryIntervalMax: time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(f.Ctx, time.Minute)
	defer cancel()
	if err := c.Run(ctx); err == nil || !strings.Contains(err.Error(), "GET_CAPACITY") {
		t.Errorf("Run with a driver without GET_CAPACITY: %v", err)
	}
}

func TestMetrics(t *testing.T) {
	f := newFixture(t, topoCaps, with(twoZones(), class("fast"), class("slow"),
		object("csisc-fast-z1", "fast", "z1", 10*gi, 5*gi),
		object("csisc-fast-z1-dup", "fast", "z1", 10*gi, 5*gi),
		object("csisc-gone", "gone", "z1", 1, 1),
		object("csisc-gone-zone", "slow", "z9", 1, 1)))
	want := func(goal, current, obsolete int) string {
		return "# HELP csistoragecapacities_desired_current Number of CSIStorageCapacity objects that exist and are supposed to be managed automatically.\n" +
			"# TYPE csistoragecapacities_desired_current gauge\n" +
			"csistoragecapacities_desired_current " + itoa(current) + "\n" +
			"# HELP csistoragecapacities_desired_goal Number of CSIStorageCapacity objects that are supposed to be managed automatically: wanted storage classes times topology segments.\n" +
			"# TYPE csistoragecapacities_desired_goal gauge\n" +
			"csistoragecapacities_desired_goal " + itoa(goal) + "\n" +
			"# HELP csistoragecapacities_obsolete Number of CSIStorageCapacity objects that exist and will be deleted automatically (their class or segment is gone). Objects that exist and may need an update are not counted.\n" +
			"# TYPE csistoragecapacities_obsolete gauge\n" +
			"csistoragecapacities_obsolete " + itoa(obsolete) + "\n"
	}
	names := []string{"csistoragecapacities_desired_goal", "csistoragecapacities_desired_current", "csistoragecapacities_obsolete"}
	// 2 classes × 2 zones; fast/z1 exists (twice: counted once); two
	// objects are obsolete.
	if err := testutil.GatherAndCompare(f.Registry, strings.NewReader(want(4, 1, 2)), names...); err != nil {
		t.Errorf("before the sync: %v", err)
	}
	f.drain()
	if err := testutil.GatherAndCompare(f.Registry, strings.NewReader(want(4, 4, 0)), names...); err != nil {
		t.Errorf("after the sync: %v", err)
	}
}

// TestWatchBeforeAnswer: the watch event of the controller's own write may
// arrive before the write's answer; it is still known for its own and
// queues nothing.
func TestWatchBeforeAnswer(t *testing.T) {
	f := newFixture(t, topoCaps, with(twoZones(), class("fast")))
	// A reactor in front of the others: it lets them store the write, then
	// delivers the watch event, then answers.
	chain := slices.Clone(f.Client.ReactionChain)
	f.Client.PrependReactor("*", "csistoragecapacities", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetVerb() != "create" && a.GetVerb() != "patch" {
			return false, nil, nil
		}
		for _, r := range chain {
			if !r.Handles(a) {
				continue
			}
			if handled, obj, err := r.React(a); handled {
				if err == nil {
					f.observe()
				}
				return true, obj, err
			}
		}
		return false, nil, nil
	})
	it := workItem{class: "fast", segment: zoneKey + "=z1"}
	f.drainQueued(t, "nothing") // what the start queued
	if err := f.c.sync(f.Ctx, it); err != nil {
		t.Fatal(err)
	}
	f.drainQueued(t, "the watch event of the controller's own create, seen before its answer")
	f.csi.setFree("z1", 9*gi)
	if err := f.c.sync(f.Ctx, it); err != nil {
		t.Fatal(err)
	}
	f.drainQueued(t, "the watch event of the controller's own patch, seen before its answer")
	if n := len(f.writes()); n != 2 {
		t.Errorf("%d writes, want a create and a patch", n)
	}
}

// drainQueued empties the queue without syncing; what == "nothing" takes
// anything, else each item queued is an error.
func (f *fixture) drainQueued(t *testing.T, what string) {
	t.Helper()
	for f.c.q.Q.Len() > 0 {
		it, _ := f.c.q.Q.Get()
		f.c.q.Q.Done(it)
		if what != "nothing" {
			t.Errorf("%s queued %v", what, it)
		}
	}
}

// TestNoWritesWithoutTheLease: a replica that can no longer be sure it
// holds its Lease publishes nothing; once sure again it does.
func TestNoWritesWithoutTheLease(t *testing.T) {
	f := newFixture(t, topoCaps, with(twoZones(), class("fast")))
	leading := false
	f.Ctx = kube.WithLeaderCheck(f.Ctx, func() error {
		if !leading {
			return kube.ErrNotLeading
		}
		return nil
	})
	f.drain()
	if w := f.writes(); len(w) != 0 {
		t.Fatalf("writes while not sure of the Lease: %+v", w)
	}
	leading = true
	f.c.q.ResetBackoff()
	f.c.enqueueAll()
	f.drain()
	if n := len(f.writes()); n != 2 {
		t.Errorf("%d writes once leading, want 2 creates", n)
	}
}

// TestOldestCheckMetric: loopvol_capacity_oldest_check_seconds counts from
// the start for objects never confirmed, drops to zero when every object
// is, and grows while GetCapacity fails; a replica that is not acting
// reports none.
func TestOldestCheckMetric(t *testing.T) {
	f := newFixture(t, topoCaps, with(twoZones(), class("fast")))
	age := func() (float64, bool) {
		t.Helper()
		mfs, err := f.Registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "loopvol_capacity_oldest_check_seconds" {
				return mf.GetMetric()[0].GetGauge().GetValue(), true
			}
		}
		return 0, false
	}
	if v, ok := age(); ok {
		t.Errorf("a replica that is not acting reports an age of %v", v)
	}
	f.c.mu.Lock()
	f.c.started = f.Clock.Now()
	f.c.mu.Unlock()
	f.Clock.Step(30 * time.Second)
	if v, _ := age(); v != 30 {
		t.Errorf("30 s after the start, nothing confirmed: %v, want 30", v)
	}
	f.drain()
	if v, _ := age(); v != 0 {
		t.Errorf("every object just confirmed: %v, want 0", v)
	}
	f.Clock.Step(2 * time.Minute)
	f.csi.err = status.Error(codes.Unavailable, "driver gone")
	f.c.enqueueAll()
	f.drain()
	if v, _ := age(); v != 120 {
		t.Errorf("2 min of failing GetCapacity: %v, want 120", v)
	}
	if err := testutil.GatherAndCompare(f.Registry, strings.NewReader(
		"# HELP loopvol_capacity_poll_interval_seconds How often every CSIStorageCapacity object is checked against the driver (--capacity-poll-interval).\n"+
			"# TYPE loopvol_capacity_poll_interval_seconds gauge\nloopvol_capacity_poll_interval_seconds 60\n"), "loopvol_capacity_poll_interval_seconds"); err != nil {
		t.Error(err)
	}
}
