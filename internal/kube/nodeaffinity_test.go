package kube

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestAffinityAdmits(t *testing.T) {
	const zoneKey = "topology.loopvol.csi.io/zone"
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{zoneKey: "z1", "gen": "5"}}}
	req := func(key string, op corev1.NodeSelectorOperator, v ...string) corev1.NodeSelectorRequirement {
		return corev1.NodeSelectorRequirement{Key: key, Operator: op, Values: v}
	}
	tests := []struct {
		name  string
		terms []corev1.NodeSelectorTerm
		want  bool
	}{
		{name: "In", terms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{req(zoneKey, corev1.NodeSelectorOpIn, "z0", "z1")}}}, want: true},
		{name: "In, other value", terms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{req(zoneKey, corev1.NodeSelectorOpIn, "z2")}}}},
		{name: "NotIn", terms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{req(zoneKey, corev1.NodeSelectorOpNotIn, "z1")}}}},
		{name: "DoesNotExist", terms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{req("gpu", corev1.NodeSelectorOpDoesNotExist)}}}, want: true},
		{name: "Gt", terms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{req("gen", corev1.NodeSelectorOpGt, "4")}}}, want: true},
		{name: "requirements of a term are ANDed", terms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
			req(zoneKey, corev1.NodeSelectorOpIn, "z1"), req("gen", corev1.NodeSelectorOpLt, "5"),
		}}}},
		{name: "terms are ORed", terms: []corev1.NodeSelectorTerm{
			{MatchExpressions: []corev1.NodeSelectorRequirement{req(zoneKey, corev1.NodeSelectorOpIn, "z9")}},
			{MatchFields: []corev1.NodeSelectorRequirement{req("metadata.name", corev1.NodeSelectorOpIn, "n1")}},
		}, want: true},
		{name: "unknown field", terms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{req("spec.unschedulable", corev1.NodeSelectorOpIn, "n1")}}}},
		{name: "empty term selects nothing", terms: []corev1.NodeSelectorTerm{{}}},
		{name: "bad operator", terms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{req(zoneKey, "Near", "z1")}}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := AffinityAdmits(&corev1.NodeSelector{NodeSelectorTerms: tc.terms}, node); got != tc.want {
				t.Errorf("AffinityAdmits = %v, want %v", got, tc.want)
			}
		})
	}
}
