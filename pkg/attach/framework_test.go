package attach

import (
	"context"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/loopvol/loopvol/internal/kube"
	"github.com/loopvol/loopvol/internal/kube/kubetest"
	"github.com/loopvol/loopvol/pkg/csiclient"
)

// The names are written out as the upstream external-attacher writes them,
// not derived from this package, so the tests prove the two interoperate.
const (
	driver     = "loopvol.csi.io"
	finalizer  = "external-attacher/loopvol-csi-io"
	nodeIDAnn  = "csi.alpha.kubernetes.io/node-id"
	otherFin   = "example.com/keep"
	testNode   = "node-1"
	testNodeID = "node-1-id"
)

var (
	testNow = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	// allCaps is a driver that offers everything the controller uses.
	allCaps = csiclient.Capabilities{
		ControllerService: true, PublishUnpublish: true, PublishReadOnly: true,
		ListVolumes: true, ListVolumesPublishedNodes: true,
	}
	// noPublishCaps is a driver without ControllerPublishVolume.
	noPublishCaps = csiclient.Capabilities{ControllerService: true}
)

// --- object builders ---

func vaObj(name, pvName string, opts ...func(*storagev1.VolumeAttachment)) *storagev1.VolumeAttachment {
	va := &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name)},
		Spec: storagev1.VolumeAttachmentSpec{
			Attacher: driver,
			NodeName: testNode,
			Source:   storagev1.VolumeAttachmentSource{PersistentVolumeName: &pvName},
		},
	}
	for _, o := range opts {
		o(va)
	}
	return va
}

func withFinalizers(f ...string) func(*storagev1.VolumeAttachment) {
	return func(va *storagev1.VolumeAttachment) { va.Finalizers = f }
}

func withNodeIDAnnotation(id string) func(*storagev1.VolumeAttachment) {
	return func(va *storagev1.VolumeAttachment) {
		if va.Annotations == nil {
			va.Annotations = map[string]string{}
		}
		va.Annotations[nodeIDAnn] = id
	}
}

func attached(md map[string]string) func(*storagev1.VolumeAttachment) {
	return func(va *storagev1.VolumeAttachment) {
		va.Status.Attached = true
		va.Status.AttachmentMetadata = md
	}
}

func withAttachError(code int32) func(*storagev1.VolumeAttachment) {
	return func(va *storagev1.VolumeAttachment) {
		va.Status.AttachError = &storagev1.VolumeError{Message: "earlier failure", ErrorCode: &code}
	}
}

func deleting(va *storagev1.VolumeAttachment) {
	t := metav1.NewTime(testNow.Add(-time.Minute))
	va.DeletionTimestamp = &t
}

func onNode(node string) func(*storagev1.VolumeAttachment) {
	return func(va *storagev1.VolumeAttachment) { va.Spec.NodeName = node }
}

func withRV(rv string) func(*storagev1.VolumeAttachment) {
	return func(va *storagev1.VolumeAttachment) { va.ResourceVersion = rv }
}

func inline(handle string) func(*storagev1.VolumeAttachment) {
	return func(va *storagev1.VolumeAttachment) {
		va.Spec.Source = storagev1.VolumeAttachmentSource{InlineVolumeSpec: &corev1.PersistentVolumeSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: driver, VolumeHandle: handle, FSType: "xfs",
				VolumeAttributes: map[string]string{"migrated": "yes"},
			}},
		}}
	}
}

func pvObj(name, handle string, opts ...func(*corev1.PersistentVolume)) *corev1.PersistentVolume {
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: driver, VolumeHandle: handle, FSType: "ext4",
				VolumeAttributes: map[string]string{"pool": "default"},
			}},
		},
	}
	for _, o := range opts {
		o(pv)
	}
	return pv
}

func pvFinalizers(f ...string) func(*corev1.PersistentVolume) {
	return func(pv *corev1.PersistentVolume) { pv.Finalizers = f }
}

func pvDeleting(pv *corev1.PersistentVolume) {
	t := metav1.NewTime(testNow.Add(-time.Minute))
	pv.DeletionTimestamp = &t
}

func pvBlock(pv *corev1.PersistentVolume) {
	m := corev1.PersistentVolumeBlock
	pv.Spec.VolumeMode = &m
}

func pvReadOnly(pv *corev1.PersistentVolume) { pv.Spec.CSI.ReadOnly = true }

func pvNoFSType(pv *corev1.PersistentVolume) { pv.Spec.CSI.FSType = "" }

func pvAccessModes(m ...corev1.PersistentVolumeAccessMode) func(*corev1.PersistentVolume) {
	return func(pv *corev1.PersistentVolume) { pv.Spec.AccessModes = m }
}

func pvSecret(ns, name string) func(*corev1.PersistentVolume) {
	return func(pv *corev1.PersistentVolume) {
		pv.Spec.CSI.ControllerPublishSecretRef = &corev1.SecretReference{Namespace: ns, Name: name}
	}
}

func csiNodeObj(node, id string) *storagev1.CSINode {
	return &storagev1.CSINode{
		ObjectMeta: metav1.ObjectMeta{Name: node},
		Spec: storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{
			{Name: "other.csi.io", NodeID: "other-id"},
			{Name: driver, NodeID: id},
		}},
	}
}

func secretObj(ns, name string, data map[string]string) *corev1.Secret {
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Data: map[string][]byte{}}
	for k, v := range data {
		s.Data[k] = []byte(v)
	}
	return s
}

// --- fake CSI driver ---

// csiCall is one call the controller made to the driver, with the
// capability in short form ("mount/ext4/SINGLE_NODE_WRITER").
type csiCall struct {
	Method     string
	VolumeID   string
	NodeID     string
	Readonly   bool
	Capability string
	Secrets    map[string]string
	Context    map[string]string
}

type fakeCSI struct {
	kubetest.FakeDriver[csiCall]
	publishCtx   map[string]string
	publishErr   error
	unpublishErr error
	published    map[string][]string
	onCall       func(method string) // called with each call, before it answers
	reconnected  []func()
}

var _ CSI = &fakeCSI{}

func capString(c *csi.VolumeCapability) string {
	if c == nil {
		return ""
	}
	mode := c.GetAccessMode().GetMode().String()
	if c.GetBlock() != nil {
		return "block/" + mode
	}
	m := c.GetMount()
	s := "mount/" + m.GetFsType() + "/" + mode
	if len(m.GetMountFlags()) > 0 {
		s += "/" + strings.Join(m.GetMountFlags(), ",")
	}
	return s
}

func (f *fakeCSI) ControllerPublish(_ context.Context, req *csi.ControllerPublishVolumeRequest) (map[string]string, error) {
	f.Lock()
	defer f.Unlock()
	f.Calls = append(f.Calls, csiCall{
		Method: "ControllerPublishVolume", VolumeID: req.VolumeId, NodeID: req.NodeId, Readonly: req.Readonly,
		Capability: capString(req.VolumeCapability), Secrets: req.Secrets, Context: req.VolumeContext,
	})
	if f.onCall != nil {
		f.onCall("ControllerPublishVolume")
	}
	if f.publishErr != nil {
		return nil, f.publishErr
	}
	return maps.Clone(f.publishCtx), nil
}

func (f *fakeCSI) ControllerUnpublish(_ context.Context, req *csi.ControllerUnpublishVolumeRequest) error {
	f.Lock()
	defer f.Unlock()
	f.Calls = append(f.Calls, csiCall{Method: "ControllerUnpublishVolume", VolumeID: req.VolumeId, NodeID: req.NodeId, Secrets: req.Secrets})
	if f.onCall != nil {
		f.onCall("ControllerUnpublishVolume")
	}
	return f.unpublishErr
}

func (f *fakeCSI) ListVolumes(context.Context) (map[string][]string, error) {
	f.Lock()
	defer f.Unlock()
	f.Calls = append(f.Calls, csiCall{Method: "ListVolumes"})
	return f.published, nil
}

func (f *fakeCSI) OnReconnected(fn func()) func() {
	f.Lock()
	defer f.Unlock()
	f.reconnected = append(f.reconnected, fn)
	return func() {}
}

// reconnect plays the driver coming back after it was away.
func (f *fakeCSI) reconnect() {
	f.Lock()
	fns := f.reconnected
	f.Unlock()
	for _, fn := range fns {
		fn()
	}
}

// --- fixture ---

// fixture is a controller over a fake clientset and a fake driver whose
// caches are filled by hand, so that each test runs the sync functions
// directly and deterministically.
type fixture struct {
	*kubetest.Env
	csi *fakeCSI
	c   *Controller
	rv  int // last resourceVersion handed out by observe
}

func newFixture(t *testing.T, caps csiclient.Capabilities, objs ...runtime.Object) *fixture {
	t.Helper()
	f := &fixture{Env: kubetest.NewEnv(t, testNow, objs...), csi: &fakeCSI{FakeDriver: kubetest.FakeDriver[csiCall]{Caps: caps}}}
	c, err := New(Config{
		DriverName:         driver,
		Client:             f.Client,
		CSI:                f.csi,
		Recorder:           f.Recorder,
		Informers:          kube.NewInformers(f.Client, 0),
		Workers:            2,
		RetryIntervalStart: time.Second,
		RetryIntervalMax:   5 * time.Minute,
		ReconcileSync:      time.Minute,
		DefaultFSType:      "ext4",
		Registerer:         f.Registry,
	})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	c.clock = f.Clock
	c.pending.clock = f.Clock
	t.Cleanup(c.shutDownQueues)
	f.c = c
	for _, o := range objs {
		f.cache(o)
	}
	f.Client.ClearActions()
	return f
}

// cache puts obj into the informer cache, as a watch event would, and
// counts a VolumeAttachment as received by the handlers (without queuing
// it: the controller has seen it before).
func (f *fixture) cache(obj runtime.Object) {
	f.T.Helper()
	var idx cache.Indexer
	switch o := obj.(type) {
	case *storagev1.VolumeAttachment:
		idx = f.c.vaIndexer
		f.c.state.deliver(o.Name, o.ResourceVersion)
	case *corev1.PersistentVolume:
		idx = f.c.pvInformer.GetIndexer()
	case *storagev1.CSINode:
		idx = f.c.csiNodeInformer.GetIndexer()
	}
	kubetest.Cache(f.T, idx, obj)
}

// observe plays the watch: every VolumeAttachment and PersistentVolume that
// differs between the fake API server and the cache is copied into the
// cache and its event handler called, the way an informer delivers it.
func (f *fixture) observe() {
	f.T.Helper()
	vas, err := f.Client.Tracker().List(storagev1.SchemeGroupVersion.WithResource("volumeattachments"), storagev1.SchemeGroupVersion.WithKind("VolumeAttachment"), "")
	if err != nil {
		f.T.Fatal(err)
	}
	live := map[string]bool{}
	for _, o := range vas.(*storagev1.VolumeAttachmentList).Items {
		va := o.DeepCopy()
		live[va.Name] = true
		old, err := f.c.vaLister.Get(va.Name)
		switch {
		case err != nil:
			_ = f.c.vaIndexer.Add(va)
			f.c.vaAdded(va)
		case !equality.Semantic.DeepEqual(stripped(old), stripped(va)):
			f.bumpRV(va, storagev1.SchemeGroupVersion.WithResource("volumeattachments"))
			_ = f.c.vaIndexer.Update(va)
			f.c.vaUpdated(old, va)
		}
	}
	cached, _ := f.c.vaLister.List(labels.Everything())
	for _, va := range cached {
		if !live[va.Name] {
			_ = f.c.vaIndexer.Delete(va)
			f.c.vaDeleted(va)
		}
	}
	pvs, err := f.Client.Tracker().List(corev1.SchemeGroupVersion.WithResource("persistentvolumes"), corev1.SchemeGroupVersion.WithKind("PersistentVolume"), "")
	if err != nil {
		f.T.Fatal(err)
	}
	pvIndexer := f.c.pvInformer.GetIndexer()
	for _, o := range pvs.(*corev1.PersistentVolumeList).Items {
		pv := o.DeepCopy()
		old, err := f.c.pvLister.Get(pv.Name)
		if err != nil || !equality.Semantic.DeepEqual(stripped(old), stripped(pv)) {
			f.bumpRV(pv, corev1.SchemeGroupVersion.WithResource("persistentvolumes"))
			_ = pvIndexer.Update(pv)
			f.c.pvChanged(pv)
		}
	}
}

// bumpRV gives a changed object a new resourceVersion in the fake API
// server, as a real one does on every write (the fake keeps them as given).
func (f *fixture) bumpRV(obj metav1.Object, gvr schema.GroupVersionResource) {
	f.T.Helper()
	f.rv++
	obj.SetResourceVersion(strconv.Itoa(f.rv))
	if err := f.Client.Tracker().Update(gvr, obj.(runtime.Object), ""); err != nil {
		f.T.Fatalf("bump resourceVersion: %v", err)
	}
}

func stripped[T runtime.Object](o T) T {
	c := o.DeepCopyObject().(T)
	out, _ := kube.StripPV(c, kube.PVAttach)
	return out.(T)
}

// drain runs the workers until every queue is empty (items waiting out a
// backoff are not run).
func (f *fixture) drain() {
	f.T.Helper()
	for range 1000 {
		switch {
		case f.c.attachQ.Q.Len() > 0:
			f.c.processNextVA(f.Ctx, f.c.attachQ)
		case f.c.detachQ.Q.Len() > 0:
			f.c.processNextVA(f.Ctx, f.c.detachQ)
		case f.c.pvQ.Q.Len() > 0:
			f.c.processNextPV(f.Ctx)
		default:
			return
		}
		f.observe()
	}
	f.T.Fatal("the queues never drained")
}

func (f *fixture) va(name string) *storagev1.VolumeAttachment {
	f.T.Helper()
	return kubetest.Get[*storagev1.VolumeAttachment](f.T, f.Client, vaGVR, "", name)
}

func (f *fixture) pv(name string) *corev1.PersistentVolume {
	f.T.Helper()
	return kubetest.Get[*corev1.PersistentVolume](f.T, f.Client, corev1.SchemeGroupVersion.WithResource("persistentvolumes"), "", name)
}

// events returns the Events recorded so far.
func (f *fixture) events() []string { return kubetest.Events(f.Recorder) }

// apiAction is one request to the API server, with its patch normalized.
type apiAction = kubetest.Action

// recorder lists every request but the informers' (lists and watches).
var recorder = kubetest.Recorder{Skip: []string{"list"}}

func (f *fixture) actions() []apiAction { return recorder.Take(f.Client) }

// handle ends one sync of key on q as Queue.ProcessNext does, and returns
// the retry delay.
func (f *fixture) handle(q *queue, key string, err error) time.Duration {
	return q.Handle(f.Ctx, key, err, err != nil && isFinal(err))
}

func patchPV(name, patch string) apiAction {
	return apiAction{Verb: "patch", Resource: "persistentvolumes", Name: name, PatchType: types.JSONPatchType, Patch: recorder.Norm(patch)}
}

func patchVAJSON(name, patch string) apiAction {
	return apiAction{Verb: "patch", Resource: "volumeattachments", Name: name, PatchType: types.JSONPatchType, Patch: recorder.Norm(patch)}
}

func patchVAMeta(name, patch string) apiAction {
	return apiAction{Verb: "patch", Resource: "volumeattachments", Name: name, PatchType: types.MergePatchType, Patch: recorder.Norm(patch)}
}

func patchVAStatus(name, patch string) apiAction {
	return apiAction{Verb: "patch", Resource: "volumeattachments", Subresource: "status", Name: name, PatchType: types.MergePatchType, Patch: recorder.Norm(patch)}
}

func get(resource, name string) apiAction {
	return apiAction{Verb: "get", Resource: resource, Name: name}
}

// The patches of a plain attach of va1 / pv1 on node-1.
var (
	addPVFinalizer = `[{"op":"test","path":"/metadata/finalizers","value":null},{"op":"add","path":"/metadata/finalizers","value":["` + finalizer + `"]}]`
	addVAMetadata  = `{"metadata":{"finalizers":["` + finalizer + `"],"annotations":{"` + nodeIDAnn + `":"` + testNodeID + `"}}}`
	markAttached   = `{"status":{"attached":true,"attachError":null}}`
	timeJSON       = testNow.Format(time.RFC3339)
)

func attachErrorPatch(msg string, code int) string {
	return fmt.Sprintf(`{"status":{"attachError":{"message":%q,"time":%q,"errorCode":%d}}}`, msg, timeJSON, code)
}

func detachErrorPatch(msg string, code int) string {
	return fmt.Sprintf(`{"status":{"detachError":{"message":%q,"time":%q,"errorCode":%d}}}`, msg, timeJSON, code)
}
