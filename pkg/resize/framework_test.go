package resize

import (
	"context"
	"fmt"
	"sort"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/loopvol/loopvol/internal/kube/claimtest"
	"github.com/loopvol/loopvol/internal/kube/kubetest"
	"github.com/loopvol/loopvol/pkg/csiclient"
)

// The names are written out as Kubernetes and the upstream
// external-resizer spell them, not taken from this package, so the tests
// prove the two interoperate. The claims and volumes are claimtest's.
const (
	preResizeAnn = "volume.alpha.kubernetes.io/pre-resize-capacity"
	notReqAnn    = "volume.kubernetes.io/node-expansion-not-required"
	resizerAnn   = "volume.kubernetes.io/storage-resizer"
)

var (
	// expandCaps is a driver that expands volumes in its controller.
	expandCaps = csiclient.Capabilities{ControllerService: true, ExpandVolume: true, OnlineExpansion: true}
	// nodeOnlyCaps is a driver whose controller does not expand volumes.
	nodeOnlyCaps = csiclient.Capabilities{ControllerService: true, OnlineExpansion: true}
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

// --- fixture ---

// fixture is a resize controller on a claimtest.Fixture.
type fixture struct {
	*claimtest.Fixture
	csi *fakeCSI
	c   *Controller
}

type fixtureOption = func(*Config)

func newFixture(t *testing.T, caps csiclient.Capabilities, objs []runtime.Object, opts ...fixtureOption) *fixture {
	t.Helper()
	f := &fixture{Fixture: claimtest.New(t, objs), csi: &fakeCSI{FakeDriver: kubetest.FakeDriver[expandCall]{Caps: caps}}}
	f.c = claimtest.Build(t, Config{ClaimConfig: f.ClaimConfig(), CSI: f.csi, HandleVolumeInUseError: true, AnnotatePreResizeCapacity: true}, opts, New)
	f.Use(f.c.claims)
	return f
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
