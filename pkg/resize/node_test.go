package resize

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/loopvol/loopvol/internal/kube/claimtest"
)

const zoneKey = "topology.loopvol.csi.io/zone"

func inZone(zones ...string) func(*corev1.PersistentVolume) {
	return func(pv *corev1.PersistentVolume) {
		pv.Spec.NodeAffinity = &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: zoneKey, Operator: corev1.NodeSelectorOpIn, Values: zones}},
		}}}}
	}
}

func nodeObj(name string, labels map[string]string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
}

// TestNodeDeployment: with a node name, only the volumes whose node
// affinity admits the node are expanded; the rest, and volumes without
// node affinity, are left to their own node's controller.
func TestNodeDeployment(t *testing.T) {
	nodes := []runtime.Object{
		nodeObj("node-a", map[string]string{zoneKey: "node-a"}),
		nodeObj("node-b", map[string]string{zoneKey: "node-b"}),
	}
	tests := []struct {
		name      string
		node      string
		pv        *corev1.PersistentVolume
		wantCalls int
		wantGet   bool
	}{
		{name: "the volume's node → expanded", node: "node-a", pv: claimtest.Volume("c", "1Gi", inZone("node-a")), wantCalls: 1, wantGet: true},
		{name: "another node's volume → left alone", node: "node-b", pv: claimtest.Volume("c", "1Gi", inZone("node-a")), wantGet: true},
		{name: "no node affinity → left alone, node not read", node: "node-a", pv: claimtest.Volume("c", "1Gi")},
		{name: "not per node → every volume", pv: claimtest.Volume("c", "1Gi", inZone("node-b")), wantCalls: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			objs := append([]runtime.Object{claimtest.Claim("c", "2Gi", "1Gi"), tc.pv}, nodes...)
			f := newFixture(t, expandCaps, objs, func(c *Config) { c.NodeName = tc.node })
			f.QueueAll()
			f.Drain()
			if err := f.Errs[0]; err != nil {
				t.Fatalf("sync: %v", err)
			}
			acts := f.Actions()
			if got := len(acts) > 0 && acts[0] == claimtest.Get("nodes", "", tc.node); got != tc.wantGet {
				t.Errorf("read the Node first: %v, want %v (actions %+v)", got, tc.wantGet, acts)
			}
			if n := len(f.csi.TakeCalls()); n != tc.wantCalls {
				t.Errorf("%d driver calls, want %d", n, tc.wantCalls)
			}
		})
	}
}
