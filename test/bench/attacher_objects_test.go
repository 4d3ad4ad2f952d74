package bench

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sync"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// vaWatch records, from a watch of one run's VolumeAttachments, when each
// was first seen attached, whether it showed an attachError, and when it
// was gone.
type vaWatch struct {
	mu       sync.Mutex
	attached map[string]time.Time
	claimed  map[string]time.Time // first seen with a finalizer: the attacher has started on it
	errored  map[string]bool
	gone     map[string]time.Time
	stopCh   chan struct{}
	stopOnce sync.Once
}

func watchVAs(b *testing.B, client kubernetes.Interface, id string) *vaWatch {
	w := &vaWatch{attached: map[string]time.Time{}, claimed: map[string]time.Time{}, errored: map[string]bool{}, gone: map[string]time.Time{}, stopCh: make(chan struct{})}
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.LabelSelector = benchLabel + "=" + id
	}))
	inf := factory.Storage().V1().VolumeAttachments().Informer()
	seen := func(obj any) {
		va, ok := obj.(*storagev1.VolumeAttachment)
		if !ok {
			return
		}
		now := time.Now()
		w.mu.Lock()
		defer w.mu.Unlock()
		if _, ok := w.claimed[va.Name]; !ok && len(va.Finalizers) > 0 {
			w.claimed[va.Name] = now
		}
		if va.Status.Attached {
			if _, ok := w.attached[va.Name]; !ok {
				w.attached[va.Name] = now
			}
		}
		if va.Status.AttachError != nil {
			w.errored[va.Name] = true
		}
	}
	_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    seen,
		UpdateFunc: func(_, obj any) { seen(obj) },
		DeleteFunc: func(obj any) {
			if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = tomb.Obj
			}
			if va, ok := obj.(*storagev1.VolumeAttachment); ok {
				now := time.Now()
				w.mu.Lock()
				w.gone[va.Name] = now
				w.mu.Unlock()
			}
		},
	})
	if err != nil {
		b.Fatal(err)
	}
	factory.Start(w.stopCh)
	b.Cleanup(w.stop)
	if !cache.WaitForCacheSync(w.stopCh, inf.HasSynced) {
		b.Fatal("the VolumeAttachment watch did not sync")
	}
	return w
}

func (w *vaWatch) stop() { w.stopOnce.Do(func() { close(w.stopCh) }) }

func (w *vaWatch) count(m map[string]time.Time, names []string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, name := range names {
		if _, ok := m[name]; ok {
			n++
		}
	}
	return n
}

func (w *vaWatch) countAttached(names []string) int { return w.count(w.attached, names) }
func (w *vaWatch) countGone(names []string) int     { return w.count(w.gone, names) }

func (w *vaWatch) countErrors(names []string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, name := range names {
		if w.errored[name] {
			n++
		}
	}
	return n
}

// waitFor polls until all names are in m or timeout passes. The times are
// those the watch recorded, so the polling period does not enter them.
func (w *vaWatch) waitFor(m map[string]time.Time, names []string, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for w.count(m, names) < len(names) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

func (w *vaWatch) waitAttached(names []string, timeout time.Duration) bool {
	return w.waitFor(w.attached, names, timeout)
}

func (w *vaWatch) waitGone(names []string, timeout time.Duration) bool {
	return w.waitFor(w.gone, names, timeout)
}

// times returns, for each of names, when the watch first saw it with a
// finalizer and when it first saw it attached (zero when never).
func (w *vaWatch) times(names []string) (claimed, attached []time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	claimed, attached = make([]time.Time, len(names)), make([]time.Time, len(names))
	for i, name := range names {
		claimed[i], attached[i] = w.claimed[name], w.attached[name]
	}
	return claimed, attached
}

func (w *vaWatch) lastGone(names []string) time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	var last time.Time
	for _, name := range names {
		if t := w.gone[name]; t.After(last) {
			last = t
		}
	}
	return last
}

// deleteRunObjects removes every VolumeAttachment, PersistentVolume and
// CSINode of run id, finalizers first (the attacher's, and the API
// server's kubernetes.io/pv-protection, whose controller does not run
// here), and waits until they are gone, so the next configuration starts
// from an empty cluster: each attacher caches every PV and VA, and leftovers
// would cost it memory and time.
func deleteRunObjects(tb testing.TB, client kubernetes.Interface, id string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	sel := metav1.ListOptions{LabelSelector: benchLabel + "=" + id}
	noFinalizers := []byte(`{"metadata":{"finalizers":null}}`)
	ignoreNotFound := func(err error) error {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	}
	vas, err := client.StorageV1().VolumeAttachments().List(ctx, sel)
	if err != nil {
		tb.Errorf("cleanup: list VolumeAttachments: %v", err)
		return
	}
	err = parallel(ctx, len(vas.Items), clientWorkers, func(ctx context.Context, i int) error {
		name := vas.Items[i].Name
		if len(vas.Items[i].Finalizers) > 0 {
			if _, err := client.StorageV1().VolumeAttachments().Patch(ctx, name, types.MergePatchType, noFinalizers, metav1.PatchOptions{}); ignoreNotFound(err) != nil {
				return err
			}
		}
		return ignoreNotFound(client.StorageV1().VolumeAttachments().Delete(ctx, name, metav1.DeleteOptions{}))
	})
	if err != nil {
		tb.Errorf("cleanup: VolumeAttachments: %v", err)
	}
	pvs, err := client.CoreV1().PersistentVolumes().List(ctx, sel)
	if err != nil {
		tb.Errorf("cleanup: list PersistentVolumes: %v", err)
		return
	}
	err = parallel(ctx, len(pvs.Items), clientWorkers, func(ctx context.Context, i int) error {
		name := pvs.Items[i].Name
		if _, err := client.CoreV1().PersistentVolumes().Patch(ctx, name, types.MergePatchType, noFinalizers, metav1.PatchOptions{}); ignoreNotFound(err) != nil {
			return err
		}
		return ignoreNotFound(client.CoreV1().PersistentVolumes().Delete(ctx, name, metav1.DeleteOptions{}))
	})
	if err != nil {
		tb.Errorf("cleanup: PersistentVolumes: %v", err)
	}
	if err := client.StorageV1().CSINodes().DeleteCollection(ctx, metav1.DeleteOptions{}, sel); err != nil {
		tb.Errorf("cleanup: CSINodes: %v", err)
	}
	for {
		vas, err1 := client.StorageV1().VolumeAttachments().List(ctx, sel)
		pvs, err2 := client.CoreV1().PersistentVolumes().List(ctx, sel)
		nodes, err3 := client.StorageV1().CSINodes().List(ctx, sel)
		if err1 == nil && err2 == nil && err3 == nil && len(vas.Items)+len(pvs.Items)+len(nodes.Items) == 0 {
			return
		}
		if ctx.Err() != nil {
			tb.Errorf("cleanup: objects of run %s still there after 5 minutes", id)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// vaName is the name the attach/detach controller gives the
// VolumeAttachment of handle on node.
func vaName(handle, node string) string {
	return fmt.Sprintf("csi-%x", sha256.Sum256([]byte(handle+benchDriver+node)))
}

func shortID() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// parallel runs f(0..n-1) with at most limit at once and returns the first
// error.
func parallel(ctx context.Context, n, limit int, f func(ctx context.Context, i int) error) error {
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(limit)
	for i := range n {
		g.Go(func() error { return f(ctx, i) })
	}
	return g.Wait()
}
