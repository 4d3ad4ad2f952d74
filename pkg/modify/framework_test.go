package modify

import (
	"context"
	"maps"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	"github.com/loopvol/loopvol/internal/kube/claimtest"
	"github.com/loopvol/loopvol/internal/kube/kubetest"
	"github.com/loopvol/loopvol/pkg/csiclient"
)

// modifyCaps is a driver with MODIFY_VOLUME.
var modifyCaps = csiclient.Capabilities{ControllerService: true, ExpandVolume: true, ModifyVolume: true}

// --- object builders (claims and volumes are claimtest's) ---

// class is a VolumeAttributesClass of the driver with params.
func class(name string, params map[string]string, opts ...func(*storagev1.VolumeAttributesClass)) *storagev1.VolumeAttributesClass {
	vac := &storagev1.VolumeAttributesClass{
		ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: "1"},
		DriverName: claimtest.Driver,
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

type fakeCSI struct {
	kubetest.FakeDriver[modifyCall]
	// answers are the errors of the next calls, in order (nil: success);
	// once used up every call succeeds.
	answers []error
}

func (f *fakeCSI) ControllerModifyVolume(_ context.Context, req *csi.ControllerModifyVolumeRequest) (*csi.ControllerModifyVolumeResponse, error) {
	f.Lock()
	defer f.Unlock()
	f.Calls = append(f.Calls, modifyCall{VolumeID: req.VolumeId, Parameters: maps.Clone(req.MutableParameters), Secrets: req.Secrets})
	if len(f.answers) > 0 {
		err := f.answers[0]
		f.answers = f.answers[1:]
		if err != nil {
			return nil, err
		}
	}
	return &csi.ControllerModifyVolumeResponse{}, nil
}

func (f *fakeCSI) answer(errs ...error) {
	f.Lock()
	defer f.Unlock()
	f.answers = append(f.answers, errs...)
}

// --- fixture ---

// fixture is a modify controller on a claimtest.Fixture, with the class
// cache filled by hand too.
type fixture struct {
	*claimtest.Fixture
	csi *fakeCSI
	c   *Controller
}

func newFixture(t *testing.T, objs []runtime.Object, opts ...func(*Config)) *fixture {
	t.Helper()
	f := &fixture{Fixture: claimtest.New(t, objs), csi: &fakeCSI{FakeDriver: kubetest.FakeDriver[modifyCall]{Caps: modifyCaps}}}
	c := claimtest.Build(t, Config{ClaimConfig: f.ClaimConfig(), CSI: f.csi}, opts, New)
	f.c, f.Replay = c, f.replayClasses
	f.Use(c.claims)
	for _, o := range objs {
		if vac, ok := o.(*storagev1.VolumeAttributesClass); ok {
			if err := c.vacInformer.GetIndexer().Add(vac.DeepCopy()); err != nil {
				t.Fatalf("cache %T: %v", o, err)
			}
		}
	}
	return f
}

// replayClasses plays the watch of classes: every class of the fake API
// server not in the cache yet is added, and its handler called.
func (f *fixture) replayClasses() {
	gvr := storagev1.SchemeGroupVersion.WithResource("volumeattributesclasses")
	vacs, err := f.Client.Tracker().List(gvr, storagev1.SchemeGroupVersion.WithKind("VolumeAttributesClass"), "")
	if err != nil {
		f.T.Fatal(err)
	}
	for _, o := range vacs.(*storagev1.VolumeAttributesClassList).Items {
		vac := o.DeepCopy()
		if _, exists, _ := f.c.vacInformer.GetIndexer().Get(vac); !exists {
			_ = f.c.vacInformer.GetIndexer().Add(vac)
			f.c.classAdded(vac)
		}
	}
}

// modifyStatusOf describes a claim's modification state in one line.
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
