package kube

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
)

// PVFields says which parts of a PersistentVolume a consumer of the shared
// PersistentVolume cache reads. The cache keeps the union of what its
// consumers asked for and drops the rest: with thousands of volumes the PV
// cache is most of the sidecar's memory.
type PVFields uint

const (
	// PVAttach: finalizers, deletion state, access modes, volume mode,
	// mount options and the CSI source.
	PVAttach PVFields = 1 << iota
	// PVCapacity: the CSI source, storage class, capacity and node
	// affinity (which topology segment a volume uses).
	PVCapacity
	// PVResize: the CSI source, capacity, storage class, claim reference,
	// access modes, volume mode, mount options, node affinity, phase,
	// annotations and VolumeAttributesClass name.
	PVResize
)

// Informers builds each shared informer once per process and hands the same
// one to every controller that asks for it. Ask for every informer before
// Start; an informer asked for after Start is started by the next Start.
// The informers are made here rather than by a client-go
// SharedInformerFactory: the factory links an informer for every API type,
// a third of the binary.
type Informers struct {
	client Client
	resync time.Duration
	health *APIHealth

	mu       sync.Mutex
	pvFields PVFields
	frozen   bool // the PV transform's field set can no longer grow
	byName   map[string]*entry
	probing  bool // health.Run started
}

type entry struct {
	inf     cache.SharedIndexInformer
	started bool
}

// NewInformers returns an empty set of informers over client, with resync as
// every informer's resync period (zero: none).
func NewInformers(client Client, resync time.Duration) *Informers {
	return &Informers{client: client, resync: resync, byName: map[string]*entry{}, health: NewAPIHealth(client, nil, 0)}
}

// Client is the client the informers list and watch with.
func (f *Informers) Client() Client { return f.client }

// APIHealth is whether the API server answers, as every list and watch of
// the informers (and every request a controller reports to it) saw it.
// Start runs its probe. While it is down the informers wait for it
// instead of backing off further.
func (f *Informers) APIHealth() *APIHealth { return f.health }

// get returns the informer named name, making it with mk the first time.
func (f *Informers) get(name string, mk func() cache.SharedIndexInformer) cache.SharedIndexInformer {
	f.mu.Lock()
	defer f.mu.Unlock()
	if e, ok := f.byName[name]; ok {
		return e.inf
	}
	inf := mk()
	f.byName[name] = &entry{inf: inf}
	return inf
}

// VolumeAttachments is the informer over every VolumeAttachment.
func (f *Informers) VolumeAttachments() cache.SharedIndexInformer {
	st := f.client.StorageV1()
	return f.get("volumeattachments", func() cache.SharedIndexInformer {
		return f.newInformer(&storagev1.VolumeAttachment{}, StripForCache,
			func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				return st.VolumeAttachments().List(ctx, o)
			},
			func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
				return st.VolumeAttachments().Watch(ctx, o)
			})
	})
}

// PersistentVolumes is the informer over every PersistentVolume, keeping at
// least fields of each (and what other consumers asked for). It panics when
// fields asks for more than the cache keeps after Start: that is a wiring
// bug, and objects cached before would lack the fields.
func (f *Informers) PersistentVolumes(fields PVFields) cache.SharedIndexInformer {
	f.mu.Lock()
	if f.frozen && f.pvFields|fields != f.pvFields {
		f.mu.Unlock()
		panic(fmt.Sprintf("kube: PersistentVolume fields %b asked for after Start (cache keeps %b)", fields, f.pvFields))
	}
	f.pvFields |= fields
	f.mu.Unlock()
	core := f.client.CoreV1()
	return f.get("persistentvolumes", func() cache.SharedIndexInformer {
		return f.newInformer(&corev1.PersistentVolume{}, f.stripPV,
			func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				return core.PersistentVolumes().List(ctx, o)
			},
			func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
				return core.PersistentVolumes().Watch(ctx, o)
			})
	})
}

// CSINodes is the informer over every CSINode.
func (f *Informers) CSINodes() cache.SharedIndexInformer {
	st := f.client.StorageV1()
	return f.get("csinodes", func() cache.SharedIndexInformer {
		return f.newInformer(&storagev1.CSINode{}, StripForCache,
			func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				return st.CSINodes().List(ctx, o)
			},
			func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
				return st.CSINodes().Watch(ctx, o)
			})
	})
}

// Nodes is the informer over every Node, with only their metadata (name,
// UID, labels) cached: a Node's status (images, conditions) is many times
// the size of what the sidecar reads.
func (f *Informers) Nodes() cache.SharedIndexInformer {
	core := f.client.CoreV1()
	return f.get("nodes", func() cache.SharedIndexInformer {
		return f.newInformer(&corev1.Node{}, stripNode,
			func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				return core.Nodes().List(ctx, o)
			},
			func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
				return core.Nodes().Watch(ctx, o)
			})
	})
}

// StorageClasses is the informer over every StorageClass.
func (f *Informers) StorageClasses() cache.SharedIndexInformer {
	st := f.client.StorageV1()
	return f.get("storageclasses", func() cache.SharedIndexInformer {
		return f.newInformer(&storagev1.StorageClass{}, StripForCache,
			func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				return st.StorageClasses().List(ctx, o)
			},
			func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
				return st.StorageClasses().Watch(ctx, o)
			})
	})
}

// VolumeAttributesClasses is the informer over every VolumeAttributesClass
// (storage.k8s.io/v1).
func (f *Informers) VolumeAttributesClasses() cache.SharedIndexInformer {
	st := f.client.StorageV1()
	return f.get("volumeattributesclasses", func() cache.SharedIndexInformer {
		return f.newInformer(&storagev1.VolumeAttributesClass{}, StripForCache,
			func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				return st.VolumeAttributesClasses().List(ctx, o)
			},
			func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
				return st.VolumeAttributesClasses().Watch(ctx, o)
			})
	})
}

// PersistentVolumeClaims is the informer over the PersistentVolumeClaims of
// every namespace.
func (f *Informers) PersistentVolumeClaims() cache.SharedIndexInformer {
	core := f.client.CoreV1()
	return f.get("persistentvolumeclaims", func() cache.SharedIndexInformer {
		return f.newInformer(&corev1.PersistentVolumeClaim{}, StripForCache,
			func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				return core.PersistentVolumeClaims(metav1.NamespaceAll).List(ctx, o)
			},
			func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
				return core.PersistentVolumeClaims(metav1.NamespaceAll).Watch(ctx, o)
			})
	})
}

// CSIStorageCapacities is the informer over the CSIStorageCapacity objects
// in namespace that match selector (the capacity controller's own).
func (f *Informers) CSIStorageCapacities(namespace string, selector labels.Selector) cache.SharedIndexInformer {
	st := f.client.StorageV1()
	sel := selector.String()
	return f.get("csistoragecapacities/"+namespace+"/"+sel, func() cache.SharedIndexInformer {
		return f.newInformer(&storagev1.CSIStorageCapacity{}, StripForCache,
			func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				o.LabelSelector = sel
				return st.CSIStorageCapacities(namespace).List(ctx, o)
			},
			func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
				o.LabelSelector = sel
				return st.CSIStorageCapacities(namespace).Watch(ctx, o)
			})
	})
}

// newInformer is a shared informer over one resource, with streaming lists
// where the client supports them, and transform applied to every object
// before it is cached.
func (f *Informers) newInformer(example runtime.Object, transform cache.TransformFunc,
	list cache.ListWithContextFunc, watchFunc cache.WatchFuncWithContext) cache.SharedIndexInformer {
	// A reflector backs off (up to 30 s) after each failed list or watch;
	// after an outage it would wait that out before it saw anything. The
	// calls wait for the server instead, and report what they see.
	h := f.health
	waitList := func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
		if err := h.WaitUp(ctx); err != nil {
			return nil, err
		}
		obj, err := list(ctx, o)
		h.Observe(err)
		return obj, err
	}
	waitWatch := func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
		if err := h.WaitUp(ctx); err != nil {
			return nil, err
		}
		w, err := watchFunc(ctx, o)
		h.Observe(err)
		return w, err
	}
	lw := cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{ListWithContextFunc: waitList, WatchFuncWithContext: waitWatch}, f.client)
	inf := cache.NewSharedIndexInformerWithOptions(lw, example, cache.SharedIndexInformerOptions{ResyncPeriod: f.resync, Indexers: cache.Indexers{}})
	_ = inf.SetTransform(transform) // fails only once the informer runs
	return inf
}

// Start runs every informer made so far that is not running yet, until ctx
// ends. Start may be called again for informers made later; each runs once.
// It returns at once; WaitForCacheSync waits for the caches.
func (f *Informers) Start(ctx context.Context) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.frozen = true
	if !f.probing {
		f.probing = true
		go f.health.Run(ctx)
	}
	for _, e := range f.byName {
		if !e.started {
			e.started = true
			go e.inf.RunWithContext(ctx)
		}
	}
}

// WaitForCacheSync waits until every informer made so far has synced, or
// ctx ends (false).
func (f *Informers) WaitForCacheSync(ctx context.Context) bool {
	f.mu.Lock()
	var synced []cache.InformerSynced
	for _, e := range f.byName {
		synced = append(synced, e.inf.HasSynced)
	}
	f.mu.Unlock()
	return cache.WaitForNamedCacheSyncWithContext(ctx, synced...)
}

func (f *Informers) stripPV(obj any) (any, error) {
	f.mu.Lock()
	fields := f.pvFields
	f.mu.Unlock()
	return StripPV(obj, fields)
}

// UnscheduledPods is the informer over the Pods of every namespace that no
// node was chosen for yet (spec.nodeName empty: a field selector the API
// server serves from its index), each keeping only what explains why it
// waits (volumes, tolerations, its PodScheduled condition). On a healthy
// cluster it holds a handful of Pods at most, whatever the cluster's size.
func (f *Informers) UnscheduledPods() cache.SharedIndexInformer {
	core := f.client.CoreV1()
	const unscheduled = "spec.nodeName="
	return f.get("pods/unscheduled", func() cache.SharedIndexInformer {
		return f.newInformer(&corev1.Pod{}, stripUnscheduledPod,
			func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				o.FieldSelector = unscheduled
				return core.Pods(metav1.NamespaceAll).List(ctx, o)
			},
			func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
				o.FieldSelector = unscheduled
				return core.Pods(metav1.NamespaceAll).Watch(ctx, o)
			})
	})
}
