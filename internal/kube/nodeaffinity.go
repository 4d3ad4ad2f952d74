package kube

import (
	"context"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/klog/v2"
)

// VolumeOnNode tells, for a controller limited to one node (node set:
// --node-deployment, one sidecar per node next to a driver that serves only
// that node's pools), whether pv is that node's to act on: its required
// node affinity admits the node. A volume without node affinity belongs to
// no node in particular and is left alone: every node's driver but one
// would answer NOT_FOUND, which reads as an infeasible request. With node
// empty every volume is.
//
// The Node is read with a GET, only when a claim needs work: rare enough
// not to justify watching every Node from every node.
func VolumeOnNode(ctx context.Context, client Client, node string, pv *corev1.PersistentVolume) (bool, error) {
	if node == "" {
		return true, nil
	}
	logger := klog.FromContext(ctx)
	aff := pv.Spec.NodeAffinity
	if aff == nil || aff.Required == nil || len(aff.Required.NodeSelectorTerms) == 0 {
		logger.V(4).Info("The PersistentVolume has no node affinity; left to a resizer that is not per node")
		return false, nil
	}
	n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return false, fmt.Errorf("read this controller's Node %s: %w", node, err)
	}
	ok := AffinityAdmits(aff.Required, n)
	if !ok {
		logger.V(4).Info("The PersistentVolume is another node's", "node", node)
	}
	return ok, nil
}

// OnNode tells whether pv is the controller's to act on: VolumeOnNode with
// the ClaimConfig's client and NodeName.
func (q *ClaimQueue) OnNode(ctx context.Context, pv *corev1.PersistentVolume) (bool, error) {
	return VolumeOnNode(ctx, q.cfg.Client, q.cfg.NodeName, pv)
}

// AffinityAdmits evaluates a required node selector against node as the
// scheduler does: the terms are ORed, the requirements of one term ANDed.
// Label requirements are label selectors (In, NotIn, Exists, DoesNotExist,
// Gt, Lt); of the fields only metadata.name is known. An empty term
// selects nothing, and a term that does not parse admits nothing.
func AffinityAdmits(sel *corev1.NodeSelector, node *corev1.Node) bool {
	for _, term := range sel.NodeSelectorTerms {
		if len(term.MatchExpressions) == 0 && len(term.MatchFields) == 0 {
			continue
		}
		if termAdmits(term, node) {
			return true
		}
	}
	return false
}

func termAdmits(term corev1.NodeSelectorTerm, node *corev1.Node) bool {
	s := labels.NewSelector()
	for _, e := range term.MatchExpressions {
		r, err := labels.NewRequirement(e.Key, selectorOperator(e.Operator), e.Values)
		if err != nil {
			return false
		}
		s = s.Add(*r)
	}
	if !s.Matches(labels.Set(node.Labels)) {
		return false
	}
	for _, f := range term.MatchFields {
		if f.Key != "metadata.name" {
			return false
		}
		named := slices.Contains(f.Values, node.Name)
		switch {
		case f.Operator == corev1.NodeSelectorOpIn && named, f.Operator == corev1.NodeSelectorOpNotIn && !named:
		default:
			return false
		}
	}
	return true
}

// selectorOperator maps a node selector operator to a label selector's; an
// unknown one is passed on for NewRequirement to refuse.
func selectorOperator(op corev1.NodeSelectorOperator) selection.Operator {
	switch op {
	case corev1.NodeSelectorOpIn:
		return selection.In
	case corev1.NodeSelectorOpNotIn:
		return selection.NotIn
	case corev1.NodeSelectorOpExists:
		return selection.Exists
	case corev1.NodeSelectorOpDoesNotExist:
		return selection.DoesNotExist
	case corev1.NodeSelectorOpGt:
		return selection.GreaterThan
	case corev1.NodeSelectorOpLt:
		return selection.LessThan
	}
	return selection.Operator(op)
}
