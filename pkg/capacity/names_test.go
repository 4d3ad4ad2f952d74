package capacity

import (
	"context"
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	"github.com/loopvol/loopvol/internal/kube/kubetest"
)

// TestManagedByID checks the label values against those the upstream
// external-provisioner v6.4.0 computes for the same node names (taken from
// running its code), so both manage the same objects per node.
func TestManagedByID(t *testing.T) {
	tests := []struct{ node, want string }{
		{node: "", want: "external-provisioner"},
		{node: "node-1", want: "external-provisioner-node-1"},
		{node: "n234567890123456789012345678901234567890ab", want: "external-provisioner-n234567890123456789012345678901234567890ab"},
		{node: "a-node-name-that-is-exactly-forty-two-chars", want: "external-p-53f40b57-a-node-name-that-is-exactly-forty-two-chars"},
		{node: "worker-0042.eu-west-1.compute.internal.example.com", want: "ext-53f40b57-worker-0042.eu-west-1.compute.internal.example.com"},
		{node: "n2345678901234567890123456789012345678901234567890123", want: "external-provisioner-ad0ed270"},
		{node: "a-very-long-node-name-of-a-cloud-provider-with-its-region-and-zone.internal", want: "external-provisioner-6f6e1185"},
	}
	for _, tc := range tests {
		got := ManagedByID(tc.node)
		if got != tc.want {
			t.Errorf("ManagedByID(%q) = %q, want %q", tc.node, got, tc.want)
		}
		if len(got) > 63 {
			t.Errorf("ManagedByID(%q) is %d characters, more than a label value may be", tc.node, len(got))
		}
	}
}

func TestLeaseName(t *testing.T) {
	if got, want := LeaseName("loopvol.csi.io"), "loopvol-capacity-leader-loopvol-csi-io"; got != want {
		t.Errorf("LeaseName = %q, want %q", got, want)
	}
}

func TestSegmentKeys(t *testing.T) {
	for _, labels := range []map[string]string{
		{},
		{"topology.loopvol.csi.io/zone": "z1"},
		{"b": "", "a/x": "1", "c.d": "v-2_x.y"},
	} {
		key := segmentKey(labels)
		kubetest.Diff(t, "labels of "+key, labels, segmentLabels(key))
	}
	if got := segmentKey(map[string]string{"b": "2", "a": "1"}); got != "a=1,b=2" {
		t.Errorf("segmentKey sorts by name: %q", got)
	}
	if objectSegmentKey(nil, "u") != "!u" || objectSegmentKey(&metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "a", Operator: "Exists"}}}, "u") != "!u" {
		t.Error("a selector that is no segment must get an invalid key")
	}
	if objectSegmentKey(&metav1.LabelSelector{}, "u") != "" || objectSegmentKey(&metav1.LabelSelector{MatchLabels: map[string]string{}}, "u") != "" {
		t.Error("an empty selector is the empty segment")
	}
}

func TestAffinityMatches(t *testing.T) {
	z1 := map[string]string{zoneKey: "z1"}
	term := func(exprs ...corev1.NodeSelectorRequirement) corev1.NodeSelectorTerm {
		return corev1.NodeSelectorTerm{MatchExpressions: exprs}
	}
	in := func(key string, values ...string) corev1.NodeSelectorRequirement {
		return corev1.NodeSelectorRequirement{Key: key, Operator: corev1.NodeSelectorOpIn, Values: values}
	}
	aff := func(terms ...corev1.NodeSelectorTerm) *corev1.VolumeNodeAffinity {
		return &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: terms}}
	}
	tests := []struct {
		name string
		aff  *corev1.VolumeNodeAffinity
		want bool
	}{
		{name: "no affinity → anywhere", aff: nil, want: true},
		{name: "the zone → yes", aff: aff(term(in(zoneKey, "z1"))), want: true},
		{name: "another zone → no", aff: aff(term(in(zoneKey, "z2"))), want: false},
		{name: "one of two terms → yes", aff: aff(term(in(zoneKey, "z2")), term(in(zoneKey, "z1", "z3"))), want: true},
		{name: "a key outside the segment cannot be judged → yes", aff: aff(term(in("kubernetes.io/hostname", "n1"))), want: true},
		{name: "the zone and a hostname → yes", aff: aff(term(in(zoneKey, "z1"), in("kubernetes.io/hostname", "n1"))), want: true},
		{name: "NotIn the zone → no", aff: aff(term(corev1.NodeSelectorRequirement{Key: zoneKey, Operator: corev1.NodeSelectorOpNotIn, Values: []string{"z1"}})), want: false},
		{name: "DoesNotExist on the zone key → no", aff: aff(term(corev1.NodeSelectorRequirement{Key: zoneKey, Operator: corev1.NodeSelectorOpDoesNotExist})), want: false},
		{name: "Exists on the zone key → yes", aff: aff(term(corev1.NodeSelectorRequirement{Key: zoneKey, Operator: corev1.NodeSelectorOpExists})), want: true},
	}
	for _, tc := range tests {
		if got := affinityMatches(tc.aff, z1); got != tc.want {
			t.Errorf("%s: affinityMatches = %t, want %t", tc.name, got, tc.want)
		}
	}
}

func TestTopologyCountsNodes(t *testing.T) {
	tp := newTopology()
	step := func(what, node, key string, has bool, wantAdded, wantRemoved string) {
		t.Helper()
		a, aok, r, rok := tp.setNode(node, key, has)
		if !aok {
			a = "-"
		}
		if !rok {
			r = "-"
		}
		if a != wantAdded || r != wantRemoved {
			t.Errorf("%s: added %q removed %q, want %q and %q", what, a, r, wantAdded, wantRemoved)
		}
	}
	step("n1 in z1", "n1", "z1", true, "z1", "-")
	step("n2 in z1", "n2", "z1", true, "-", "-")
	step("n1 again", "n1", "z1", true, "-", "-")
	step("n1 to z2", "n1", "z2", true, "z2", "-")
	step("n2 gone", "n2", "", false, "-", "z1")
	step("n3 unknown, gone", "n3", "", false, "-", "-")
	step("n1 to the empty segment", "n1", "", true, "", "z2")
	kubetest.Diff(t, "segments", []string{""}, tp.keys())
}

// fakeGetter serves object metadata from a map by "Kind/name".
type fakeGetter map[string]*metav1.PartialObjectMetadata

func (g fakeGetter) Get(_ context.Context, apiVersion, kind, namespace, name string) (*metav1.PartialObjectMetadata, error) {
	if md, ok := g[kind+"/"+name]; ok && namespace == "ns" && md.APIVersion == apiVersion {
		return md, nil
	}
	gv, _ := schema.ParseGroupVersion(apiVersion)
	return nil, apierrors.NewNotFound(gv.WithResource(kind).GroupResource(), name)
}

func md(apiVersion, kind, name string, owner *metav1.OwnerReference) *metav1.PartialObjectMetadata {
	m := &metav1.PartialObjectMetadata{TypeMeta: metav1.TypeMeta{APIVersion: apiVersion, Kind: kind},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID("uid-" + name)}}
	if owner != nil {
		m.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "not-a-controller", UID: "x"}, *owner}
	}
	return m
}

func ref(apiVersion, kind, name string) *metav1.OwnerReference {
	return &metav1.OwnerReference{APIVersion: apiVersion, Kind: kind, Name: name, UID: types.UID("uid-" + name), Controller: ptr.To(true)}
}

func TestLookupOwner(t *testing.T) {
	g := fakeGetter{
		"Pod/ctrl-abc-1":      md("v1", "Pod", "ctrl-abc-1", ref("apps/v1", "ReplicaSet", "ctrl-abc")),
		"ReplicaSet/ctrl-abc": md("apps/v1", "ReplicaSet", "ctrl-abc", ref("apps/v1", "Deployment", "ctrl")),
		"Deployment/ctrl":     md("apps/v1", "Deployment", "ctrl", nil),
		"Pod/lonely":          md("v1", "Pod", "lonely", nil),
	}
	_, ctx := ktesting.NewTestContext(t)
	tests := []struct {
		pod     string
		levels  int
		want    *metav1.OwnerReference
		wantErr string
	}{
		{pod: "ctrl-abc-1", levels: -1, want: nil},
		{pod: "ctrl-abc-1", levels: 0, want: ref("v1", "Pod", "ctrl-abc-1")},
		{pod: "ctrl-abc-1", levels: 1, want: ref("apps/v1", "ReplicaSet", "ctrl-abc")},
		{pod: "ctrl-abc-1", levels: 2, want: ref("apps/v1", "Deployment", "ctrl")},
		{pod: "ctrl-abc-1", levels: 3, wantErr: "Deployment ns/ctrl has no controlling owner"},
		{pod: "lonely", levels: 1, wantErr: "Pod ns/lonely has no controlling owner"},
		{pod: "missing", levels: 0, wantErr: "not found"},
	}
	for _, tc := range tests {
		got, err := LookupOwner(ctx, g, "ns", tc.pod, tc.levels)
		switch {
		case tc.wantErr != "":
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("LookupOwner(%s, %d): error %v, want one with %q", tc.pod, tc.levels, err, tc.wantErr)
			}
			if retriable(err) {
				t.Errorf("LookupOwner(%s, %d): %v would be retried", tc.pod, tc.levels, err)
			}
		case err != nil:
			t.Errorf("LookupOwner(%s, %d): %v", tc.pod, tc.levels, err)
		default:
			kubetest.Diff(t, "owner", tc.want, got)
		}
	}
	if !retriable(errors.New("connection refused")) || !retriable(apierrors.NewServiceUnavailable("busy")) {
		t.Error("transient errors must be retried")
	}
}
