package resize

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

// onThisNode tells, with Config.NodeName set (one controller per node, next
// to a driver that serves only that node's pools), whether pv is this
// node's to expand: its required node affinity admits the node. A volume
// without node affinity belongs to no node in particular, and is left
// alone: every node's driver but one would answer NOT_FOUND, which reads as
// an infeasible request. Without Config.NodeName every volume is.
//
// The node is read with a GET when a claim needs work, which is rare
// enough not to justify watching every Node from every node.
func (c *Controller) onThisNode(ctx context.Context, pv *corev1.PersistentVolume) (bool, error) {
	if c.cfg.NodeName == "" {
		return true, nil
	}
	aff := pv.Spec.NodeAffinity
	if aff == nil || aff.Required == nil || len(aff.Required.NodeSelectorTerms) == 0 {
		klog.FromContext(ctx).V(4).Info("The PersistentVolume has no node affinity; left to a resizer that is not per node")
		return false, nil
	}
	node, err := c.client.CoreV1().Nodes().Get(ctx, c.cfg.NodeName, metav1.GetOptions{})
	if err != nil {
		return false, fmt.Errorf("read this controller's Node %s: %w", c.cfg.NodeName, err)
	}
	ok := affinityAdmits(aff.Required, node)
	if !ok {
		klog.FromContext(ctx).V(4).Info("The PersistentVolume is another node's", "node", c.cfg.NodeName)
	}
	return ok, nil
}

// affinityAdmits evaluates a required node selector against a node: the
// terms are ORed, the requirements of a term ANDed, as the scheduler does.
// Label requirements are evaluated as label selectors (In, NotIn, Exists,
// DoesNotExist, Gt, Lt); field requirements know metadata.name. A term
// that does not parse admits nothing.
func affinityAdmits(sel *corev1.NodeSelector, node *corev1.Node) bool {
	for _, term := range sel.NodeSelectorTerms {
		if len(term.MatchExpressions) == 0 && len(term.MatchFields) == 0 {
			continue // an empty term selects nothing
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
		r, err := labels.NewRequirement(e.Key, nodeSelectorOperator(e.Operator), e.Values)
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
		in := slices.Contains(f.Values, node.Name)
		switch f.Operator {
		case corev1.NodeSelectorOpIn:
			if !in {
				return false
			}
		case corev1.NodeSelectorOpNotIn:
			if in {
				return false
			}
		default:
			return false
		}
	}
	return true
}

func nodeSelectorOperator(op corev1.NodeSelectorOperator) selection.Operator {
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
	return selection.Operator(op) // NewRequirement refuses it
}
