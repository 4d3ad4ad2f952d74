package resize

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2/ktesting"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/loopvol/loopvol/internal/kube"
	"github.com/loopvol/loopvol/pkg/csiclient"
)

// The names are written out as Kubernetes and the upstream
// external-resizer spell them, not taken from this package, so the tests
// prove the two interoperate.
const (
	driver       = "loopvol.csi.io"
	ns           = "apps"
	preResizeAnn = "volume.alpha.kubernetes.io/pre-resize-capacity"
	notReqAnn    = "volume.kubernetes.io/node-expansion-not-required"
	resizerAnn   = "volume.kubernetes.io/storage-resizer"
)

var (
	testNow  = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	earlier  = metav1.NewTime(testNow.Add(-time.Hour))
	timeJSON = testNow.Format(time.RFC3339)
	// expandCaps is a driver that expands volumes in its controller.
	expandCaps = csiclient.Capabilities{ControllerService: true, ExpandVolume: true, OnlineExpansion: true}
	// nodeOnlyCaps is a driver whose controller does not expand volumes.
	nodeOnlyCaps = csiclient.Capabilities{ControllerService: true, OnlineExpansion: true}
)

// --- object builders ---

// claim is a claim of ns bound to volume pv-<name>, with request and
// capacity.
func claim(name, request, capacity string, opts ...func(*corev1.PersistentVolumeClaim)) *corev1.PersistentVolumeClaim {
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + name), ResourceVersion: "1"},
		Spec: corev1.PersistentVolumeClaimSpec{
			VolumeName: "pv-" + name,
			Resources:  corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(request)}},
		},
		Status: corev1.PersistentVolumeClaimStatus{
			Phase:    corev1.ClaimBound,
			Capacity: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(capacity)},
		},
	}
	for _, o := range opts {
		o(pvc)
	}
	return pvc
}

func allocated(size string, s corev1.ClaimResourceStatus) func(*corev1.PersistentVolumeClaim) {
	return func(pvc *corev1.PersistentVolumeClaim) {
		pvc.Status.AllocatedResources = corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)}
		if s != "" {
			pvc.Status.AllocatedResourceStatuses = map[corev1.ResourceName]corev1.ClaimResourceStatus{corev1.ResourceStorage: s}
		}
	}
}

func condition(typ corev1.PersistentVolumeClaimConditionType, msg string) func(*corev1.PersistentVolumeClaim) {
	return func(pvc *corev1.PersistentVolumeClaim) {
		pvc.Status.Conditions = append(pvc.Status.Conditions, corev1.PersistentVolumeClaimCondition{
			Type: typ, Status: corev1.ConditionTrue, LastTransitionTime: earlier, Message: msg,
		})
	}
}

func pending(pvc *corev1.PersistentVolumeClaim) { pvc.Status.Phase = corev1.ClaimPending }

// volume is the PersistentVolume of claim name, of driver drv, with size.
func volume(name, size string, opts ...func(*corev1.PersistentVolume)) *corev1.PersistentVolume {
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "pv-" + name, ResourceVersion: "1"},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:    corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)},
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			ClaimRef:    &corev1.ObjectReference{Namespace: ns, Name: name, UID: types.UID("uid-" + name)},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: driver, VolumeHandle: "vol-" + name, FSType: "ext4",
			}},
		},
	}
	for _, o := range opts {
		o(pv)
	}
	return pv
}

func ofDriver(d string) func(*corev1.PersistentVolume) {
	return func(pv *corev1.PersistentVolume) { pv.Spec.CSI.Driver = d }
}

func withAnnotation(k, v string) func(*corev1.PersistentVolume) {
	return func(pv *corev1.PersistentVolume) { pv.Annotations = map[string]string{k: v} }
}

func expandSecret(ns, name string) func(*corev1.PersistentVolume) {
	return func(pv *corev1.PersistentVolume) {
		pv.Spec.CSI.ControllerExpandSecretRef = &corev1.SecretReference{Namespace: ns, Name: name}
	}
}

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
	mu    sync.Mutex
	caps  csiclient.Capabilities
	calls []expandCall
	// answer returns the response to a call; nil: the required size and
	// node expansion required.
	answer       func(req *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error)
	nodeExpand   bool
	nodeCapCalls int
}

func (f *fakeCSI) WaitReady(ctx context.Context) error { return ctx.Err() }

func (f *fakeCSI) Capabilities() csiclient.Capabilities {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.caps
}

func (f *fakeCSI) ControllerExpandVolume(_ context.Context, req *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := req.GetVolumeCapability()
	capStr := "block/" + c.GetAccessMode().GetMode().String()
	if m := c.GetMount(); m != nil {
		capStr = fmt.Sprintf("mount/%s/%s%v", m.GetFsType(), c.GetAccessMode().GetMode(), m.GetMountFlags())
	}
	f.calls = append(f.calls, expandCall{VolumeID: req.VolumeId, RequiredBytes: req.GetCapacityRange().GetRequiredBytes(), Capability: capStr, Secrets: req.Secrets})
	if f.answer != nil {
		return f.answer(req)
	}
	return &csi.ControllerExpandVolumeResponse{CapacityBytes: req.GetCapacityRange().GetRequiredBytes(), NodeExpansionRequired: true}, nil
}

func (f *fakeCSI) NodeGetCapabilities(context.Context) (*csi.NodeGetCapabilitiesResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
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

func (f *fakeCSI) takeCalls() []expandCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := f.calls
	f.calls = nil
	return out
}

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
		csi:      &fakeCSI{caps: caps},
		recorder: record.NewFakeRecorder(100),
		registry: prometheus.NewRegistry(),
	}
	withResourceVersions(client, func(o runtime.Object) {
		f.writes = append(f.writes, o.DeepCopyObject())
		if f.eager {
			// The watch delivers the write before the patch call returns.
			f.observe()
		}
	})
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
	o, err := f.client.Tracker().Get(corev1.SchemeGroupVersion.WithResource("persistentvolumeclaims"), ns, name)
	if err != nil {
		f.t.Fatalf("get PersistentVolumeClaim %s: %v", name, err)
	}
	return o.(*corev1.PersistentVolumeClaim)
}

func (f *fixture) pv(name string) *corev1.PersistentVolume {
	f.t.Helper()
	o, err := f.client.Tracker().Get(corev1.SchemeGroupVersion.WithResource("persistentvolumes"), "", name)
	if err != nil {
		f.t.Fatalf("get PersistentVolume %s: %v", name, err)
	}
	return o.(*corev1.PersistentVolume)
}

// events returns the Events recorded so far.
func (f *fixture) events() []string {
	var out []string
	for {
		select {
		case e := <-f.recorder.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

// apiAction is one request to the API server, with its patch normalized
// and resourceVersions replaced by "RV" (their values are the fake's).
type apiAction struct {
	Verb        string
	Resource    string
	Subresource string
	Namespace   string
	Name        string
	PatchType   types.PatchType
	Patch       string
}

func (f *fixture) actions() []apiAction {
	var out []apiAction
	for _, a := range f.client.Actions() {
		if a.GetVerb() == "watch" {
			continue
		}
		act := apiAction{Verb: a.GetVerb(), Resource: a.GetResource().Resource, Subresource: a.GetSubresource(), Namespace: a.GetNamespace()}
		switch a := a.(type) {
		case k8stesting.PatchAction:
			act.Name, act.PatchType, act.Patch = a.GetName(), a.GetPatchType(), normJSON(string(a.GetPatch()))
		case k8stesting.GetAction:
			act.Name = a.GetName()
		}
		out = append(out, act)
	}
	f.client.ClearActions()
	return out
}

// normJSON re-encodes a JSON document with sorted keys and any
// metadata.resourceVersion as "RV".
func normJSON(s string) string {
	var v any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		return "invalid JSON: " + s
	}
	if m, ok := v.(map[string]any); ok {
		if md, ok := m["metadata"].(map[string]any); ok {
			if _, ok := md["resourceVersion"]; ok {
				md["resourceVersion"] = "RV"
			}
		}
	}
	b, _ := json.Marshal(v)
	return string(b)
}

func claimStatusPatch(name, patch string) apiAction {
	return apiAction{Verb: "patch", Resource: "persistentvolumeclaims", Subresource: "status", Namespace: ns, Name: name, PatchType: types.MergePatchType, Patch: normJSON(patch)}
}

func volumePatchAction(name, patch string) apiAction {
	return apiAction{Verb: "patch", Resource: "persistentvolumes", Name: name, PatchType: types.MergePatchType, Patch: normJSON(patch)}
}

func get(resource, namespace, name string) apiAction {
	return apiAction{Verb: "get", Resource: resource, Namespace: namespace, Name: name}
}

func diff[T any](t *testing.T, what string, want, got T) {
	t.Helper()
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("%s (-want +got):\n%s", what, d)
	}
}

// withResourceVersions makes the fake clientset hand out a new
// resourceVersion on every merge patch and honour a resourceVersion
// precondition in it, as a real API server does (the fake keeps them as
// given). Each patched object is passed to written.
func withResourceVersions(client *fake.Clientset, written func(runtime.Object)) {
	var mu sync.Mutex
	next := 100
	react := k8stesting.ObjectReaction(client.Tracker())
	client.PrependReactor("patch", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		pa := a.(k8stesting.PatchActionImpl)
		if pa.PatchType != types.MergePatchType {
			return false, nil, nil
		}
		var p map[string]any
		if err := json.Unmarshal(pa.Patch, &p); err != nil {
			return true, nil, err
		}
		md, _ := p["metadata"].(map[string]any)
		if md == nil {
			md = map[string]any{}
			p["metadata"] = md
		}
		if want, ok := md["resourceVersion"].(string); ok {
			cur, err := client.Tracker().Get(pa.Resource, pa.Namespace, pa.Name)
			if err != nil {
				return true, nil, err
			}
			if cur.(metav1.Object).GetResourceVersion() != want {
				return true, nil, apierrors.NewConflict(pa.Resource.GroupResource(), pa.Name, errors.New("the object has been modified"))
			}
		}
		next++
		md["resourceVersion"] = strconv.Itoa(next)
		pa.Patch, _ = json.Marshal(p)
		handled, out, err := react(pa)
		if err == nil && out != nil {
			written(out)
		}
		return handled, out, err
	})
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
