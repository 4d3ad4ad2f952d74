// Package fencing is the sidecar's fencing controller: when a node has
// stopped serving, it has the driver fence the node from the shared-pool
// volumes it had staged (fenceapi.FenceNode), so that those volumes can be
// used elsewhere at once and nothing the node writes later reaches them; on
// request it then puts node.kubernetes.io/out-of-service on the node, so
// that kube-controller-manager deletes its Pods and detaches their volumes
// without waiting six minutes, and takes the taint off when the node is
// back. docs/fencing.md has the design and the safety argument.
//
// A node is fenced only when both say it is not serving: its node plugin's
// heartbeat Lease (pkg/heartbeat) has not been renewed for the fencing
// period, as this process saw it, and its Node's Ready condition is not
// True (kube-controller-manager's judgement of kubelet's own Lease). The
// first alone would fence a node whose plugin crashed while its Pods still
// run and write; the second alone knows nothing of the plugin, which is
// what stops I/O on a node cut off (its self-fence, before the fencing
// period ends).
package fencing

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
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
	"github.com/loopvol/loopvol/pkg/fenceapi"
	"github.com/loopvol/loopvol/pkg/heartbeat"
)

const (
	// QueueName is the controller's work queue in the workqueue metrics.
	QueueName = "fencing"
	// EventComponent is the source of the controller's Events.
	EventComponent = "loopvol-fencing"
	// TaintOutOfService is the taint of non-graceful node shutdown
	// (kube-controller-manager then deletes the node's Pods and detaches
	// their volumes at once).
	TaintOutOfService = "node.kubernetes.io/out-of-service"

	// Event reasons.
	ReasonNodeFenced       = "NodeFenced"
	ReasonVolumeFenced     = "VolumeFenced"
	ReasonVolumeNotFenced  = "VolumeNotFenced"
	ReasonNodeBack         = "FencedNodeBack"
	ReasonWaitingNotReady  = "FencingWaitsForNotReady"
	ReasonOutOfServiceOff  = "OutOfServiceTaintRemoved"
	ReasonOutOfServiceOn   = "OutOfServiceTaintAdded"
	ReasonOutOfServiceKept = "OutOfServiceTaintKept"
	ReasonFenceFailed      = "FenceFailed"
	defaultRecheckNotReady = 2 * time.Second
)

// LeaseName is the leader-election Lease of the fencing controllers of
// driver (loopvol's own: no upstream component fences).
func LeaseName(driver string) string {
	return "loopvol-fencing-leader-" + kube.SanitizeDriverName(driver)
}

// Fencer is the driver's fencing service (fenceapi.Client).
type Fencer interface {
	FenceNode(context.Context, *fenceapi.FenceNodeRequest) (*fenceapi.FenceNodeResponse, error)
}

// Config is what New needs.
type Config struct {
	// DriverName is the CSI driver's name.
	DriverName string
	// Client reads and taints Nodes and records Events; Heartbeats reads
	// the heartbeat Leases.
	Client     kube.Client
	Heartbeats heartbeat.Client
	// Informers are the process's shared informers (PersistentVolumes, for
	// the Events on the claims of fenced volumes); the caller starts them.
	Informers *kube.Informers
	// Fencer fences a node.
	Fencer Fencer
	// Namespace holds the heartbeat Leases (the driver's namespace).
	Namespace string
	// FencingPeriod is how long a heartbeat must go unrenewed before its
	// node may be fenced (a Lease that states a longer one gets that).
	FencingPeriod time.Duration
	// ProbeInterval is the heartbeat Observer's (zero: its default).
	ProbeInterval time.Duration
	// TaintOutOfService puts node.kubernetes.io/out-of-service on a node
	// once it is fenced (opt-in: docs/fencing.md says what it trades), and
	// takes it off once the node is back.
	TaintOutOfService bool
	// FenceByCopy lets the driver fence a filesystem volume on a pool
	// without reflink by a full copy of its image.
	FenceByCopy bool
	// Recorder records the Events. Optional: when nil, the controller
	// records through its own broadcaster while Run runs.
	Recorder record.EventRecorder
	// Registry gets the controller's metrics; may be nil.
	Registry prometheus.Registerer
	// RetryIntervalStart and RetryIntervalMax bound the per-node backoff
	// after a failed fence or Node write.
	RetryIntervalStart, RetryIntervalMax time.Duration
}

// Controller fences nodes that stopped serving. Build it with New, start
// it with Run.
type Controller struct {
	cfg      Config
	recorder record.EventRecorder
	q        *kube.Queue[string]
	observer *heartbeat.Observer
	metrics  *metrics

	pvInformer cache.SharedIndexInformer
	pvs        corelisters.PersistentVolumeLister

	mu sync.Mutex
	// fenced is, per node ID, the incarnation of its plugin that the last
	// complete fence covered, so that a node is fenced once per outage
	// (FenceNode is idempotent; this only keeps the Events to one set).
	fenced map[string]time.Time
	// waiting is the nodes whose heartbeat is stale but whose kubelet
	// still reports Ready, told once.
	waiting map[string]bool
	// unclean is the nodes back and Ready whose node plugin still holds
	// fenced volumes, so that keep loopvol's taint, told once.
	unclean map[string]bool
}

// New builds the controller.
func New(cfg Config) (*Controller, error) {
	switch {
	case cfg.DriverName == "":
		return nil, errors.New("fencing controller: no driver name")
	case cfg.Client == nil || cfg.Heartbeats == nil || cfg.Informers == nil:
		return nil, errors.New("fencing controller: no API client or informers")
	case cfg.Fencer == nil:
		return nil, errors.New("fencing controller: no connection to the driver")
	}
	if err := kube.ValidateBackoff(cfg.RetryIntervalStart, cfg.RetryIntervalMax); err != nil {
		return nil, fmt.Errorf("fencing controller: %w", err)
	}
	c := &Controller{
		cfg:        cfg,
		recorder:   cfg.Recorder,
		q:          kube.NewQueue[string](QueueName, cfg.RetryIntervalStart, cfg.RetryIntervalMax),
		metrics:    newMetrics(cfg.Registry),
		pvInformer: cfg.Informers.PersistentVolumes(kube.PVCapacity),
		fenced:     map[string]time.Time{},
		waiting:    map[string]bool{},
		unclean:    map[string]bool{},
	}
	c.pvs = corelisters.NewPersistentVolumeLister(c.pvInformer.GetIndexer())
	obs, err := heartbeat.NewObserver(heartbeat.ObserverConfig{
		Client:        cfg.Heartbeats,
		Namespace:     cfg.Namespace,
		DriverName:    cfg.DriverName,
		FencingPeriod: cfg.FencingPeriod,
		ProbeInterval: cfg.ProbeInterval,
		OnChange: func(ctx context.Context, ev heartbeat.Event) {
			c.q.Q.Add(ev.Node.NodeID)
		},
	})
	if err != nil {
		return nil, fmt.Errorf("fencing controller: %w", err)
	}
	c.observer = obs
	return c, nil
}

// Run observes the heartbeats and fences until ctx ends; it returns nil
// then, an error only when it could not start.
func (c *Controller) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	if c.recorder == nil {
		var stop func()
		c.recorder, stop = kube.StartRecorder(ctx, c.cfg.Client.CoreV1(), EventComponent)
		defer stop()
	}
	logger.Info("Starting the fencing controller", "driver", c.cfg.DriverName, "namespace", c.cfg.Namespace,
		"fencingPeriod", c.cfg.FencingPeriod, "taintOutOfService", c.cfg.TaintOutOfService, "fenceByCopy", c.cfg.FenceByCopy)
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	observed := make(chan error, 1)
	wg.Go(func() { observed <- c.observer.Run(ctx) })
	if !cache.WaitForNamedCacheSyncWithContext(ctx, c.pvInformer.HasSynced) {
		c.q.ShutDown()
		wg.Wait()
		return nil
	}
	// One worker: fences are rare, and one at a time keeps a node's
	// taint and Events in order.
	wg.Go(func() {
		wait.UntilWithContext(ctx, func(ctx context.Context) {
			for c.q.ProcessNext(ctx, func(ctx context.Context) error { return ctx.Err() }, c.sync, func(error) bool { return false }) {
			}
		}, time.Second)
	})
	var err error
	select {
	case <-ctx.Done():
	case err = <-observed: // the Observer ended on its own: nothing is judged any more
	}
	cancel()
	c.q.ShutDown()
	wg.Wait()
	if err != nil {
		return fmt.Errorf("fencing controller: %w", err)
	}
	logger.Info("Fencing controller stopped")
	return nil
}

// sync acts on what the heartbeat of node ID says: fence a stale node
// whose kubelet is not Ready either, untaint a node that is back.
func (c *Controller) sync(ctx context.Context, id string) error {
	state, ok := c.observer.Node(id)
	if !ok {
		c.forget(id)
		return nil
	}
	if !state.Stale {
		return c.back(ctx, state)
	}
	node, err := c.cfg.Client.CoreV1().Nodes().Get(ctx, id, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		node = nil // a node deleted from the cluster serves nothing
	} else if err != nil {
		return err
	}
	if node != nil && ready(node) {
		if c.first(c.waiting, id) {
			klog.FromContext(ctx).Info("The node's heartbeat is stale but its kubelet reports Ready: not fencing it (its node plugin may have crashed while its Pods still write)",
				"node", id, "staleFor", state.StaleFor)
			c.recorder.Eventf(node, corev1.EventTypeWarning, ReasonWaitingNotReady,
				"loopvol's node plugin on %s has not renewed its heartbeat for %s, but the node's kubelet reports Ready: not fenced while the node may still run Pods; check the loopvol-node Pod", id, (state.StaleFor + state.FencingPeriod).Round(time.Second))
		}
		c.q.Q.AddAfter(id, defaultRecheckNotReady)
		return nil
	}
	return c.fence(ctx, node, state)
}

// fence has the driver fence node (nil if it is gone from the cluster),
// records what became of each volume and, if asked, taints it.
func (c *Controller) fence(ctx context.Context, node *corev1.Node, state heartbeat.NodeState) error {
	logger := klog.FromContext(ctx).WithValues("node", state.NodeID)
	c.mu.Lock()
	done, wasFenced := c.fenced[state.NodeID]
	c.mu.Unlock()
	start := time.Now()
	resp, err := c.cfg.Fencer.FenceNode(ctx, &fenceapi.FenceNodeRequest{NodeID: state.NodeID, Through: state.Incarnation, AllowCopy: c.cfg.FenceByCopy})
	c.metrics.fenceCalls.WithLabelValues(callResult(err)).Inc()
	if err != nil {
		if node != nil {
			c.recorder.Eventf(node, corev1.EventTypeWarning, ReasonFenceFailed, "loopvol could not fence %s from its volumes (retried): %v", state.NodeID, err)
		}
		return fmt.Errorf("fence node %s: %w", state.NodeID, err)
	}
	var fenced, left, failed int
	var failures []string
	for _, v := range resp.Volumes {
		switch {
		case v.Error != "":
			failed++
			failures = append(failures, v.VolumeID+": "+v.Error)
		case v.Fenced && v.Method != "":
			fenced++
			c.eventOnClaim(ctx, node, v.VolumeID, corev1.EventTypeNormal, ReasonVolumeFenced, fmt.Sprintf(
				"volume %s fenced from node %s (by %s, %s): the node stopped serving, nothing it writes from now on reaches the volume, and it can be used on another node once detached",
				v.VolumeID, state.NodeID, v.Method, time.Duration(v.Seconds*float64(time.Second)).Round(time.Millisecond)))
		case v.Fenced:
		default:
			left++
			c.eventOnClaim(ctx, node, v.VolumeID, corev1.EventTypeWarning, ReasonVolumeNotFenced, fmt.Sprintf(
				"volume %s not fenced from node %s, which stopped serving: %s", v.VolumeID, state.NodeID, v.Reason))
		}
	}
	for _, e := range resp.PoolErrors {
		failed++
		failures = append(failures, e)
	}
	took := time.Since(start)
	if failed > 0 {
		return fmt.Errorf("fence node %s: %d of its volumes failed: %s", state.NodeID, failed, strings.Join(failures, "; "))
	}
	if !wasFenced || !done.Equal(state.Incarnation) {
		c.metrics.nodesFenced.Inc()
		c.metrics.detection.Observe((state.StaleFor + state.FencingPeriod).Seconds())
		logger.Info("Fenced the node from its volumes", "fenced", fenced, "notFenced", left, "duration", took, "heartbeatStaleFor", state.StaleFor+state.FencingPeriod)
		if node != nil {
			c.recorder.Eventf(node, corev1.EventTypeWarning, ReasonNodeFenced,
				"loopvol fenced %s: its heartbeat was not renewed for %s and its kubelet is not Ready; %d volume(s) fenced, %d left (see their claims' events)",
				state.NodeID, (state.StaleFor + state.FencingPeriod).Round(time.Second), fenced, left)
		}
	}
	c.mu.Lock()
	c.fenced[state.NodeID] = state.Incarnation
	delete(c.waiting, state.NodeID)
	c.mu.Unlock()
	if c.cfg.TaintOutOfService && node != nil {
		return c.setTaint(ctx, node, true)
	}
	return nil
}

// back handles a node whose heartbeat is fresh: once it is Ready again and
// clean (its node plugin says it holds no fenced volume any more: kubelet
// has unmounted those of the Pods deleted meanwhile, and the plugin let go
// of their devices), the out-of-service taint loopvol put on it comes off.
// A plugin that does not count fenced volumes is taken at its Ready.
func (c *Controller) back(ctx context.Context, state heartbeat.NodeState) error {
	id := state.NodeID
	c.mu.Lock()
	_, wasFenced := c.fenced[id]
	delete(c.waiting, id)
	c.mu.Unlock()
	if !c.cfg.TaintOutOfService && !wasFenced {
		return nil
	}
	node, err := c.cfg.Client.CoreV1().Nodes().Get(ctx, id, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		c.forget(id)
		return nil
	}
	if err != nil {
		return err
	}
	if wasFenced {
		c.metrics.nodesBack.Inc()
		klog.FromContext(ctx).Info("A fenced node renews its heartbeat again", "node", id)
		c.recorder.Eventf(node, corev1.EventTypeNormal, ReasonNodeBack,
			"%s renews loopvol's heartbeat again after it was fenced: its node plugin cleans up the volumes it had (their writes since the fence never reached them)", id)
		c.mu.Lock()
		delete(c.fenced, id)
		c.mu.Unlock()
	}
	if !ourTaint(node, c.cfg.DriverName) {
		return nil
	}
	if !ready(node) {
		c.q.Q.AddAfter(id, defaultRecheckNotReady) // untainted once kubelet is Ready
		return nil
	}
	if state.FencedVolumes > 0 {
		if c.first(c.unclean, id) {
			klog.FromContext(ctx).Info("The fenced node is back and Ready but still holds fenced volumes: keeping the out-of-service taint until it has let go of them",
				"node", id, "fencedVolumes", state.FencedVolumes)
			c.recorder.Eventf(node, corev1.EventTypeNormal, ReasonOutOfServiceKept,
				"%s is back and Ready, but loopvol's node plugin there still holds %d fenced volume(s): %s stays until kubelet has unmounted them and the plugin let go of them", id, state.FencedVolumes, TaintOutOfService)
		}
		c.q.Q.AddAfter(id, defaultRecheckNotReady)
		return nil
	}
	c.mu.Lock()
	delete(c.unclean, id)
	c.mu.Unlock()
	return c.setTaint(ctx, node, false)
}

// first marks node id in told (c.waiting or c.unclean) and reports whether
// it was not marked yet: what is said once per node.
func (c *Controller) first(told map[string]bool, id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if told[id] {
		return false
	}
	told[id] = true
	return true
}

func (c *Controller) forget(id string) {
	c.mu.Lock()
	delete(c.fenced, id)
	delete(c.waiting, id)
	delete(c.unclean, id)
	c.mu.Unlock()
}

// setTaint adds (on) or removes the out-of-service taint loopvol puts on
// node (value: the driver's name, so that an operator's own taint of the
// same key is never removed), with the node's resourceVersion as the
// precondition, retried once on a conflict.
func (c *Controller) setTaint(ctx context.Context, node *corev1.Node, on bool) error {
	return kube.RetryStale(ctx, node, apierrors.IsConflict,
		func(ctx context.Context) (*corev1.Node, error) {
			n, err := c.cfg.Client.CoreV1().Nodes().Get(ctx, node.Name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return nil, nil
			}
			return n, err
		},
		func(ctx context.Context, n *corev1.Node) error {
			if n == nil {
				return nil
			}
			has := slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == TaintOutOfService })
			if on == has && (on || !ourTaint(n, c.cfg.DriverName)) {
				return nil // there (ours or an operator's), or not ours to remove
			}
			taints := slices.DeleteFunc(slices.Clone(n.Spec.Taints), func(t corev1.Taint) bool {
				return t.Key == TaintOutOfService && t.Value == c.cfg.DriverName
			})
			if on {
				now := metav1.Now()
				taints = append(taints, corev1.Taint{Key: TaintOutOfService, Value: c.cfg.DriverName, Effect: corev1.TaintEffectNoExecute, TimeAdded: &now})
			}
			patch, err := json.Marshal(map[string]any{
				"metadata": map[string]any{"resourceVersion": n.ResourceVersion},
				"spec":     map[string]any{"taints": taints},
			})
			if err != nil {
				return err
			}
			if _, err := c.cfg.Client.CoreV1().Nodes().Patch(ctx, n.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
				return fmt.Errorf("node %s: %s the out-of-service taint: %w", n.Name, map[bool]string{true: "add", false: "remove"}[on], err)
			}
			if on {
				c.metrics.taints.WithLabelValues("added").Inc()
				klog.FromContext(ctx).Info("Put the out-of-service taint on a fenced node", "node", n.Name)
				c.recorder.Eventf(n, corev1.EventTypeWarning, ReasonOutOfServiceOn,
					"loopvol put %s on %s after fencing it: kube-controller-manager deletes its Pods and detaches their volumes now; loopvol takes it off when the node is back and Ready", TaintOutOfService, n.Name)
			} else {
				c.metrics.taints.WithLabelValues("removed").Inc()
				klog.FromContext(ctx).Info("Took the out-of-service taint off a node that is back", "node", n.Name)
				c.recorder.Eventf(n, corev1.EventTypeNormal, ReasonOutOfServiceOff, "loopvol took %s off %s: it is back, Ready, renews its heartbeat and holds no fenced volume", TaintOutOfService, n.Name)
			}
			return nil
		})
}

// eventOnClaim records an Event on the claim of the PV of volumeID (on the
// PV when it has no claim, on node when no PV of the driver has it: a
// volume made outside Kubernetes, or a PV deleted meanwhile).
func (c *Controller) eventOnClaim(ctx context.Context, node *corev1.Node, volumeID, eventType, reason, msg string) {
	pvs, _ := c.pvs.List(everything)
	for _, pv := range pvs {
		if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != c.cfg.DriverName || pv.Spec.CSI.VolumeHandle != volumeID {
			continue
		}
		// The shared cache keeps no claim reference (kube.PVCapacity):
		// a fence is rare, so the volume is read whole.
		if live, err := c.cfg.Client.CoreV1().PersistentVolumes().Get(ctx, pv.Name, metav1.GetOptions{}); err == nil {
			pv = live
		}
		if ref := pv.Spec.ClaimRef; ref != nil {
			c.recorder.Event(&corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: ref.Namespace, Name: ref.Name, UID: ref.UID}, eventType, reason, msg)
			return
		}
		c.recorder.Event(pv, eventType, reason, msg)
		return
	}
	if node != nil {
		c.recorder.Event(node, eventType, reason, msg)
	}
}

// ready tells whether node's Ready condition is True.
func ready(node *corev1.Node) bool {
	for _, cond := range node.Status.Conditions {
		if cond.Type == corev1.NodeReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

// ourTaint tells whether node has the out-of-service taint loopvol puts.
func ourTaint(node *corev1.Node, driver string) bool {
	return slices.ContainsFunc(node.Spec.Taints, func(t corev1.Taint) bool { return t.Key == TaintOutOfService && t.Value == driver })
}

func callResult(err error) string {
	if err != nil {
		return "error"
	}
	return "ok"
}

var everything = labels.Everything()
