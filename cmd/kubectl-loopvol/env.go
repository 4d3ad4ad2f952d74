package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/loopvol/loopvol/pkg/statusapi"
	"github.com/loopvol/loopvol/pkg/volspec"
)

// nodePluginSelector selects the node plugin's Pods (deploy/kubernetes/base/node.yaml).
const nodePluginSelector = "app.kubernetes.io/name=loopvol,app.kubernetes.io/component=node"

// env is what one run of a command works with.
type env struct {
	kube  kubernetes.Interface
	dyn   dynamic.Interface
	nodes NodeStatusSource
	out   io.Writer
	color bool
	now   func() time.Time
	// namespace is the user's: -n, else the kubeconfig context's.
	namespace string
	opts      *options
}

// nodeView is one node as loopvol sees it: the Node, its node plugin Pod,
// its CSINode entry of the driver and what the plugin says.
type nodeView struct {
	name string
	node *corev1.Node
	// pod is the node plugin Pod on the node; nil when there is none.
	pod *corev1.Pod
	// csiNode is nil when the node has no CSINode; driver nil when its
	// CSINode lacks the driver.
	csiNode *storagev1.CSINode
	driver  *storagev1.CSINodeDriver
	status  *statusapi.NodeStatus
	// statusErr says why status is nil (exec failed, Pod not running).
	statusErr error
}

// zone is the node's zone: the plugin's word, else the Node's topology label.
func (n *nodeView) zone() string {
	if n.status != nil && n.status.Zone != "" {
		return n.status.Zone
	}
	if n.node != nil {
		return n.node.Labels[volspec.TopologyKey]
	}
	return ""
}

// cluster is the state every command starts from.
type cluster struct {
	// nodes are sorted by zone, then name: every Node, plus any name that
	// has only a plugin Pod or a CSINode.
	nodes []*nodeView
	// pluginPods is how many node plugin Pods there are.
	pluginPods int
}

// node returns the view of the node called name, nil if there is none.
func (c *cluster) node(name string) *nodeView {
	for _, n := range c.nodes {
		if n.name == name {
			return n
		}
	}
	return nil
}

// volume returns what a node plugin says of volumeID, preferring the node
// that holds it attached (a volume may linger staged elsewhere after a
// forced detach).
func (c *cluster) volume(volumeID string) (*nodeView, *statusapi.VolumeStatus) {
	var fn *nodeView
	var fv *statusapi.VolumeStatus
	for _, n := range c.nodes {
		if n.status == nil {
			continue
		}
		for i := range n.status.Volumes {
			v := &n.status.Volumes[i]
			if v.VolumeID != volumeID {
				continue
			}
			if v.Attached {
				return n, v
			}
			if fv == nil {
				fn, fv = n, v
			}
		}
	}
	return fn, fv
}

// gather lists Nodes, CSINodes and the node plugin Pods, and asks every
// running plugin of a node that ask accepts (nil: all) for its status
// (queryNodes). A node whose plugin cannot be asked keeps its error; only
// failing lists abort.
func (e *env) gather(ctx context.Context, ask func(*nodeView) bool) (*cluster, error) {
	nodes, err := e.kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	csiNodes, err := e.kube.StorageV1().CSINodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list CSINodes: %w", err)
	}
	pods, err := e.kube.CoreV1().Pods(e.opts.driverNamespace).List(ctx, metav1.ListOptions{LabelSelector: nodePluginSelector})
	if err != nil {
		return nil, fmt.Errorf("list the node plugin Pods in %s: %w", e.opts.driverNamespace, err)
	}
	c := &cluster{}
	byName := map[string]*nodeView{}
	view := func(name string) *nodeView {
		if n, ok := byName[name]; ok {
			return n
		}
		n := &nodeView{name: name}
		byName[name] = n
		c.nodes = append(c.nodes, n)
		return n
	}
	for i := range nodes.Items {
		view(nodes.Items[i].Name).node = &nodes.Items[i]
	}
	for i := range csiNodes.Items {
		cn := &csiNodes.Items[i]
		n := view(cn.Name)
		n.csiNode = cn
		for j := range cn.Spec.Drivers {
			if cn.Spec.Drivers[j].Name == e.opts.driver {
				n.driver = &cn.Spec.Drivers[j]
			}
		}
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Spec.NodeName == "" || p.DeletionTimestamp != nil && nodePluginPodOnNode(pods.Items, p) {
			continue
		}
		c.pluginPods++
		view(p.Spec.NodeName).pod = p
	}
	asked := c.nodes
	if ask != nil {
		asked = slices.DeleteFunc(slices.Clone(c.nodes), func(n *nodeView) bool { return !ask(n) })
	}
	e.queryNodes(ctx, asked)
	slices.SortFunc(c.nodes, func(a, b *nodeView) int {
		if d := strings.Compare(a.zone(), b.zone()); d != 0 {
			return d
		}
		return strings.Compare(a.name, b.name)
	})
	return c, nil
}

// nodePluginPodOnNode says whether another, not terminating, plugin Pod
// runs on p's node: during a rollout the new one is the one that counts.
func nodePluginPodOnNode(pods []corev1.Pod, p *corev1.Pod) bool {
	for i := range pods {
		q := &pods[i]
		if q.Name != p.Name && q.Spec.NodeName == p.Spec.NodeName && q.DeletionTimestamp == nil {
			return true
		}
	}
	return false
}

// podReady says whether the Pod's Ready condition is true.
func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// driverVolumes lists the PVs of the driver.
func (e *env) driverVolumes(ctx context.Context) ([]*corev1.PersistentVolume, error) {
	pvs, err := e.kube.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list PersistentVolumes: %w", err)
	}
	var out []*corev1.PersistentVolume
	for i := range pvs.Items {
		if e.isOurs(&pvs.Items[i]) {
			out = append(out, &pvs.Items[i])
		}
	}
	return out, nil
}

// isOurs says whether pv is a volume of the driver.
func (e *env) isOurs(pv *corev1.PersistentVolume) bool {
	return pv.Spec.CSI != nil && pv.Spec.CSI.Driver == e.opts.driver
}

// attachments maps each of the driver's PVs to its VolumeAttachments.
func (e *env) attachments(ctx context.Context) (map[string][]*storagev1.VolumeAttachment, error) {
	vas, err := e.kube.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list VolumeAttachments: %w", err)
	}
	out := map[string][]*storagev1.VolumeAttachment{}
	for i := range vas.Items {
		va := &vas.Items[i]
		if va.Spec.Attacher != e.opts.driver || va.Spec.Source.PersistentVolumeName == nil {
			continue
		}
		out[*va.Spec.Source.PersistentVolumeName] = append(out[*va.Spec.Source.PersistentVolumeName], va)
	}
	return out, nil
}

// attachedNode is the node a PV's attachments say it is attached to, "" if none.
func attachedNode(vas []*storagev1.VolumeAttachment) string {
	for _, va := range vas {
		if va.Status.Attached {
			return va.Spec.NodeName
		}
	}
	return ""
}

// ignoreNotFound turns a NotFound into nil: an object that is absent is a
// finding, not a failure of the command.
func ignoreNotFound(err error) error {
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}
