package placement

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2/ktesting"

	"github.com/loopvol/loopvol/internal/kube"
	"github.com/loopvol/loopvol/internal/kube/kubetest"
	"github.com/loopvol/loopvol/pkg/controller"
	"github.com/loopvol/loopvol/pkg/volspec"
)

const driver = "loopvol.csi.io"

func node(name, zone string, edit ...func(*corev1.Node)) *corev1.Node {
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{volspec.TopologyKey: zone}},
		Status:     corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}},
	}
	for _, e := range edit {
		e(n)
	}
	return n
}

func cordoned(n *corev1.Node) { n.Spec.Unschedulable = true }

func volume(name, drv, zone string) *corev1.PersistentVolume {
	return &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeSpec{
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: drv, VolumeHandle: "local.0123456789abcdef0123456789abcdef",
			}},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: volspec.TopologyKey, Operator: corev1.NodeSelectorOpIn, Values: []string{zone}}},
			}}}},
		},
	}
}

func claim(name, pv string) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}, Spec: corev1.PersistentVolumeClaimSpec{VolumeName: pv}}
}

func pod(claimName string, edit ...func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "app-0", UID: "uid-1"},
		Spec: corev1.PodSpec{Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claimName},
		}}}},
		Status: corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{{
			Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable,
			Message: "0/2 nodes are available: 1 node(s) didn't match PersistentVolume's node affinity, 1 node(s) were unschedulable.",
		}}},
	}
	for _, e := range edit {
		e(p)
	}
	return p
}

// run builds a controller over objs, syncs the Pod ns/app-0 times times
// and returns the Events recorded.
func run(t *testing.T, nodeName string, times int, objs ...runtime.Object) []string {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	client := fake.NewClientset(objs...)
	inf := kube.NewInformers(client, 0)
	rec := record.NewFakeRecorder(10)
	c, err := New(Config{DriverName: driver, Client: client, Informers: inf, Recorder: rec, NodeName: nodeName,
		Workers: 1, RetryIntervalStart: time.Second, RetryIntervalMax: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	inf.Start(ctx)
	if !inf.WaitForCacheSync(ctx) {
		t.Fatal("caches did not sync")
	}
	for range times {
		if err := c.sync(ctx, "ns/app-0"); err != nil {
			t.Fatalf("sync: %v", err)
		}
	}
	return kubetest.Events(rec)
}

func TestExplains(t *testing.T) {
	base := func(nodes ...runtime.Object) []runtime.Object {
		return append([]runtime.Object{volume("pv-1", driver, "b"), claim("data", "pv-1")}, nodes...)
	}
	const where = "Warning VolumeNodeUnavailable volume pv-1 of claim data (pool local, zone b) can be used only on node "
	for _, tc := range []struct {
		name     string
		nodeName string
		objs     []runtime.Object
		want     string // "" for no Event
	}{
		{name: "cordoned", objs: append(base(node("a", "a"), node("b", "b", cordoned)), pod("data")),
			want: where + "b (cordoned: kubectl uncordon b lets it take Pods again); the Pod can run only where its volumes are"},
		{name: "schedulable", objs: append(base(node("a", "a"), node("b", "b")), pod("data"))},
		{name: "not yet tried by the scheduler", objs: append(base(node("b", "b", cordoned)), pod("data", func(p *corev1.Pod) { p.Status.Conditions = nil }))},
		{name: "placed", objs: append(base(node("b", "b", cordoned)), pod("data", func(p *corev1.Pod) { p.Spec.NodeName = "a" }))},
		{name: "another driver's volume", objs: []runtime.Object{volume("pv-1", "other.csi.io", "b"), claim("data", "pv-1"), node("b", "b", cordoned), pod("data")}},
		{name: "unbound claim", objs: []runtime.Object{volume("pv-1", driver, "b"), claim("data", ""), node("b", "b", cordoned), pod("data")}},
		{name: "not ready", objs: append(base(node("b", "b", func(n *corev1.Node) {
			n.Status.Conditions[0] = corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionUnknown, Reason: "NodeStatusUnknown"}
		})), pod("data")), want: where + "b (not Ready: NodeStatusUnknown)"},
		{name: "untolerated taint", objs: append(base(node("b", "b", func(n *corev1.Node) {
			n.Spec.Taints = []corev1.Taint{{Key: "maintenance", Value: "disk", Effect: corev1.TaintEffectNoSchedule}}
		})), pod("data")), want: where + "b (taint maintenance=disk:NoSchedule the Pod does not tolerate)"},
		{name: "tolerated taint", objs: append(base(node("b", "b", func(n *corev1.Node) {
			n.Spec.Taints = []corev1.Taint{{Key: "maintenance", Value: "disk", Effect: corev1.TaintEffectNoSchedule}}
		})), pod("data", func(p *corev1.Pod) {
			p.Spec.Tolerations = []corev1.Toleration{{Key: "maintenance", Operator: corev1.TolerationOpExists}}
		}))},
		{name: "no node of the zone", objs: append(base(node("a", "a")), pod("data")),
			want: "Warning VolumeNodeUnavailable volume pv-1 of claim data (pool local, zone b) can be used only on nodes matching " + volspec.TopologyKey + " In b, and there is none"},
		{name: "node deployment, the volume's node", nodeName: "b", objs: append(base(node("a", "a"), node("b", "b", cordoned)), pod("data")),
			want: where + "b (cordoned"},
		{name: "node deployment, another node", nodeName: "a", objs: append(base(node("a", "a"), node("b", "b", cordoned)), pod("data"))},
		{name: "ephemeral volume", objs: append([]runtime.Object{volume("pv-1", driver, "b"), claim("app-0-scratch", "pv-1"), node("b", "b", cordoned)},
			pod("", func(p *corev1.Pod) {
				p.Spec.Volumes = []corev1.Volume{{Name: "scratch", VolumeSource: corev1.VolumeSource{Ephemeral: &corev1.EphemeralVolumeSource{}}}}
			})),
			want: "Warning VolumeNodeUnavailable volume pv-1 of claim app-0-scratch (pool local, zone b) can be used only on node b (cordoned"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			events := run(t, tc.nodeName, 1, tc.objs...)
			switch {
			case tc.want == "" && len(events) != 0:
				t.Errorf("events %q, want none", events)
			case tc.want != "" && (len(events) != 1 || !strings.HasPrefix(events[0], tc.want)):
				t.Errorf("events %q, want one starting %q", events, tc.want)
			}
		})
	}
}

// TestOnce: a Pod whose status changes for other reasons is not told the
// same thing again.
func TestOnce(t *testing.T) {
	events := run(t, "", 3, volume("pv-1", driver, "b"), claim("data", "pv-1"), node("b", "b", cordoned), pod("data"))
	if len(events) != 1 {
		t.Errorf("events after three syncs %q, want one", events)
	}
}

func TestPoolAttributeIsTheDriversOwn(t *testing.T) {
	if PoolAttribute != controller.ContextPool {
		t.Errorf("PoolAttribute %q, the driver's %q", PoolAttribute, controller.ContextPool)
	}
}
