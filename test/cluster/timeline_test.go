package cluster

import (
	"context"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/loopvol/loopvol/internal/harness/cluster"
)

// timeline records, from watch events as they arrive, when each claim of
// a namespace was Bound (and to which PV), when each PV's
// VolumeAttachment turned attached and when each pod turned Running.
type timeline struct {
	mu       sync.Mutex
	bound    map[string]time.Time // claim
	volume   map[string]string    // claim → PV
	attached map[string]time.Time // PV
	running  map[string]time.Time // pod
	opened   chan struct{}        // one value per watch when it first opens
}

// watchTimeline starts the watches and returns once all three are open;
// they end with ctx.
func watchTimeline(ctx context.Context, c *cluster.Cluster, ns string) *timeline {
	tl := &timeline{opened: make(chan struct{}, 3), bound: map[string]time.Time{}, volume: map[string]string{}, attached: map[string]time.Time{}, running: map[string]time.Time{}}
	core := c.Client.CoreV1()
	go tl.watch(ctx, func(ctx context.Context) (watch.Interface, error) {
		return core.PersistentVolumeClaims(ns).Watch(ctx, metav1.ListOptions{})
	}, func(obj any, now time.Time) {
		if pvc, ok := obj.(*corev1.PersistentVolumeClaim); ok && pvc.Status.Phase == corev1.ClaimBound {
			if _, seen := tl.bound[pvc.Name]; !seen {
				tl.bound[pvc.Name] = now
				tl.volume[pvc.Name] = pvc.Spec.VolumeName
			}
		}
	})
	go tl.watch(ctx, func(ctx context.Context) (watch.Interface, error) {
		return c.Client.StorageV1().VolumeAttachments().Watch(ctx, metav1.ListOptions{})
	}, func(obj any, now time.Time) {
		if va, ok := obj.(*storagev1.VolumeAttachment); ok && va.Status.Attached && va.Spec.Source.PersistentVolumeName != nil {
			if _, seen := tl.attached[*va.Spec.Source.PersistentVolumeName]; !seen {
				tl.attached[*va.Spec.Source.PersistentVolumeName] = now
			}
		}
	})
	go tl.watch(ctx, func(ctx context.Context) (watch.Interface, error) {
		return core.Pods(ns).Watch(ctx, metav1.ListOptions{})
	}, func(obj any, now time.Time) {
		if p, ok := obj.(*corev1.Pod); ok && p.Status.Phase == corev1.PodRunning {
			if _, seen := tl.running[p.Name]; !seen {
				tl.running[p.Name] = now
			}
		}
	})
	for range 3 {
		select {
		case <-tl.opened:
		case <-ctx.Done():
		}
	}
	return tl
}

// watch runs w until ctx ends, starting it again when the server closes it.
func (tl *timeline) watch(ctx context.Context, start func(context.Context) (watch.Interface, error), record func(obj any, now time.Time)) {
	first := true
	for ctx.Err() == nil {
		w, err := start(ctx)
		if err != nil {
			select {
			case <-ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		if first {
			tl.opened <- struct{}{}
			first = false
		}
		for ev := range w.ResultChan() {
			now := time.Now()
			tl.mu.Lock()
			record(ev.Object, now)
			tl.mu.Unlock()
		}
		w.Stop()
	}
}

// phases is one pod's way from its claim's creation to Running.
type phases struct {
	provision, attach, stagePublish, total time.Duration
	complete                               bool
}

// of returns the phases of the pod whose claim is claim, all counted from
// start.
func (tl *timeline) of(start time.Time, claim, pod string) phases {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	b, okB := tl.bound[claim]
	a, okA := tl.attached[tl.volume[claim]]
	r, okR := tl.running[pod]
	return phases{
		provision:    b.Sub(start),
		attach:       a.Sub(b),
		stagePublish: r.Sub(a),
		total:        r.Sub(start),
		complete:     okB && okA && okR,
	}
}
