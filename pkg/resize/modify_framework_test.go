package resize

import (
	"context"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2/ktesting"
	testingclock "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/loopvol/loopvol/internal/kube"
	"github.com/loopvol/loopvol/pkg/csiclient"
)

// modifyCaps is a driver with MODIFY_VOLUME.
var modifyCaps = csiclient.Capabilities{ControllerService: true, ExpandVolume: true, ModifyVolume: true}

// --- object builders (claim and volume are the resize tests') ---

// class is a VolumeAttributesClass of the driver with params.
func class(name string, params map[string]string, opts ...func(*storagev1.VolumeAttributesClass)) *storagev1.VolumeAttributesClass {
	vac := &storagev1.VolumeAttributesClass{
		ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: "1"},
		DriverName: driver,
		Parameters: params,
	}
	for _, o := range opts {
		o(vac)
	}
	return vac
}

// wantsClass sets the claim's spec.volumeAttributesClassName ("": none).
func wantsClass(name string) func(*corev1.PersistentVolumeClaim) {
	return func(pvc *corev1.PersistentVolumeClaim) {
		if name == "" {
			pvc.Spec.VolumeAttributesClassName = nil
			return
		}
		pvc.Spec.VolumeAttributesClassName = ptr.To(name)
	}
}

// hasClass sets the claim's status.currentVolumeAttributesClassName.
func hasClass(name string) func(*corev1.PersistentVolumeClaim) {
	return func(pvc *corev1.PersistentVolumeClaim) { pvc.Status.CurrentVolumeAttributesClassName = ptr.To(name) }
}

// modifying sets the claim's modifyVolumeStatus.
func modifying(target string, s corev1.PersistentVolumeClaimModifyVolumeStatus) func(*corev1.PersistentVolumeClaim) {
	return func(pvc *corev1.PersistentVolumeClaim) {
		pvc.Status.ModifyVolumeStatus = &corev1.ModifyVolumeStatus{TargetVolumeAttributesClassName: target, Status: s}
	}
}

// volumeClass sets the volume's spec.volumeAttributesClassName.
func volumeClass(name string) func(*corev1.PersistentVolume) {
	return func(pv *corev1.PersistentVolume) { pv.Spec.VolumeAttributesClassName = ptr.To(name) }
}

// --- fake CSI driver ---

// modifyCall is one ControllerModifyVolume the controller made.
type modifyCall struct {
	VolumeID   string
	Parameters map[string]string
	Secrets    map[string]string
}

type fakeModifyCSI struct {
	mu    sync.Mutex
	caps  csiclient.Capabilities
	calls []modifyCall
	// answers are the errors of the next calls, in order (nil: success);
	// once used up every call succeeds.
	answers []error
}

func (f *fakeModifyCSI) WaitReady(ctx context.Context) error { return ctx.Err() }

func (f *fakeModifyCSI) Capabilities() csiclient.Capabilities {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.caps
}

func (f *fakeModifyCSI) ControllerModifyVolume(_ context.Context, req *csi.ControllerModifyVolumeRequest) (*csi.ControllerModifyVolumeResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, modifyCall{VolumeID: req.VolumeId, Parameters: maps.Clone(req.MutableParameters), Secrets: req.Secrets})
	if len(f.answers) > 0 {
		err := f.answers[0]
		f.answers = f.answers[1:]
		if err != nil {
			return nil, err
		}
	}
	return &csi.ControllerModifyVolumeResponse{}, nil
}

func (f *fakeModifyCSI) answer(errs ...error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.answers = append(f.answers, errs...)
}

func (f *fakeModifyCSI) takeCalls() []modifyCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := f.calls
	f.calls = nil
	return out
}

// --- fixture ---

// modFixture is a modify controller over a fake clientset and a fake
// driver whose caches are filled by hand, so that each test runs the worker
// directly and deterministically.
type modFixture struct {
	t        *testing.T
	ctx      context.Context
	client   *fake.Clientset
	csi      *fakeModifyCSI
	recorder *record.FakeRecorder
	registry *prometheus.Registry
	clock    *testingclock.FakePassiveClock
	c        *ModifyController
	errs     []error
	writes   []runtime.Object
	eager    bool
}

func newModFixture(t *testing.T, objs []runtime.Object, opts ...func(*ModifyConfig)) *modFixture {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	client := fake.NewClientset(objs...)
	f := &modFixture{
		t:        t,
		ctx:      ctx,
		client:   client,
		csi:      &fakeModifyCSI{caps: modifyCaps},
		recorder: record.NewFakeRecorder(100),
		registry: prometheus.NewRegistry(),
		clock:    testingclock.NewFakePassiveClock(testNow),
	}
	withResourceVersions(client, func(o runtime.Object) {
		f.writes = append(f.writes, o.DeepCopyObject())
		if f.eager {
			f.observe()
		}
	})
	cfg := ModifyConfig{
		DriverName:         driver,
		Client:             client,
		CSI:                f.csi,
		Informers:          kube.NewInformers(client, 0),
		Recorder:           f.recorder,
		Workers:            1,
		RetryIntervalStart: time.Second,
		RetryIntervalMax:   5 * time.Minute,
		Registerer:         f.registry,
	}
	for _, o := range opts {
		o(&cfg)
	}
	c, err := NewModifyController(cfg)
	if err != nil {
		t.Fatalf("NewModifyController: %v", err)
	}
	c.clock = f.clock
	t.Cleanup(c.queue.ShutDown)
	f.c = c
	for _, o := range objs {
		f.cache(o)
	}
	client.ClearActions()
	return f
}

// cache puts obj into the informer cache without calling the handlers.
func (f *modFixture) cache(obj runtime.Object) {
	f.t.Helper()
	if f.caches().cache(f.t, obj) {
		return
	}
	if vac, ok := obj.(*storagev1.VolumeAttributesClass); ok {
		if err := f.c.vacInformer.GetIndexer().Add(vac.DeepCopy()); err != nil {
			f.t.Fatalf("cache %T: %v", obj, err)
		}
	}
}

func (f *modFixture) caches() caches {
	return caches{f.c.pvcInformer.GetIndexer(), f.c.pvInformer.GetIndexer(), f.c.claimAdded, f.c.claimUpdated}
}

func (f *modFixture) queueAll() { f.caches().queueAll() }

// observe plays the watch, as the resize fixture's does: first each
// object the controller's patches produced, in order; then every claim,
// volume and class that differs between the fake API server and the cache.
func (f *modFixture) observe() {
	f.t.Helper()
	writes := f.writes
	f.writes = nil
	f.caches().replay(f.t, f.client, writes)
	gvr := storagev1.SchemeGroupVersion.WithResource("volumeattributesclasses")
	vacs, err := f.client.Tracker().List(gvr, storagev1.SchemeGroupVersion.WithKind("VolumeAttributesClass"), "")
	if err != nil {
		f.t.Fatal(err)
	}
	for _, o := range vacs.(*storagev1.VolumeAttributesClassList).Items {
		vac := o.DeepCopy()
		if _, exists, _ := f.c.vacInformer.GetIndexer().Get(vac); !exists {
			_ = f.c.vacInformer.GetIndexer().Add(vac)
			f.c.classAdded(vac)
		}
	}
}

// drain runs the worker until the queue is empty (claims waiting out a
// backoff are not run), observing the API server after each sync.
func (f *modFixture) drain() {
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

// resync queues every claim, as a resync period does, and drains.
func (f *modFixture) resync() {
	f.queueAll()
	f.drain()
}

func (f *modFixture) pvc(name string) *corev1.PersistentVolumeClaim {
	f.t.Helper()
	o, err := f.client.Tracker().Get(corev1.SchemeGroupVersion.WithResource("persistentvolumeclaims"), ns, name)
	if err != nil {
		f.t.Fatalf("get PersistentVolumeClaim %s: %v", name, err)
	}
	return o.(*corev1.PersistentVolumeClaim)
}

func (f *modFixture) pv(name string) *corev1.PersistentVolume {
	f.t.Helper()
	o, err := f.client.Tracker().Get(corev1.SchemeGroupVersion.WithResource("persistentvolumes"), "", name)
	if err != nil {
		f.t.Fatalf("get PersistentVolume %s: %v", name, err)
	}
	return o.(*corev1.PersistentVolume)
}

// setClaim changes a claim in the fake API server, as a user would.
func (f *modFixture) setClaim(name string, change func(*corev1.PersistentVolumeClaim)) {
	f.t.Helper()
	pvc := f.pvc(name).DeepCopy()
	change(pvc)
	pvc.ResourceVersion += "0" // a new version, as the API server's
	if err := f.client.Tracker().Update(corev1.SchemeGroupVersion.WithResource("persistentvolumeclaims"), pvc, ns); err != nil {
		f.t.Fatal(err)
	}
	f.observe()
}

func (f *modFixture) events() []string {
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

func (f *modFixture) actions() []apiAction {
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

// modifyStatusIs describes a claim's modification state in one line.
func modifyStatusOf(pvc *corev1.PersistentVolumeClaim) string {
	out := "current=" + ptr.Deref(pvc.Status.CurrentVolumeAttributesClassName, "<nil>")
	if s := pvc.Status.ModifyVolumeStatus; s != nil {
		out += " target=" + s.TargetVolumeAttributesClassName + " status=" + string(s.Status)
	}
	for _, c := range pvc.Status.Conditions {
		out += " " + string(c.Type)
		if c.Reason != "" {
			out += "(" + c.Reason + ")"
		}
		out += ":" + c.Message
	}
	return out
}
