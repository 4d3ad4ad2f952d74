// Package placement explains, on a Pod the scheduler cannot place, where
// its volumes of the driver live when none of the nodes that can use them
// takes Pods: "volume pvc-… (claim data-app-0, pool default) can be used only
// on node b, which is cordoned".
//
// A volume of a local pool lives on one node. When that node is drained,
// its Pods are made again elsewhere and stay Pending, and the scheduler's
// own event says only "0/2 nodes are available: 1 node(s) didn't match
// PersistentVolume's node affinity, 1 node(s) were unschedulable": it
// names neither the node the volume needs nor why that node takes nothing.
// Upstream has no component that says it (external-provisioner's
// node-deployment mode leaves such a Pod as it is). The controller watches
// only Pods no node was chosen for (a field selector), and speaks only of
// Pods the scheduler has marked Unschedulable.
package placement

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/loopvol/loopvol/internal/kube"
	"github.com/loopvol/loopvol/pkg/volspec"
)

const (
	// QueueName is the controller's work queue in the workqueue metrics.
	QueueName = "placement"
	// EventComponent is the source of the controller's Events.
	EventComponent = "loopvol-placement"
	// ReasonVolumeNodeUnavailable is the reason of the Warning on a Pod
	// whose volume can be used only on nodes that take no Pods.
	ReasonVolumeNodeUnavailable = "VolumeNodeUnavailable"
	// PoolAttribute is the volume attribute in which the driver names a
	// volume's pool (pkg/controller.ContextPool: the sidecar does not link
	// the driver's packages).
	PoolAttribute = "loopvol.csi.io/pool"
)

// LeaseName is the leader-election Lease of the placement controllers of
// driver (loopvol's own: no upstream component does this).
func LeaseName(driver string) string {
	return "loopvol-placement-leader-" + kube.SanitizeDriverName(driver)
}

// Config is what New needs.
type Config struct {
	// DriverName is the CSI driver's name: only its volumes are explained.
	DriverName string
	// Client reads Nodes and records Events.
	Client kube.Client
	// Informers are the process's shared informers; the caller starts them.
	Informers *kube.Informers
	// Recorder records the Events. Optional: when nil, the controller
	// records through its own broadcaster while Run runs.
	Recorder record.EventRecorder
	// NodeName, when set (--node-deployment), limits the controller to the
	// volumes this node can use: each node's sidecar explains its own.
	NodeName string
	// Workers is the number of Pods looked at at once.
	Workers int
	// RetryIntervalStart and RetryIntervalMax bound the per-Pod backoff
	// after a failed Node read.
	RetryIntervalStart, RetryIntervalMax time.Duration
}

// Controller records, on each Pod the scheduler cannot place, which nodes
// its volumes need and why none of them takes it. Build it with New, start
// it with Run.
type Controller struct {
	cfg      Config
	recorder record.EventRecorder
	q        *kube.Queue[string]

	podInformer, pvcInformer, pvInformer, nodeInformer cache.SharedIndexInformer
	pods                                               corelisters.PodLister
	pvcs                                               corelisters.PersistentVolumeClaimLister
	pvs                                                corelisters.PersistentVolumeLister
	nodes                                              corelisters.NodeLister

	mu sync.Mutex
	// told is the last explanation recorded on each Pod, so a Pod whose
	// status changes for other reasons does not get the same Event again.
	told map[types.UID]string
}

// New builds a controller over the unscheduled-Pod, claim, volume and Node
// informers of cfg.Informers.
func New(cfg Config) (*Controller, error) {
	switch {
	case cfg.DriverName == "":
		return nil, fmt.Errorf("placement controller: no driver name")
	case cfg.Client == nil || cfg.Informers == nil:
		return nil, fmt.Errorf("placement controller: no API client or informers")
	case cfg.Workers < 1:
		return nil, fmt.Errorf("placement controller: %d workers; at least one is needed", cfg.Workers)
	}
	if err := kube.ValidateBackoff(cfg.RetryIntervalStart, cfg.RetryIntervalMax); err != nil {
		return nil, fmt.Errorf("placement controller: %w", err)
	}
	c := &Controller{
		cfg:          cfg,
		recorder:     cfg.Recorder,
		q:            kube.NewQueue[string](QueueName, cfg.RetryIntervalStart, cfg.RetryIntervalMax),
		podInformer:  cfg.Informers.UnscheduledPods(),
		pvcInformer:  cfg.Informers.PersistentVolumeClaims(),
		pvInformer:   cfg.Informers.PersistentVolumes(kube.PVCapacity),
		nodeInformer: cfg.Informers.Nodes(),
		told:         map[types.UID]string{},
	}
	c.pods = corelisters.NewPodLister(c.podInformer.GetIndexer())
	c.pvcs = corelisters.NewPersistentVolumeClaimLister(c.pvcInformer.GetIndexer())
	c.pvs = corelisters.NewPersistentVolumeLister(c.pvInformer.GetIndexer())
	c.nodes = corelisters.NewNodeLister(c.nodeInformer.GetIndexer())
	return c, nil
}

// Run waits for the caches, runs the workers until ctx ends and returns nil
// then; an error only when it could not start.
func (c *Controller) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	if c.recorder == nil {
		var stop func()
		c.recorder, stop = kube.StartRecorder(ctx, c.cfg.Client.CoreV1(), EventComponent)
		defer stop()
	}
	var handlers kube.Handlers
	defer handlers.Remove(logger)
	if err := handlers.Add(c.podInformer, cache.ResourceEventHandlerFuncs{
		AddFunc:    c.enqueue,
		UpdateFunc: func(_, obj any) { c.enqueue(obj) },
		DeleteFunc: c.enqueue,
	}, 0); err != nil {
		c.q.ShutDown()
		return fmt.Errorf("placement controller: Pod handler: %w", err)
	}
	logger.Info("Starting the placement controller", "driver", c.cfg.DriverName, "node", c.cfg.NodeName, "workers", c.cfg.Workers)
	synced := append([]cache.InformerSynced{c.podInformer.HasSynced, c.pvcInformer.HasSynced, c.pvInformer.HasSynced, c.nodeInformer.HasSynced}, handlers.Synced()...)
	if !cache.WaitForNamedCacheSyncWithContext(ctx, synced...) {
		c.q.ShutDown()
		return nil
	}
	var wg sync.WaitGroup
	for range c.cfg.Workers {
		wg.Go(func() {
			wait.UntilWithContext(ctx, func(ctx context.Context) {
				for c.q.ProcessNext(ctx, func(ctx context.Context) error { return ctx.Err() }, c.sync, func(error) bool { return false }) {
				}
			}, time.Second)
		})
	}
	<-ctx.Done()
	c.q.ShutDown()
	wg.Wait()
	logger.Info("Placement controller stopped")
	return nil
}

func (c *Controller) enqueue(obj any) {
	if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(kube.Tombstoned(obj)); err == nil {
		c.q.Q.Add(key)
	}
}

// sync explains the Pod key, if the scheduler cannot place it because of
// where its volumes of the driver live.
func (c *Controller) sync(ctx context.Context, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	pod, err := c.pods.Pods(ns).Get(name)
	if apierrors.IsNotFound(err) {
		c.forgetGone()
		return nil
	}
	if err != nil {
		return err
	}
	if pod.Spec.NodeName != "" || !unschedulable(pod) {
		c.setTold(pod.UID, "")
		return nil
	}
	var parts []string
	for _, claim := range claimsOf(pod) {
		part, err := c.explainClaim(ctx, pod, ns, claim)
		if err != nil {
			return err
		}
		if part != "" {
			parts = append(parts, part)
		}
	}
	if len(parts) == 0 {
		c.setTold(pod.UID, "")
		return nil
	}
	msg := strings.Join(parts, "; ") + "; the Pod can run only where its volumes are, and waits until one of those nodes takes Pods again"
	if !c.setTold(pod.UID, msg) {
		return nil
	}
	klog.FromContext(ctx).V(2).Info("Pod cannot be placed where its volumes are", "pod", klog.KObj(pod), "reason", msg)
	c.recorder.Event(pod, corev1.EventTypeWarning, ReasonVolumeNodeUnavailable, msg)
	return nil
}

// explainClaim returns why no node can take pod for the volume of claim, or
// "" when a node can (or the claim is not bound to a volume of the driver
// with a node affinity: nothing of the driver's to explain).
func (c *Controller) explainClaim(ctx context.Context, pod *corev1.Pod, ns, claim string) (string, error) {
	pvc, err := c.pvcs.PersistentVolumeClaims(ns).Get(claim)
	if err != nil || pvc.Spec.VolumeName == "" {
		return "", nil // not bound yet: provisioning is the provisioner's to explain
	}
	pv, err := c.pvs.Get(pvc.Spec.VolumeName)
	if err != nil || pv.Spec.CSI == nil || pv.Spec.CSI.Driver != c.cfg.DriverName {
		return "", nil
	}
	aff := pv.Spec.NodeAffinity
	if aff == nil || aff.Required == nil {
		return "", nil
	}
	all, err := c.nodes.List(labels.Everything())
	if err != nil {
		return "", err
	}
	var names []string
	for _, n := range all {
		if kube.AffinityAdmits(aff.Required, n) {
			names = append(names, n.Name)
		}
	}
	slices.Sort(names)
	where := describeVolume(pv, pvc)
	if len(names) == 0 {
		if c.cfg.NodeName != "" {
			return "", nil // no node's to explain: each speaks of its own
		}
		return fmt.Sprintf("%s can be used only on nodes matching %s, and there is none", where, affinityString(aff.Required)), nil
	}
	// With one sidecar per node, the first node of the volume speaks.
	if c.cfg.NodeName != "" && names[0] != c.cfg.NodeName {
		return "", nil
	}
	var why []string
	for _, name := range names {
		// The shared Node cache keeps labels only; the few nodes of one
		// volume are read whole when one of its Pods cannot be placed.
		n, err := c.cfg.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			why = append(why, name+" (deleted)")
			continue
		}
		if err != nil {
			return "", fmt.Errorf("read Node %s: %w", name, err)
		}
		reason := unavailable(klog.FromContext(ctx), n, pod)
		if reason == "" {
			return "", nil // it could take the Pod: the scheduler waits on something else
		}
		why = append(why, name+" "+reason)
	}
	if len(why) == 1 {
		return fmt.Sprintf("%s can be used only on node %s", where, why[0]), nil
	}
	return fmt.Sprintf("%s can be used only on nodes %s", where, strings.Join(why, ", ")), nil
}

// describeVolume names a volume for a user: its PV, claim, pool and zone.
func describeVolume(pv *corev1.PersistentVolume, pvc *corev1.PersistentVolumeClaim) string {
	s := fmt.Sprintf("volume %s of claim %s", pv.Name, pvc.Name)
	pool := pv.Spec.CSI.VolumeAttributes[PoolAttribute]
	if pool == "" {
		// A volume ID is "<pool>.<hash>".
		if i := strings.LastIndexByte(pv.Spec.CSI.VolumeHandle, '.'); i > 0 {
			pool = pv.Spec.CSI.VolumeHandle[:i]
		}
	}
	if pool != "" {
		s += " (pool " + pool
		if zone := zoneOf(pv); zone != "" {
			s += ", zone " + zone
		}
		s += ")"
	}
	return s
}

// zoneOf is the loopvol zone a volume's node affinity names, if one.
func zoneOf(pv *corev1.PersistentVolume) string {
	for _, t := range pv.Spec.NodeAffinity.Required.NodeSelectorTerms {
		for _, e := range t.MatchExpressions {
			if e.Key == volspec.TopologyKey && e.Operator == corev1.NodeSelectorOpIn && len(e.Values) == 1 {
				return e.Values[0]
			}
		}
	}
	return ""
}

func affinityString(sel *corev1.NodeSelector) string {
	var terms []string
	for _, t := range sel.NodeSelectorTerms {
		var reqs []string
		for _, e := range t.MatchExpressions {
			reqs = append(reqs, fmt.Sprintf("%s %s %s", e.Key, e.Operator, strings.Join(e.Values, ",")))
		}
		terms = append(terms, strings.Join(reqs, " and "))
	}
	return strings.Join(terms, " or ")
}

// unavailable says why node cannot take pod ("" when it can, as far as the
// node itself goes): cordoned, not ready, or a taint the Pod does not
// tolerate.
func unavailable(logger klog.Logger, node *corev1.Node, pod *corev1.Pod) string {
	if node.Spec.Unschedulable {
		return "(cordoned: kubectl uncordon " + node.Name + " lets it take Pods again)"
	}
	for _, cond := range node.Status.Conditions {
		if cond.Type == corev1.NodeReady && cond.Status != corev1.ConditionTrue {
			return "(not Ready: " + cond.Reason + ")"
		}
	}
	for i := range node.Spec.Taints {
		taint := &node.Spec.Taints[i]
		if taint.Effect != corev1.TaintEffectNoSchedule && taint.Effect != corev1.TaintEffectNoExecute {
			continue
		}
		if !slices.ContainsFunc(pod.Spec.Tolerations, func(t corev1.Toleration) bool { return t.ToleratesTaint(logger, taint, true) }) {
			return "(taint " + taint.ToString() + " the Pod does not tolerate)"
		}
	}
	return ""
}

// unschedulable tells whether the scheduler tried pod and found no node.
func unschedulable(pod *corev1.Pod) bool {
	for _, cond := range pod.Status.Conditions {
		if cond.Type == corev1.PodScheduled {
			return cond.Status == corev1.ConditionFalse && cond.Reason == corev1.PodReasonUnschedulable
		}
	}
	return false
}

// claimsOf lists the claims pod uses: its persistentVolumeClaim volumes and
// the claims of its generic ephemeral volumes ("<pod>-<volume>").
func claimsOf(pod *corev1.Pod) []string {
	var out []string
	for _, v := range pod.Spec.Volumes {
		switch {
		case v.PersistentVolumeClaim != nil:
			out = append(out, v.PersistentVolumeClaim.ClaimName)
		case v.Ephemeral != nil:
			out = append(out, pod.Name+"-"+v.Name)
		}
	}
	return out
}

// setTold records msg as what pod was last told ("" forgets it) and says
// whether it differs from before.
func (c *Controller) setTold(uid types.UID, msg string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.told[uid] == msg {
		return false
	}
	if msg == "" {
		delete(c.told, uid)
	} else {
		c.told[uid] = msg
	}
	return true
}

// forgetGone drops what Pods no longer in the cache (deleted, or placed)
// were told: a gone Pod's UID is not known by its key, and the map holds
// only Pods that wait.
func (c *Controller) forgetGone() {
	c.mu.Lock()
	defer c.mu.Unlock()
	live := map[types.UID]bool{}
	pods, _ := c.pods.List(labels.Everything())
	for _, p := range pods {
		live[p.UID] = true
	}
	for uid := range c.told {
		if !live[uid] {
			delete(c.told, uid)
		}
	}
}
