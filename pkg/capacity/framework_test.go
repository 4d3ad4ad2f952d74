package capacity

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/types/known/wrapperspb"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/loopvol/loopvol/internal/kube"
	"github.com/loopvol/loopvol/internal/kube/kubetest"
	"github.com/loopvol/loopvol/pkg/csiclient"
)

// The names are written out as upstream external-provisioner writes them,
// not derived from this package, so the tests prove the two interoperate.
const (
	driver    = "loopvol.csi.io"
	ns        = "storage"
	zoneKey   = "topology.loopvol.csi.io/zone"
	driverLbl = "csi.storage.k8s.io/drivername"
	managedBy = "csi.storage.k8s.io/managed-by"
)

var (
	testNow  = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	topoCaps = csiclient.Capabilities{ControllerService: true, GetCapacity: true, Topology: true}
	gi       = int64(1) << 30
)

// --- object builders ---

func class(name string, opts ...func(*storagev1.StorageClass)) *storagev1.StorageClass {
	sc := &storagev1.StorageClass{
		ObjectMeta:        metav1.ObjectMeta{Name: name, ResourceVersion: "1"},
		Provisioner:       driver,
		Parameters:        map[string]string{"pool": name + "-pool"},
		VolumeBindingMode: ptr.To(storagev1.VolumeBindingWaitForFirstConsumer),
	}
	for _, o := range opts {
		o(sc)
	}
	return sc
}

func immediate(sc *storagev1.StorageClass) {
	sc.VolumeBindingMode = ptr.To(storagev1.VolumeBindingImmediate)
}

func provisioner(p string) func(*storagev1.StorageClass) {
	return func(sc *storagev1.StorageClass) { sc.Provisioner = p }
}

// node is a Node with the zone label (none when zone is "").
func node(name, zone string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: "1", Labels: map[string]string{"kubernetes.io/hostname": name}}}
	if zone != "" {
		n.Labels[zoneKey] = zone
	}
	return n
}

// csiNode lists the driver on name with the topology keys.
func csiNode(name string, keys ...string) *storagev1.CSINode {
	return &storagev1.CSINode{
		ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: "1"},
		Spec: storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{
			{Name: "other.csi.io", NodeID: "x", TopologyKeys: []string{"other"}},
			{Name: driver, NodeID: name, TopologyKeys: keys},
		}},
	}
}

// pv is a PersistentVolume of the driver in zone ("" for no affinity).
func pv(name, sc, zone string, size int64) *corev1.PersistentVolume {
	p := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: "1"},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:               corev1.ResourceList{corev1.ResourceStorage: *resource.NewQuantity(size, resource.BinarySI)},
			StorageClassName:       sc,
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: driver, VolumeHandle: name}},
		},
	}
	if zone != "" {
		p.Spec.NodeAffinity = &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: zoneKey, Operator: corev1.NodeSelectorOpIn, Values: []string{zone}}},
		}}}}
	}
	return p
}

// object is a CSIStorageCapacity as upstream makes it for class sc in zone
// ("" for the empty segment), with the given figures (max < 0: none).
func object(name, sc, zone string, capacity, max int64, opts ...func(*storagev1.CSIStorageCapacity)) *storagev1.CSIStorageCapacity {
	o := &storagev1.CSIStorageCapacity{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: ns, UID: types.UID("uid-" + name), ResourceVersion: "1",
			Labels:            map[string]string{driverLbl: driver, managedBy: "external-provisioner"},
			CreationTimestamp: metav1.NewTime(testNow.Add(-time.Hour)),
		},
		StorageClassName: sc,
		NodeTopology:     &metav1.LabelSelector{},
		Capacity:         resource.NewQuantity(capacity, resource.BinarySI),
	}
	if zone != "" {
		o.NodeTopology.MatchLabels = map[string]string{zoneKey: zone}
	}
	if max >= 0 {
		o.MaximumVolumeSize = resource.NewQuantity(max, resource.BinarySI)
	}
	for _, opt := range opts {
		opt(o)
	}
	return o
}

func createdAt(t time.Time) func(*storagev1.CSIStorageCapacity) {
	return func(o *storagev1.CSIStorageCapacity) { o.CreationTimestamp = metav1.NewTime(t) }
}

func ownedBy(ref metav1.OwnerReference) func(*storagev1.CSIStorageCapacity) {
	return func(o *storagev1.CSIStorageCapacity) { o.OwnerReferences = append(o.OwnerReferences, ref) }
}

var (
	ourOwner = metav1.OwnerReference{APIVersion: "apps/v1", Kind: "StatefulSet", Name: "loopvol-controller", UID: "uid-sts", Controller: ptr.To(true)}
	oldOwner = metav1.OwnerReference{APIVersion: "apps/v1", Kind: "Deployment", Name: "csi-provisioner", UID: "uid-deploy", Controller: ptr.To(true)}
)

// --- fake CSI driver ---

// getCapacityCall is one GetCapacity the controller made: the class's pool
// parameter and the segment's zone ("-" without accessible_topology).
type getCapacityCall struct {
	Pool string
	Zone string
}

type fakeCSI struct {
	kubetest.FakeDriver[getCapacityCall]
	free  map[string]int64 // zone ("-": no topology) → available bytes; maximum_volume_size is half
	noMax bool
	err   error
	info  *csi.NodeGetInfoResponse
}

var _ CSI = &fakeCSI{}

func (f *fakeCSI) GetCapacity(_ context.Context, req *csi.GetCapacityRequest) (*csi.GetCapacityResponse, error) {
	f.Lock()
	defer f.Unlock()
	zone := "-"
	if t := req.GetAccessibleTopology(); t != nil {
		zone = t.GetSegments()[zoneKey]
	}
	f.Calls = append(f.Calls, getCapacityCall{Pool: req.GetParameters()["pool"], Zone: zone})
	if f.err != nil {
		return nil, f.err
	}
	rsp := &csi.GetCapacityResponse{AvailableCapacity: f.free[zone]}
	if !f.noMax {
		rsp.MaximumVolumeSize = wrapperspb.Int64(f.free[zone] / 2)
	}
	return rsp, nil
}

func (f *fakeCSI) NodeGetInfo(context.Context) (*csi.NodeGetInfoResponse, error) {
	f.Lock()
	defer f.Unlock()
	if f.info == nil {
		return nil, errors.New("no node service")
	}
	return f.info, nil
}

func (f *fakeCSI) setFree(zone string, n int64) {
	f.Lock()
	defer f.Unlock()
	f.free[zone] = n
}

// --- fixture ---

// fixture is a controller over a fake clientset and a fake driver whose
// caches are filled by hand, so that each test runs the handlers and sync
// functions directly and deterministically.
type fixture struct {
	*kubetest.Env
	logger klog.Logger
	csi    *fakeCSI
	c      *Controller
}

type option func(*Config)

func withImmediate(c *Config)                 { c.ImmediateBinding = true }
func withNode(name string) option             { return func(c *Config) { c.NodeName = name } }
func withRefreshDelay(d time.Duration) option { return func(c *Config) { c.RefreshDelay = d } }
func withOwner(ref metav1.OwnerReference) option {
	return func(c *Config) {
		c.Owner = func(context.Context) (*metav1.OwnerReference, error) { return &ref, nil }
	}
}

// newFixture builds a controller, fills its caches with objs (the API
// server holds them too) and prepares it as Run would, without starting
// workers: tests call the handlers and drain the queue themselves.
func newFixture(t *testing.T, caps csiclient.Capabilities, objs []runtime.Object, opts ...option) *fixture {
	t.Helper()
	env := kubetest.NewEnv(t, testNow, objs...)
	ctx := env.Ctx
	f := &fixture{
		Env:    env,
		logger: klog.FromContext(ctx),
		csi: &fakeCSI{FakeDriver: kubetest.FakeDriver[getCapacityCall]{Caps: caps}, free: map[string]int64{"z1": 10 * gi, "z2": 20 * gi, "-": 30 * gi},
			info: &csi.NodeGetInfoResponse{NodeId: "n1", AccessibleTopology: &csi.Topology{Segments: map[string]string{zoneKey: "z1"}}}},
	}
	kubetest.Serve(f.Client, kubetest.Options{Now: testNow})
	cfg := Config{
		DriverName:         driver,
		Client:             f.Client,
		Informers:          kube.NewInformers(f.Client, 0),
		CSI:                f.csi,
		Namespace:          ns,
		PollInterval:       time.Minute,
		Workers:            1,
		RetryIntervalStart: time.Second,
		RetryIntervalMax:   time.Minute,
		Registerer:         f.Registry,
	}
	for _, o := range opts {
		o(&cfg)
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	c.clock = f.Clock
	t.Cleanup(c.q.ShutDown)
	f.c = c
	if err := c.prepare(ctx); err != nil {
		t.Fatalf("prepare: %v", err)
	}
	for _, o := range objs {
		f.cache(o)
	}
	if c.csiNodeInformer != nil {
		c.resyncTopology(ctx)
	}
	c.enqueueAll()
	f.Client.ClearActions()
	return f
}

// cache puts obj into its informer cache, as the initial list would (no
// handler runs).
func (f *fixture) cache(obj runtime.Object) {
	f.T.Helper()
	var idx cache.Indexer
	switch o := obj.(type) {
	case *storagev1.StorageClass:
		idx = f.c.scInformer.GetIndexer()
	case *corev1.PersistentVolume:
		idx = f.c.pvInformer.GetIndexer()
	case *storagev1.CSINode:
		if f.c.csiNodeInformer != nil { // a node's controller watches none
			idx = f.c.csiNodeInformer.GetIndexer()
		}
	case *corev1.Node:
		if f.c.nodeInformer != nil {
			idx = f.c.nodeInformer.GetIndexer()
		}
	case *storagev1.CSIStorageCapacity:
		// The informer watches only the controller's own labels.
		if f.c.Selector().Matches(labelsSet(o.Labels)) {
			idx = f.c.objects
		}
	}
	kubetest.Cache(f.T, idx, obj)
}

// update changes obj in its cache and calls the handler, as a watch event
// would. The API server's copy is not touched (the controller only reads
// these kinds).
func (f *fixture) update(obj runtime.Object) {
	f.T.Helper()
	switch o := obj.(type) {
	case *storagev1.StorageClass:
		old, exists, _ := f.c.scInformer.GetIndexer().Get(o)
		_ = f.c.scInformer.GetIndexer().Update(o)
		if exists {
			f.c.classChanged(f.logger, old, o)
		} else {
			f.c.classChanged(f.logger, nil, o)
		}
	case *corev1.PersistentVolume:
		old, exists, _ := f.c.pvInformer.GetIndexer().Get(o)
		_ = f.c.pvInformer.GetIndexer().Update(o)
		if exists {
			f.c.pvChanged(f.logger, old, o)
		} else {
			f.c.pvChanged(f.logger, nil, o)
		}
	case *storagev1.CSINode:
		old, exists, _ := f.c.csiNodeInformer.GetIndexer().Get(o)
		_ = f.c.csiNodeInformer.GetIndexer().Update(o)
		if !exists {
			old = nil
		}
		f.c.csiNodeChanged(f.logger, old, o)
	case *corev1.Node:
		old, exists, _ := f.c.nodeInformer.GetIndexer().Get(o)
		_ = f.c.nodeInformer.GetIndexer().Update(o)
		if !exists {
			old = nil
		}
		f.c.nodeChanged(f.logger, old, o)
	default:
		f.T.Fatalf("update %T", obj)
	}
}

// remove deletes obj from its cache and calls the handler.
func (f *fixture) remove(obj runtime.Object) {
	f.T.Helper()
	switch o := obj.(type) {
	case *storagev1.StorageClass:
		_ = f.c.scInformer.GetIndexer().Delete(o)
		f.c.classChanged(f.logger, nil, o)
	case *corev1.PersistentVolume:
		_ = f.c.pvInformer.GetIndexer().Delete(o)
		f.c.pvChanged(f.logger, nil, o)
	case *corev1.Node:
		_ = f.c.nodeInformer.GetIndexer().Delete(o)
		f.c.nodeChanged(f.logger, nil, o)
	case *storagev1.CSINode:
		_ = f.c.csiNodeInformer.GetIndexer().Delete(o)
		f.c.csiNodeChanged(f.logger, nil, o)
	default:
		f.T.Fatalf("remove %T", obj)
	}
}

var cscResource = storagev1.SchemeGroupVersion.WithResource("csistoragecapacities")

// apiObjects returns the CSIStorageCapacity objects of the fake API
// server, by name.
func (f *fixture) apiObjects() map[string]*storagev1.CSIStorageCapacity {
	f.T.Helper()
	list, err := f.Client.Tracker().List(cscResource, storagev1.SchemeGroupVersion.WithKind("CSIStorageCapacity"), ns)
	if err != nil {
		f.T.Fatal(err)
	}
	out := map[string]*storagev1.CSIStorageCapacity{}
	for _, o := range list.(*storagev1.CSIStorageCapacityList).Items {
		out[o.Name] = o.DeepCopy()
	}
	return out
}

// watched returns the objects of the API server the controller's informer
// sees (its labels).
func (f *fixture) watched() map[string]*storagev1.CSIStorageCapacity {
	out := f.apiObjects()
	for name, o := range out {
		if !f.c.Selector().Matches(labelsSet(o.Labels)) {
			delete(out, name)
		}
	}
	return out
}

// observe plays the watch of the objects: every CSIStorageCapacity that
// differs between the fake API server and the cache is copied into the
// cache and its handler called, the way the informer delivers it.
func (f *fixture) observe() {
	f.T.Helper()
	live := f.watched()
	for _, name := range slices.Sorted(maps.Keys(live)) {
		o := live[name]
		old, exists, _ := f.c.objects.Get(o)
		switch {
		case !exists:
			_ = f.c.objects.Add(o)
			f.c.objectChanged(f.logger, o)
		case old.(*storagev1.CSIStorageCapacity).ResourceVersion != o.ResourceVersion:
			_ = f.c.objects.Update(o)
			f.c.objectChanged(f.logger, o)
		}
	}
	for _, obj := range f.c.objects.List() {
		o := obj.(*storagev1.CSIStorageCapacity)
		if live[o.Name] == nil {
			_ = f.c.objects.Delete(o)
			f.c.objectDeleted(f.logger, o)
		}
	}
}

// drain runs the worker until the queue is empty (items waiting out a
// delay are not run), observing the API server after each item.
func (f *fixture) drain() {
	f.T.Helper()
	for range 1000 {
		if f.c.q.Q.Len() == 0 {
			return
		}
		f.c.processNextItem(f.Ctx)
		f.observe()
	}
	f.T.Fatal("the queue never drained")
}

// apiAction is one write to the API server; a created object is in
// short form (describe).
type apiAction = kubetest.Action

// recorder lists the writes (reads are left out).
var recorder = kubetest.Recorder{Skip: []string{"get", "list"}, Describe: func(o runtime.Object) string {
	return describe(o.(*storagev1.CSIStorageCapacity))
}}

// writes returns the writes since the last call.
func (f *fixture) writes() []apiAction { return recorder.Take(f.Client) }

// describe is an object in short form: its class, segment, figures, labels
// and owners.
func describe(o *storagev1.CSIStorageCapacity) string {
	seg := "<nil>"
	if o.NodeTopology != nil {
		b, _ := json.Marshal(o.NodeTopology)
		seg = string(b)
	}
	var owners []string
	for _, r := range o.OwnerReferences {
		owners = append(owners, fmt.Sprintf("%s/%s(controller=%t)", r.Kind, r.Name, ptr.Deref(r.Controller, false)))
	}
	return fmt.Sprintf("generateName=%s ns=%s class=%s topology=%s capacity=%s max=%s managedBy=%s driver=%s owners=%s",
		o.GenerateName, o.Namespace, o.StorageClassName, seg, quantityString(o.Capacity), quantityString(o.MaximumVolumeSize),
		o.Labels[managedBy], o.Labels[driverLbl], strings.Join(owners, ","))
}

// state is every object of the API server in short form, by name.
func (f *fixture) state() map[string]string {
	out := map[string]string{}
	for name, o := range f.apiObjects() {
		out[name] = describe(o)
	}
	return out
}

func create(obj string) apiAction {
	return apiAction{Verb: "create", Resource: cscResource.Resource, Namespace: ns, Object: obj}
}

func patch(name, p string) apiAction {
	return apiAction{Verb: "patch", Resource: cscResource.Resource, Namespace: ns, Name: name, PatchType: types.MergePatchType, Patch: recorder.Norm(p)}
}

func deleteAction(name string) apiAction {
	return apiAction{Verb: "delete", Resource: cscResource.Resource, Namespace: ns, Name: name}
}

func labelsSet(m map[string]string) labels.Set { return labels.Set(m) }

func mapValues(m map[string]string) []string {
	return slices.Collect(maps.Values(m))
}

func sortedValues(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}
