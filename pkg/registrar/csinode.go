package registrar

import (
	"context"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/loopvol/loopvol/internal/kube"
	"github.com/loopvol/loopvol/pkg/csiclient"
)

// CSINodeQueueName is the name of the direct mode's work queue in the
// workqueue metrics.
const CSINodeQueueName = "registrar-csinode"

// csiNodeController does kubelet's part of the registration in ModeDirect:
// it keeps the driver's entry in the node's CSINode equal to what
// NodeGetInfo reports, as kubelet's node info manager does.
//
// One queue with one key, the node name, and one worker that owns it. The
// key is queued
//   - at the start;
//   - when the CSINode changes into something other than the entry last
//     written (a hand edit, a deletion): drift is repaired;
//   - every CSIDriver.spec.nodeAllocatableUpdatePeriodSeconds, when the
//     CSIDriver sets it: NodeGetInfo is read again, and a new
//     max_volumes_per_node becomes the new allocatable.count;
//   - at once when, with that period set, an attach to this node fails
//     with RESOURCE_EXHAUSTED (VolumeAttachment attachError.errorCode 8):
//     the driver may have fewer free slots than the count says. Kubelet
//     does both only when the period is set; so does this.
//
// Every sync calls NodeGetInfo and writes only when the entry differs, with
// a patch that never touches another driver's entry (entryPatch). A
// missing CSINode is created with the Node as its owner, like kubelet does,
// so it goes when the Node goes. The controller's own writes (kube.Writes)
// neither count as drift when they come back nor leave a sync deciding on
// a cached copy that predates them.
type csiNodeController struct {
	driver string
	node   string
	client kube.Client
	csi    Driver
	clock  clock.WithTicker

	vaInformer      cache.SharedIndexInformer // shared: the caller runs it
	csiNodeInformer cache.SharedIndexInformer // own, this node's CSINode only
	driverInformer  cache.SharedIndexInformer // own, this driver's CSIDriver only
	csiNodeLister   storagelisters.CSINodeLister
	driverLister    storagelisters.CSIDriverLister

	queue *kube.Queue[string]
	// writes are the controller's own writes of the CSINode.
	writes *kube.Writes[string]
	// periodChanged is signalled when the CSIDriver's period changed.
	periodChanged chan struct{}

	mu      sync.Mutex
	want    *storagev1.CSINodeDriver // the entry last computed from NodeGetInfo
	inPlace bool                     // the last sync found or wrote want
	lastErr error                    // the last sync's error
	since   time.Time                // when inPlace or lastErr last changed
	period  time.Duration            // from the CSIDriver; 0: no periodic re-read
}

func newCSINodeController(cfg Config) *csiNodeController {
	st := cfg.Client.StorageV1()
	c := &csiNodeController{
		driver:        cfg.DriverName,
		node:          cfg.NodeName,
		client:        cfg.Client,
		csi:           cfg.Driver,
		clock:         cfg.Clock,
		vaInformer:    cfg.VolumeAttachments,
		queue:         kube.NewQueue[string](CSINodeQueueName, cfg.RetryIntervalStart, cfg.RetryIntervalMax),
		writes:        kube.NewWrites[string](1),
		periodChanged: make(chan struct{}, 1),
		since:         cfg.Clock.Now(),
	}
	c.csiNodeInformer = namedInformer(cfg.Client, &storagev1.CSINode{}, cfg.NodeName,
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return st.CSINodes().List(ctx, o)
		},
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return st.CSINodes().Watch(ctx, o)
		})
	c.driverInformer = namedInformer(cfg.Client, &storagev1.CSIDriver{}, cfg.DriverName,
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return st.CSIDrivers().List(ctx, o)
		},
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return st.CSIDrivers().Watch(ctx, o)
		})
	c.csiNodeLister = storagelisters.NewCSINodeLister(c.csiNodeInformer.GetIndexer())
	c.driverLister = storagelisters.NewCSIDriverLister(c.driverInformer.GetIndexer())
	return c
}

// run keeps the entry until ctx ends.
func (c *csiNodeController) run(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	defer c.queue.ShutDown()
	handlers := &kube.Handlers{}
	defer handlers.Remove(logger)
	for _, h := range []struct {
		inf cache.SharedIndexInformer
		h   cache.ResourceEventHandler
	}{
		{c.csiNodeInformer, cache.ResourceEventHandlerFuncs{
			AddFunc:    c.csiNodeChanged,
			UpdateFunc: func(_, obj any) { c.csiNodeChanged(obj) },
			DeleteFunc: c.csiNodeDeleted,
		}},
		{c.driverInformer, cache.ResourceEventHandlerFuncs{
			AddFunc:    func(any) { c.driverChanged(ctx) },
			UpdateFunc: func(any, any) { c.driverChanged(ctx) },
			DeleteFunc: func(any) { c.driverChanged(ctx) },
		}},
		{c.vaInformer, cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { c.vaChanged(ctx, nil, obj) },
			UpdateFunc: func(old, obj any) { c.vaChanged(ctx, old, obj) },
		}},
	} {
		if err := handlers.Add(h.inf, h.h, 0); err != nil {
			return fmt.Errorf("CSINode controller: event handler: %w", err)
		}
	}
	go c.csiNodeInformer.RunWithContext(ctx)
	go c.driverInformer.RunWithContext(ctx)
	synced := append([]cache.InformerSynced{c.csiNodeInformer.HasSynced, c.driverInformer.HasSynced, c.vaInformer.HasSynced}, handlers.Synced()...)
	logger.Info("Starting the CSINode controller (direct mode)", "node", c.node)
	if !cache.WaitForNamedCacheSyncWithContext(ctx, synced...) {
		return nil // ctx ended
	}
	c.queue.Q.Add(c.node)

	var wg sync.WaitGroup
	wg.Go(func() { wait.UntilWithContext(ctx, c.worker, time.Second) })
	wg.Go(func() { c.periodic(ctx) })
	<-ctx.Done()
	c.queue.ShutDown()
	wg.Wait()
	return nil
}

func (c *csiNodeController) worker(ctx context.Context) {
	for c.processNext(ctx) {
	}
}

// processNext syncs the entry once (kube.Queue.ProcessNext: the one place
// that ends an item). While the driver is away it waits, rather than fail
// and back off.
func (c *csiNodeController) processNext(ctx context.Context) bool {
	return c.queue.ProcessNext(ctx, c.csi.WaitReady, func(ctx context.Context, _ string) error {
		err := c.sync(ctx)
		c.record(err)
		return err
	}, csiclient.IsFinal)
}

func (c *csiNodeController) record(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if (err == nil) != c.inPlace || (err != nil) != (c.lastErr != nil) {
		c.since = c.clock.Now()
	}
	c.inPlace, c.lastErr = err == nil, err
}

// healthy returns nil when the last sync put the entry in place.
func (c *csiNodeController) healthy() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.inPlace:
		return nil
	case c.lastErr != nil:
		return fmt.Errorf("the CSINode entry of node %s could not be written (for %s): %w", c.node, c.clock.Since(c.since).Round(time.Second), c.lastErr)
	default:
		return fmt.Errorf("the CSINode entry of node %s is not written yet", c.node)
	}
}

// sync reads NodeGetInfo and makes the CSINode entry say the same.
func (c *csiNodeController) sync(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	info, err := c.csi.NodeGetInfo(ctx)
	if err != nil {
		return err
	}
	want, warning, err := desiredEntry(c.driver, info)
	if err != nil {
		return err
	}
	if warning != "" {
		logger.Info("Driver reported a bad volume limit", "problem", warning)
	}
	c.mu.Lock()
	c.want = &want
	c.mu.Unlock()

	node, err := c.csiNodeLister.Get(c.node)
	if apierrors.IsNotFound(err) || err == nil && c.writes.Stale(c.node, node.ResourceVersion) {
		// The cache may not have our own last write yet.
		node, err = c.client.StorageV1().CSINodes().Get(ctx, c.node, metav1.GetOptions{})
	}
	if apierrors.IsNotFound(err) {
		err = c.create(ctx, want)
		if !apierrors.IsAlreadyExists(err) {
			return err
		}
		// Created meanwhile: add the entry to that one.
		node, err = c.client.StorageV1().CSINodes().Get(ctx, c.node, metav1.GetOptions{})
	}
	if err != nil {
		return fmt.Errorf("read CSINode %s: %w", c.node, err)
	}
	// A failed test op (the cached copy was stale) or a deletion: read it
	// again and retry once (kube.RetryStale); a second failure backs off.
	return kube.RetryStale(ctx, node, nil, c.readCSINode, func(ctx context.Context, node *storagev1.CSINode) error {
		if node == nil {
			return c.create(ctx, want)
		}
		return c.patchEntry(ctx, node, want)
	})
}

// readCSINode reads the node's CSINode: nil when there is none.
func (c *csiNodeController) readCSINode(ctx context.Context) (*storagev1.CSINode, error) {
	node, err := c.client.StorageV1().CSINodes().Get(ctx, c.node, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	return node, err
}

// patchEntry brings the driver's entry in node to want, with as many
// patches as entryPatch asks for (a removal and then the entry anew).
func (c *csiNodeController) patchEntry(ctx context.Context, node *storagev1.CSINode, want storagev1.CSINodeDriver) error {
	logger := klog.FromContext(ctx)
	for {
		patch, removal := entryPatch(node, want)
		if patch == nil {
			logger.V(4).Info("CSINode entry is up to date", "csiNode", klog.KObj(node), "entry", describeEntry(&want))
			return nil
		}
		var old *storagev1.CSINodeDriver
		if i := findEntry(node, c.driver); i >= 0 {
			old = &node.Spec.Drivers[i]
		}
		logger.V(5).Info("Patching CSINode", "csiNode", klog.KObj(node), "patch", string(patch))
		out, err := c.client.StorageV1().CSINodes().Patch(ctx, c.node, types.JSONPatchType, patch, metav1.PatchOptions{})
		if err != nil {
			return fmt.Errorf("patch CSINode %s: %w", c.node, err)
		}
		c.writes.Record(c.node, out.ResourceVersion, c.clock.Now())
		if !removal {
			logger.V(2).Info("Updated the driver's CSINode entry", "csiNode", klog.KObj(node), "from", describeEntry(old), "to", describeEntry(&want))
			return nil
		}
		logger.V(2).Info("Removed the driver's CSINode entry to add it anew: its node ID or topology keys changed, which the API allows only that way",
			"csiNode", klog.KObj(node), "from", describeEntry(old), "to", describeEntry(&want))
		node = out
	}
}

// create creates the node's CSINode with want as its one entry, owned by
// the Node, as kubelet makes it. An error says why not; it is an
// AlreadyExists error (apierrors.IsAlreadyExists) when the CSINode was
// created meanwhile.
func (c *csiNodeController) create(ctx context.Context, want storagev1.CSINodeDriver) error {
	logger := klog.FromContext(ctx)
	owner, err := c.client.CoreV1().Nodes().Get(ctx, c.node, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("node %s does not exist; its CSINode is created once it does, owned by it (as kubelet makes it)", c.node)
	}
	if err != nil {
		return fmt.Errorf("read node %s for its UID: %w", c.node, err)
	}
	obj := &storagev1.CSINode{
		ObjectMeta: metav1.ObjectMeta{
			Name: c.node,
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: corev1.SchemeGroupVersion.String(),
				Kind:       "Node",
				Name:       owner.Name,
				UID:        owner.UID,
			}},
		},
		Spec: storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{want}},
	}
	out, err := c.client.StorageV1().CSINodes().Create(ctx, obj, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create CSINode %s: %w", c.node, err)
	}
	c.writes.Record(c.node, out.ResourceVersion, c.clock.Now())
	logger.Info("Created the CSINode with the driver's entry", "csiNode", klog.KObj(out), "entry", describeEntry(&want))
	return nil
}

// csiNodeChanged queues a sync when the node's CSINode does not hold the
// entry last computed: drift. The controller's own writes coming back
// queue nothing, even the removal of an entry that is added anew next.
func (c *csiNodeController) csiNodeChanged(obj any) {
	node, ok := obj.(*storagev1.CSINode)
	if !ok || node.Name != c.node || c.writes.Own(node.Name, node.ResourceVersion) {
		return
	}
	c.mu.Lock()
	want := c.want
	c.mu.Unlock()
	if want != nil {
		if i := findEntry(node, c.driver); i >= 0 && sameEntry(node.Spec.Drivers[i], *want) {
			return
		}
	}
	c.queue.Q.Add(c.node)
}

func (c *csiNodeController) csiNodeDeleted(obj any) {
	obj = kube.Tombstoned(obj)
	if node, ok := obj.(*storagev1.CSINode); ok && node.Name == c.node {
		c.writes.Forget(c.node)
		c.queue.Q.Add(c.node)
	}
}

// driverChanged reads the period from the CSIDriver and tells the
// periodic loop when it changed.
func (c *csiNodeController) driverChanged(ctx context.Context) {
	var period time.Duration
	if d, err := c.driverLister.Get(c.driver); err == nil && d.Spec.NodeAllocatableUpdatePeriodSeconds != nil {
		period = time.Duration(*d.Spec.NodeAllocatableUpdatePeriodSeconds) * time.Second
	}
	c.mu.Lock()
	old := c.period
	c.period = period
	c.mu.Unlock()
	if old == period {
		return
	}
	klog.FromContext(ctx).V(2).Info("CSIDriver's node allocatable update period changed", "csiDriver", c.driver, "from", old, "to", period)
	select {
	case c.periodChanged <- struct{}{}:
	default:
	}
}

func (c *csiNodeController) currentPeriod() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.period
}

// periodic queues a sync every period, restarting the count when the
// period changes (as kubelet restarts its ticker).
func (c *csiNodeController) periodic(ctx context.Context) {
	var tick clock.Ticker
	var tickC <-chan time.Time
	reset := func() {
		if tick != nil {
			tick.Stop()
			tick, tickC = nil, nil
		}
		if p := c.currentPeriod(); p > 0 {
			tick = c.clock.NewTicker(p)
			tickC = tick.C()
		}
	}
	reset()
	defer func() {
		if tick != nil {
			tick.Stop()
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.periodChanged:
			reset()
		case <-tickC:
			c.queue.Q.Add(c.node)
		}
	}
}

// vaChanged queues a sync at once when an attach to this node newly failed
// with RESOURCE_EXHAUSTED, while the CSIDriver sets a period.
func (c *csiNodeController) vaChanged(ctx context.Context, oldObj, obj any) {
	va, ok := obj.(*storagev1.VolumeAttachment)
	if !ok || !c.exhausted(va) || c.currentPeriod() == 0 {
		return
	}
	if old, ok := oldObj.(*storagev1.VolumeAttachment); ok && c.exhausted(old) && sameError(old.Status.AttachError, va.Status.AttachError) {
		return // the same failure as before, seen again
	}
	klog.FromContext(ctx).V(2).Info("Attach failed with RESOURCE_EXHAUSTED; reading NodeGetInfo again", "volumeAttachment", klog.KObj(va))
	c.queue.Q.Add(c.node)
}

// exhausted tells whether va is this driver's attachment to this node and
// its attach failed with RESOURCE_EXHAUSTED.
func (c *csiNodeController) exhausted(va *storagev1.VolumeAttachment) bool {
	e := va.Status.AttachError
	return va.Spec.Attacher == c.driver && va.Spec.NodeName == c.node &&
		e != nil && e.ErrorCode != nil && *e.ErrorCode == int32(codes.ResourceExhausted)
}

func sameError(a, b *storagev1.VolumeError) bool {
	return a.Time.Equal(&b.Time) && a.Message == b.Message
}
