package resize

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2/ktesting"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/loopvol/loopvol/internal/kube"
	"github.com/loopvol/loopvol/internal/kube/claimtest"
	"github.com/loopvol/loopvol/internal/kube/kubetest"
	"github.com/loopvol/loopvol/pkg/csiclient"
)

// The names are written out as Kubernetes and the upstream
// external-resizer spell them, not taken from this package, so the tests
// prove the two interoperate.
const (
	driver       = claimtest.Driver
	ns           = claimtest.Namespace
	preResizeAnn = "volume.alpha.kubernetes.io/pre-resize-capacity"
	notReqAnn    = "volume.kubernetes.io/node-expansion-not-required"
	resizerAnn   = "volume.kubernetes.io/storage-resizer"
)

var (
	testNow  = claimtest.Now
	earlier  = claimtest.Earlier
	timeJSON = claimtest.TimeJSON
	// expandCaps is a driver that expands volumes in its controller.
	expandCaps = csiclient.Capabilities{ControllerService: true, ExpandVolume: true, OnlineExpansion: true}
	// nodeOnlyCaps is a driver whose controller does not expand volumes.
	nodeOnlyCaps = csiclient.Capabilities{ControllerService: true, OnlineExpansion: true}
)

// --- object builders: claimtest's ---

var (
	claim          = claimtest.Claim
	allocated      = claimtest.Allocated
	condition      = claimtest.Condition
	pending        = claimtest.Pending
	volume         = claimtest.Volume
	ofDriver       = claimtest.OfDriver
	withAnnotation = claimtest.WithAnnotation
	expandSecret   = claimtest.ExpandSecret
)

// --- fake CSI driver ---

// expandCall is one ControllerExpandVolume the controller made, with the
// capability in short form.
type expandCall struct {
	VolumeID      string
	RequiredBytes int64
	Capability    string
	Secrets       map[string]string
}

type fakeCSI struct {
	kubetest.FakeDriver[expandCall]
	// answer returns the response to a call; nil: the required size and
	// node expansion required.
	answer       func(req *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error)
	nodeExpand   bool
	nodeCapCalls int
}

func (f *fakeCSI) ControllerExpandVolume(_ context.Context, req *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
	f.Lock()
	defer f.Unlock()
	c := req.GetVolumeCapability()
	capStr := "block/" + c.GetAccessMode().GetMode().String()
	if m := c.GetMount(); m != nil {
		capStr = fmt.Sprintf("mount/%s/%s%v", m.GetFsType(), c.GetAccessMode().GetMode(), m.GetMountFlags())
	}
	f.Calls = append(f.Calls, expandCall{VolumeID: req.VolumeId, RequiredBytes: req.GetCapacityRange().GetRequiredBytes(), Capability: capStr, Secrets: req.Secrets})
	if f.answer != nil {
		return f.answer(req)
	}
	return &csi.ControllerExpandVolumeResponse{CapacityBytes: req.GetCapacityRange().GetRequiredBytes(), NodeExpansionRequired: true}, nil
}

func (f *fakeCSI) NodeGetCapabilities(context.Context) (*csi.NodeGetCapabilitiesResponse, error) {
	f.Lock()
	defer f.Unlock()
	f.nodeCapCalls++
	rsp := &csi.NodeGetCapabilitiesResponse{Capabilities: []*csi.NodeServiceCapability{{
		Type: &csi.NodeServiceCapability_Rpc{Rpc: &csi.NodeServiceCapability_RPC{Type: csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME}},
	}}}
	if f.nodeExpand {
		rsp.Capabilities = append(rsp.Capabilities, &csi.NodeServiceCapability{
			Type: &csi.NodeServiceCapability_Rpc{Rpc: &csi.NodeServiceCapability_RPC{Type: csi.NodeServiceCapability_RPC_EXPAND_VOLUME}},
		})
	}
	return rsp, nil
}

func (f *fakeCSI) takeCalls() []expandCall { return f.TakeCalls() }

// --- fixture ---

// fixture is a controller over a fake clientset and a fake driver whose
// caches are filled by hand, so that each test runs the worker directly and
// deterministically.
type fixture struct {
	t        *testing.T
	ctx      context.Context
	client   *fake.Clientset
	csi      *fakeCSI
	recorder *record.FakeRecorder
	registry *prometheus.Registry
	c        *Controller
	errs     []error // what each sync returned
	// writes are the objects the controller's patches produced, in order,
	// not yet delivered to the cache.
	writes []runtime.Object
	// eager: each write is delivered to the cache and the handlers while
	// the patch call is still running.
	eager bool
}

type fixtureOption func(*Config)

func newFixture(t *testing.T, caps csiclient.Capabilities, objs []runtime.Object, opts ...fixtureOption) *fixture {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	client := fake.NewClientset(objs...)
	f := &fixture{
		t:        t,
		ctx:      ctx,
		client:   client,
		csi:      &fakeCSI{FakeDriver: kubetest.FakeDriver[expandCall]{Caps: caps}},
		recorder: record.NewFakeRecorder(100),
		registry: prometheus.NewRegistry(),
	}
	kubetest.Serve(client, kubetest.Options{Written: func(o runtime.Object) {
		f.writes = append(f.writes, o)
		if f.eager {
			// The watch delivers the write before the patch call returns.
			f.observe()
		}
	}})
	cfg := Config{
		ClaimConfig: kube.ClaimConfig{
			DriverName:         driver,
			Client:             client,
			Informers:          kube.NewInformers(client, 0),
			Recorder:           f.recorder,
			Workers:            1,
			RetryIntervalStart: time.Second,
			RetryIntervalMax:   5 * time.Minute,
			Registerer:         f.registry,
		},
		CSI:                       f.csi,
		HandleVolumeInUseError:    true,
		AnnotatePreResizeCapacity: true,
	}
	for _, o := range opts {
		o(&cfg)
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	c.clock = testingclock.NewFakePassiveClock(testNow)
	t.Cleanup(c.queue.ShutDown)
	f.c = c
	for _, o := range objs {
		f.cache(o)
	}
	client.ClearActions()
	return f
}

// cache puts obj into the informer cache, as a watch event would, without
// calling the handlers.
func (f *fixture) cache(obj runtime.Object) {
	f.t.Helper()
	f.caches().cache(f.t, obj)
}

// caches are what a fixture's watch replay drives: a controller's claim
// and volume caches and its claim handlers. The resize and the modify
// fixtures share them.
type caches struct {
	pvcs, pvs    cache.Indexer
	claimAdded   func(obj any)
	claimUpdated func(oldObj, newObj any)
}

func (f *fixture) caches() caches {
	return caches{f.c.pvcInformer.GetIndexer(), f.c.pvInformer.GetIndexer(), f.c.claimAdded, f.c.claimUpdated}
}

// cache puts a claim or a volume into its cache without calling the
// handlers, and reports whether obj was one.
func (w caches) cache(t *testing.T, obj runtime.Object) bool {
	t.Helper()
	var err error
	switch o := obj.(type) {
	case *corev1.PersistentVolumeClaim:
		err = w.pvcs.Add(o.DeepCopy())
	case *corev1.PersistentVolume:
		out, _ := kube.StripPV(o.DeepCopy(), kube.PVResize)
		err = w.pvs.Add(out)
	default:
		return false
	}
	if err != nil {
		t.Fatalf("cache %T: %v", obj, err)
	}
	return true
}

// replay plays the watch of claims and volumes: first each object of
// writes (the controller's patches, in order, one event each: a watch
// delivers every version); then every claim and volume that still differs
// between the fake API server and the cache (changed by the test). Claim
// handlers are called as an informer calls them.
func (w caches) replay(t *testing.T, client *fake.Clientset, writes []runtime.Object) {
	t.Helper()
	for _, o := range writes {
		switch o := o.(type) {
		case *corev1.PersistentVolumeClaim:
			old, exists, _ := w.pvcs.Get(o)
			_ = w.pvcs.Update(o)
			if exists {
				w.claimUpdated(old, o)
			}
		case *corev1.PersistentVolume:
			out, _ := kube.StripPV(o, kube.PVResize)
			_ = w.pvs.Update(out)
		}
	}
	pvcs, err := client.Tracker().List(corev1.SchemeGroupVersion.WithResource("persistentvolumeclaims"), corev1.SchemeGroupVersion.WithKind("PersistentVolumeClaim"), "")
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range pvcs.(*corev1.PersistentVolumeClaimList).Items {
		pvc := o.DeepCopy()
		old, exists, _ := w.pvcs.Get(pvc)
		switch {
		case !exists:
			_ = w.pvcs.Add(pvc)
			w.claimAdded(pvc)
		case !equality.Semantic.DeepEqual(old, pvc):
			_ = w.pvcs.Update(pvc)
			w.claimUpdated(old, pvc)
		}
	}
	pvs, err := client.Tracker().List(corev1.SchemeGroupVersion.WithResource("persistentvolumes"), corev1.SchemeGroupVersion.WithKind("PersistentVolume"), "")
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range pvs.(*corev1.PersistentVolumeList).Items {
		out, _ := kube.StripPV(o.DeepCopy(), kube.PVResize)
		_ = w.pvs.Update(out)
	}
}

// queueAll queues every cached claim, as the handlers do at start.
func (c caches) queueAll() {
	for _, o := range c.pvcs.List() {
		c.claimAdded(o)
	}
}

func (f *fixture) queueAll() { f.caches().queueAll() }

// observe plays the watch of the controller's writes and of the test's
// changes (caches.replay).
func (f *fixture) observe() {
	f.t.Helper()
	writes := f.writes
	f.writes = nil
	f.caches().replay(f.t, f.client, writes)
}

// drain runs the worker until the queue is empty (claims waiting out a
// backoff are not run), observing the API server after each sync.
func (f *fixture) drain() {
	f.t.Helper()
	for range 100 {
		if f.c.queue.Q.Len() == 0 {
			return
		}
		key, _ := f.c.queue.Q.Get()
		f.errs = append(f.errs, f.c.syncOne(f.ctx, key))
		f.c.queue.Q.Done(key)
		f.observe()
	}
	f.t.Fatal("the queue never drained")
}

func (f *fixture) pvc(name string) *corev1.PersistentVolumeClaim {
	f.t.Helper()
	return kubetest.Get[*corev1.PersistentVolumeClaim](f.t, f.client, corev1.SchemeGroupVersion.WithResource("persistentvolumeclaims"), ns, name)
}

func (f *fixture) pv(name string) *corev1.PersistentVolume {
	f.t.Helper()
	return kubetest.Get[*corev1.PersistentVolume](f.t, f.client, corev1.SchemeGroupVersion.WithResource("persistentvolumes"), "", name)
}

// events returns the Events recorded so far.
func (f *fixture) events() []string { return kubetest.Events(f.recorder) }

// apiAction is one request to the API server, with its patch normalized
// and resourceVersions replaced by "RV" (their values are the fake's).
type apiAction = kubetest.Action

func (f *fixture) actions() []apiAction {
	return kubetest.Recorder{MaskResourceVersions: true}.Take(f.client)
}

var (
	claimStatusPatch  = claimtest.ClaimStatusPatch
	volumePatchAction = claimtest.VolumePatch
	get               = claimtest.Get
)

func diff[T any](t *testing.T, what string, want, got T) {
	t.Helper()
	kubetest.Diff(t, what, want, got)
}

// conditionTypes lists the True conditions of a claim, sorted.
func conditionTypes(pvc *corev1.PersistentVolumeClaim) []string {
	var out []string
	for _, c := range pvc.Status.Conditions {
		if c.Status == corev1.ConditionTrue {
			out = append(out, string(c.Type))
		}
	}
	sort.Strings(out)
	return out
}
