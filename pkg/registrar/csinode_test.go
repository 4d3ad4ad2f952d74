package registrar

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"
	testingclock "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/loopvol/loopvol/internal/kube"
	"github.com/loopvol/loopvol/internal/kube/kubetest"
	"github.com/loopvol/loopvol/pkg/csiclient"
)

const nodeUID = "node-uid-1"

// --- object builders ---

func nodeObj() *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: testNode, UID: nodeUID}}
}

func csiNodeObj(rv string, drivers ...storagev1.CSINodeDriver) *storagev1.CSINode {
	return &storagev1.CSINode{
		ObjectMeta: metav1.ObjectMeta{Name: testNode, ResourceVersion: rv},
		Spec:       storagev1.CSINodeSpec{Drivers: drivers},
	}
}

// ours is the entry of the fake driver with limit count (0: none).
func ours(count int32) storagev1.CSINodeDriver {
	e := storagev1.CSINodeDriver{Name: driver, NodeID: testNodeID, TopologyKeys: []string{zoneKey}}
	if count > 0 {
		e.Allocatable = &storagev1.VolumeNodeResources{Count: ptr.To(count)}
	}
	return e
}

// otherDriver is another driver's entry, which must stay as it is.
var otherDriver = storagev1.CSINodeDriver{
	Name: "other.csi.io", NodeID: "other-id", TopologyKeys: []string{"other.io/rack"},
	Allocatable: &storagev1.VolumeNodeResources{Count: ptr.To[int32](99)},
}

func csiDriverObj(periodSeconds int64) *storagev1.CSIDriver {
	d := &storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: driver}}
	if periodSeconds > 0 {
		d.Spec.NodeAllocatableUpdatePeriodSeconds = ptr.To(periodSeconds)
	}
	return d
}

func vaObj(name, node, attacher string, code *int32, at time.Time) *storagev1.VolumeAttachment {
	va := &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       storagev1.VolumeAttachmentSpec{Attacher: attacher, NodeName: node},
	}
	if code != nil {
		va.Status.AttachError = &storagev1.VolumeError{Message: "attach failed", Time: metav1.NewTime(at), ErrorCode: code}
	}
	return va
}

// --- fixture ---

type fixture struct {
	client *fake.Clientset
	c      *csiNodeController
	drv    *fakeDriver
}

// newFixture makes a direct-mode controller over a fake clientset holding
// objs (also put in the controller's caches, as informers would have
// them); cached overrides what the CSINode cache holds.
func newFixture(t *testing.T, drv *fakeDriver, cached *storagev1.CSINode, objs ...runtime.Object) *fixture {
	t.Helper()
	client := fake.NewClientset(objs...)
	cfg := Config{
		DriverName: driver, KubeletRegistrationPath: endpoint, PluginRegistrationPath: t.TempDir(),
		NodeName: testNode, Mode: ModeDirect, Driver: drv, Client: client,
		VolumeAttachments:  kube.NewInformers(client, 0).VolumeAttachments(),
		RetryIntervalStart: time.Millisecond, RetryIntervalMax: 10 * time.Millisecond,
		Clock: testingclock.NewFakeClock(testNow),
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	c := newCSINodeController(cfg)
	t.Cleanup(c.queue.ShutDown)
	for _, o := range objs {
		switch o := o.(type) {
		case *storagev1.CSINode:
			if cached == nil {
				_ = c.csiNodeInformer.GetIndexer().Add(o)
			}
		case *storagev1.CSIDriver:
			_ = c.driverInformer.GetIndexer().Add(o)
		}
	}
	if cached != nil {
		_ = c.csiNodeInformer.GetIndexer().Add(cached)
	}
	return &fixture{client: client, c: c, drv: drv}
}

// apiAction is one request to the API server, its patch normalized.
type apiAction = kubetest.Action

// recorder lists every request but the informers' lists and watches.
var recorder = kubetest.Recorder{Skip: []string{"list"}}

func (f *fixture) actions() []apiAction { return recorder.Take(f.client) }

func get(resource, name string) apiAction {
	return apiAction{Verb: "get", Resource: resource, Name: name}
}

func patch(p string) apiAction {
	return apiAction{Verb: "patch", Resource: "csinodes", Name: testNode, PatchType: types.JSONPatchType, Patch: recorder.Norm(p)}
}

func entryJSON(e storagev1.CSINodeDriver) string { return string(kube.MustJSON(e)) }

func (f *fixture) csiNode(t *testing.T) *storagev1.CSINode {
	t.Helper()
	n, err := f.client.StorageV1().CSINodes().Get(context.Background(), testNode, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get CSINode: %v", err)
	}
	return n
}

func TestSync(t *testing.T) {
	owned := []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: testNode, UID: nodeUID}}
	tests := []struct {
		name        string
		drv         *fakeDriver
		objs        []runtime.Object
		cached      *storagev1.CSINode // the CSINode cache, when it differs from the API
		want        []apiAction
		wantDrivers []storagev1.CSINodeDriver // nil: no CSINode afterwards
		wantOwners  []metav1.OwnerReference
		wantErr     string
		wantFinal   bool
	}{
		{
			name: "no CSINode → created, owned by the Node, with the entry",
			drv:  newFakeDriver(3),
			objs: []runtime.Object{nodeObj()},
			want: []apiAction{
				get("csinodes", testNode), // the cache may lag behind an own create
				get("nodes", testNode),
				{Verb: "create", Resource: "csinodes", Name: testNode},
			},
			wantDrivers: []storagev1.CSINodeDriver{ours(3)},
			wantOwners:  owned,
		},
		{
			name:    "no CSINode and no Node → nothing created, retried",
			drv:     newFakeDriver(3),
			want:    []apiAction{get("csinodes", testNode), get("nodes", testNode)},
			wantErr: "node node-1 does not exist",
		},
		{
			name:        "another driver's CSINode → the entry appended, the other untouched",
			drv:         newFakeDriver(3),
			objs:        []runtime.Object{nodeObj(), csiNodeObj("5", otherDriver)},
			want:        []apiAction{patch(`[{"op":"test","path":"/metadata/resourceVersion","value":"5"},{"op":"add","path":"/spec/drivers/-","value":` + entryJSON(ours(3)) + `}]`)},
			wantDrivers: []storagev1.CSINodeDriver{otherDriver, ours(3)},
		},
		{
			name:        "a new limit → only the entry's allocatable set",
			drv:         newFakeDriver(5),
			objs:        []runtime.Object{nodeObj(), csiNodeObj("5", otherDriver, ours(3))},
			want:        []apiAction{patch(`[{"op":"test","path":"/spec/drivers/1/name","value":"loopvol.csi.io"},{"op":"add","path":"/spec/drivers/1/allocatable","value":{"count":5}}]`)},
			wantDrivers: []storagev1.CSINodeDriver{otherDriver, ours(5)},
		},
		{
			name:        "limit 0 → allocatable removed",
			drv:         newFakeDriver(0),
			objs:        []runtime.Object{nodeObj(), csiNodeObj("5", ours(3))},
			want:        []apiAction{patch(`[{"op":"test","path":"/spec/drivers/0/name","value":"loopvol.csi.io"},{"op":"remove","path":"/spec/drivers/0/allocatable"}]`)},
			wantDrivers: []storagev1.CSINodeDriver{ours(0)},
		},
		{
			name: "a new node ID → the entry removed, then added anew",
			drv:  newFakeDriver(3),
			objs: []runtime.Object{nodeObj(), func() *storagev1.CSINode {
				old := ours(3)
				old.NodeID = "old-id"
				return csiNodeObj("5", old, otherDriver)
			}()},
			want: []apiAction{
				patch(`[{"op":"test","path":"/spec/drivers/0/name","value":"loopvol.csi.io"},{"op":"remove","path":"/spec/drivers/0"}]`),
				patch(`[{"op":"test","path":"/metadata/resourceVersion","value":"5"},{"op":"add","path":"/spec/drivers/-","value":` + entryJSON(ours(3)) + `}]`),
			},
			wantDrivers: []storagev1.CSINodeDriver{otherDriver, ours(3)},
		},
		{
			name:        "entry up to date → no write",
			drv:         newFakeDriver(3),
			objs:        []runtime.Object{nodeObj(), csiNodeObj("5", ours(3), otherDriver)},
			wantDrivers: []storagev1.CSINodeDriver{ours(3), otherDriver},
		},
		{
			name:   "stale cache: the resourceVersion test fails → read again, patch once more",
			drv:    newFakeDriver(3),
			objs:   []runtime.Object{nodeObj(), csiNodeObj("6", otherDriver, storagev1.CSINodeDriver{Name: "third.csi.io", NodeID: "t", TopologyKeys: []string{}})},
			cached: csiNodeObj("5", otherDriver),
			want: []apiAction{
				patch(`[{"op":"test","path":"/metadata/resourceVersion","value":"5"},{"op":"add","path":"/spec/drivers/-","value":` + entryJSON(ours(3)) + `}]`),
				get("csinodes", testNode),
				patch(`[{"op":"test","path":"/metadata/resourceVersion","value":"6"},{"op":"add","path":"/spec/drivers/-","value":` + entryJSON(ours(3)) + `}]`),
			},
			wantDrivers: []storagev1.CSINodeDriver{otherDriver, {Name: "third.csi.io", NodeID: "t", TopologyKeys: []string{}}, ours(3)},
		},
		{
			name: "driver unavailable → no API call, retried",
			drv: func() *fakeDriver {
				d := newFakeDriver(3)
				d.err = status.Error(codes.Unavailable, "restarting")
				return d
			}(),
			objs:        []runtime.Object{nodeObj(), csiNodeObj("5", ours(1))},
			wantDrivers: []storagev1.CSINodeDriver{ours(1)},
			wantErr:     "restarting",
		},
		{
			name: "driver refuses NodeGetInfo → a final error",
			drv: func() *fakeDriver {
				d := newFakeDriver(3)
				d.err = status.Error(codes.Unimplemented, "no node service")
				return d
			}(),
			objs:      []runtime.Object{nodeObj()},
			wantErr:   "no node service",
			wantFinal: true,
		},
		{
			name: "empty node ID → nothing written",
			drv: func() *fakeDriver {
				d := newFakeDriver(3)
				d.info = nodeInfo("", 3, nil)
				return d
			}(),
			objs:    []runtime.Object{nodeObj()},
			wantErr: "empty node ID",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			f := newFixture(t, tc.drv, tc.cached, tc.objs...)
			err := f.c.sync(ctx)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("sync: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("sync = %v, want an error containing %q", err, tc.wantErr)
			case csiclient.IsFinal(err) != tc.wantFinal:
				t.Errorf("final = %t, want %t (%v)", csiclient.IsFinal(err), tc.wantFinal, err)
			}
			kubetest.Diff(t, "API actions", tc.want, f.actions())
			n, gerr := f.client.StorageV1().CSINodes().Get(ctx, testNode, metav1.GetOptions{})
			if tc.wantDrivers == nil {
				if gerr == nil {
					t.Errorf("CSINode exists: %+v", n.Spec.Drivers)
				}
				return
			}
			if gerr != nil {
				t.Fatal(gerr)
			}
			if diff := cmp.Diff(tc.wantDrivers, n.Spec.Drivers); diff != "" {
				t.Errorf("CSINode drivers (-want +got):\n%s", diff)
			}
			if tc.wantOwners != nil {
				if diff := cmp.Diff(tc.wantOwners, n.OwnerReferences); diff != "" {
					t.Errorf("CSINode owners (-want +got):\n%s", diff)
				}
			}
		})
	}
}

func TestCSINodeEventsQueueOnlyDrift(t *testing.T) {
	f := newFixture(t, newFakeDriver(3), nil)
	f.c.want = ptr.To(ours(3))
	tests := []struct {
		name string
		obj  *storagev1.CSINode
		want int
	}{
		{name: "own write seen → nothing", obj: csiNodeObj("2", otherDriver, ours(3)), want: 0},
		{name: "entry edited by hand → sync", obj: csiNodeObj("3", storagev1.CSINodeDriver{Name: driver, NodeID: "wrong"}), want: 1},
		{name: "entry removed → sync", obj: csiNodeObj("4", otherDriver), want: 1},
		{name: "another node's CSINode → nothing", obj: func() *storagev1.CSINode {
			n := csiNodeObj("5")
			n.Name = "node-2"
			return n
		}(), want: 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f.c.csiNodeChanged(tc.obj)
			if got := f.c.queue.Q.Len(); got != tc.want {
				t.Errorf("queue length %d, want %d", got, tc.want)
			}
			for f.c.queue.Q.Len() > 0 {
				k, _ := f.c.queue.Q.Get()
				f.c.queue.Q.Done(k)
			}
		})
	}
	f.c.csiNodeDeleted(csiNodeObj("6"))
	if f.c.queue.Q.Len() != 1 {
		t.Error("a deleted CSINode queued no sync")
	}
}

func TestResourceExhaustedAttachQueuesASync(t *testing.T) {
	code := func(c codes.Code) *int32 { return ptr.To(int32(c)) }
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	exhausted := vaObj("va-1", testNode, driver, code(codes.ResourceExhausted), t0)
	tests := []struct {
		name   string
		period int64
		old    *storagev1.VolumeAttachment
		va     *storagev1.VolumeAttachment
		want   int
	}{
		{name: "RESOURCE_EXHAUSTED on this node → sync", period: 60, va: exhausted, want: 1},
		{name: "a new failure after an old one → sync", period: 60, old: exhausted, va: vaObj("va-1", testNode, driver, code(codes.ResourceExhausted), t0.Add(time.Second)), want: 1},
		{name: "the same failure seen again → nothing", period: 60, old: exhausted, va: exhausted.DeepCopy(), want: 0},
		{name: "first failure after a success → sync", period: 60, old: vaObj("va-1", testNode, driver, nil, t0), va: exhausted, want: 1},
		{name: "without a period → nothing, as kubelet", period: 0, va: exhausted, want: 0},
		{name: "another code → nothing", period: 60, va: vaObj("va-1", testNode, driver, code(codes.NotFound), t0), want: 0},
		{name: "another node → nothing", period: 60, va: vaObj("va-1", "node-2", driver, code(codes.ResourceExhausted), t0), want: 0},
		{name: "another driver → nothing", period: 60, va: vaObj("va-1", testNode, "other.csi.io", code(codes.ResourceExhausted), t0), want: 0},
		{name: "no error code → nothing", period: 60, va: func() *storagev1.VolumeAttachment {
			va := exhausted.DeepCopy()
			va.Status.AttachError.ErrorCode = nil
			return va
		}(), want: 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			var objs []runtime.Object
			if tc.period > 0 {
				objs = append(objs, csiDriverObj(tc.period))
			}
			f := newFixture(t, newFakeDriver(3), nil, objs...)
			f.c.driverChanged(ctx)
			var old any
			if tc.old != nil {
				old = tc.old
			}
			f.c.vaChanged(ctx, old, tc.va)
			if got := f.c.queue.Q.Len(); got != tc.want {
				t.Errorf("queue length %d, want %d", got, tc.want)
			}
		})
	}
}

// TestDirectModeRun runs the whole registrar in direct mode over a fake
// API: the entry is created, hand edits are repaired, the count follows the
// driver on the CSIDriver's period and at once after a RESOURCE_EXHAUSTED
// attach, and another driver's entry stays exactly as it was.
func TestDirectModeRun(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	drv := newFakeDriver(3)
	client := fake.NewClientset(nodeObj(), csiNodeObj("1", otherDriver))
	kubetest.Serve(client, kubetest.Options{})
	informers := kube.NewInformers(client, 0)
	clk := testingclock.NewFakeClock(testNow)
	cfg := Config{
		DriverName: driver, KubeletRegistrationPath: endpoint, PluginRegistrationPath: t.TempDir(),
		NodeName: testNode, Mode: ModeDirect, Driver: drv, Client: client,
		VolumeAttachments:  informers.VolumeAttachments(),
		RetryIntervalStart: time.Millisecond, RetryIntervalMax: 10 * time.Millisecond,
		SocketCheckInterval: 10 * time.Millisecond,
		Clock:               clk,
	}
	r, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	informers.Start(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	f := &fixture{client: client, c: r.node, drv: drv}
	entry := func() *storagev1.CSINodeDriver {
		n := f.csiNode(t)
		if i := findEntry(n, driver); i >= 0 {
			return &n.Spec.Drivers[i]
		}
		return nil
	}
	hasCount := func(want int32) func() bool {
		return func() bool {
			e := entry()
			return e != nil && sameEntry(*e, ours(want))
		}
	}
	checkOther := func(when string) {
		t.Helper()
		n := f.csiNode(t)
		if i := findEntry(n, otherDriver.Name); i < 0 || !cmp.Equal(n.Spec.Drivers[i], otherDriver) {
			t.Errorf("%s: the other driver's entry changed: %+v", when, n.Spec.Drivers)
		}
	}

	eventually(t, "the entry with count 3", hasCount(3))
	eventually(t, "healthy once the entry is in place (no kubelet to confirm)", func() bool { return r.Healthy() == nil })
	checkOther("after the entry was added")

	// A hand edit is repaired.
	if _, err := client.StorageV1().CSINodes().Patch(ctx, testNode, types.JSONPatchType,
		[]byte(`[{"op":"replace","path":"/spec/drivers/1/nodeID","value":"wrong"}]`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the hand edit repaired", hasCount(3))
	checkOther("after the repair")

	// No period: a new limit is not picked up; a RESOURCE_EXHAUSTED attach
	// does not change that (kubelet's rule).
	drv.setMaxVolumes(4)
	exhausted := vaObj("va-1", testNode, driver, ptr.To(int32(codes.ResourceExhausted)), testNow)
	if _, err := client.StorageV1().VolumeAttachments().Create(ctx, exhausted, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// A 1 s period picks the new limit up: the clock is stepped a second
	// at a time until it has.
	if _, err := client.StorageV1().CSIDrivers().Create(ctx, csiDriverObj(1), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the second's period in effect", func() bool { return r.node.currentPeriod() == time.Second })
	drv.setMaxVolumes(5)
	eventually(t, "count 5 on the period", func() bool {
		clk.Step(time.Second)
		return hasCount(5)()
	})

	// An hour's period: only the failed attach makes it read again.
	if _, err := client.StorageV1().CSIDrivers().Update(ctx, csiDriverObj(3600), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the hour's period in effect", func() bool { return r.node.currentPeriod() == time.Hour })
	drv.setMaxVolumes(7)
	calls := drv.callCount()
	failedAgain := vaObj("va-1", testNode, driver, ptr.To(int32(codes.ResourceExhausted)), testNow.Add(time.Second))
	if _, err := client.StorageV1().VolumeAttachments().UpdateStatus(ctx, failedAgain, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "count 7 right after the RESOURCE_EXHAUSTED attach", hasCount(7))
	if got := drv.callCount() - calls; got < 1 {
		t.Errorf("NodeGetInfo calls after the failed attach: %d", got)
	}
	checkOther("at the end")
}
