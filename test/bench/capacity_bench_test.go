package bench

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/loopvol/loopvol/test/internal/attacherproc"
	"github.com/loopvol/loopvol/test/internal/extprovisioner"
)

const (
	capZoneKey = "topology.loopvol.csi.io/zone"
	// provisionerVersion is the external-provisioner the capacity goals
	// compare with.
	provisionerVersion = "v6.4.0"
	capDriverLabel     = "csi.storage.k8s.io/drivername"
	// capVolume is the size of each volume an event makes or deletes.
	capVolume = gib
)

// capacityKnobs are the environment settings of BenchmarkCapacity.
type capacityKnobs struct {
	nodes, classes           int
	oursEvents, upEvents     int
	oursSpacing, upSpacing   time.Duration
	steady                   time.Duration
	upstream                 bool
	upstreamBinary           string
	publishTimeout, upSettle time.Duration
}

func loadCapacityKnobs(tb testing.TB) capacityKnobs {
	tb.Helper()
	k := capacityKnobs{
		nodes: 100, classes: 3, oursEvents: 30, upEvents: 10,
		oursSpacing: time.Second, upSpacing: 6 * time.Second, steady: time.Minute,
		upstream: true, publishTimeout: 8 * time.Minute, upSettle: 3 * time.Minute,
	}
	for name, into := range map[string]*int{
		"LOOPVOL_BENCH_CAPACITY_NODES": &k.nodes, "LOOPVOL_BENCH_CAPACITY_CLASSES": &k.classes,
		"LOOPVOL_BENCH_CAPACITY_EVENTS": &k.oursEvents, "LOOPVOL_BENCH_CAPACITY_UPSTREAM_EVENTS": &k.upEvents,
	} {
		if v := os.Getenv(name); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				tb.Fatalf("%s=%q: want a positive integer", name, v)
			}
			*into = n
		}
	}
	if v := os.Getenv("LOOPVOL_BENCH_CAPACITY_STEADY"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			tb.Fatalf("LOOPVOL_BENCH_CAPACITY_STEADY=%q: want a duration such as 1m", v)
		}
		k.steady = d
	}
	if v := os.Getenv("LOOPVOL_BENCH_UPSTREAM"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			tb.Fatalf("LOOPVOL_BENCH_UPSTREAM=%q: want 0 or 1", v)
		}
		k.upstream = b
	}
	k.upstreamBinary = os.Getenv("LOOPVOL_BENCH_EXTERNAL_PROVISIONER")
	if 2*(k.oursEvents/2+k.upEvents/2)+2 > k.nodes {
		tb.Fatalf("%d nodes are too few for %d + %d events (each event needs a zone of its own)", k.nodes, k.oursEvents, k.upEvents)
	}
	return k
}

// capKey is one CSIStorageCapacity the benchmark expects: its namespace
// (which controller), class and zone.
type capKey struct{ ns, class, zone string }

// expectation waits for one object to show one capacity.
type expectation struct {
	value int64
	since time.Time
	seen  time.Time
	done  chan struct{}
}

// capWatch follows every CSIStorageCapacity of the driver and resolves
// expectations when an object first shows the expected capacity after the
// expectation was made. It also counts the object changes per namespace.
type capWatch struct {
	mu      sync.Mutex
	pending map[capKey][]*expectation
	changes map[string]*atomic.Int64 // namespace → adds, updates, deletes seen
}

func watchCapacities(b *testing.B, client kubernetes.Interface, namespaces ...string) *capWatch {
	w := &capWatch{pending: map[capKey][]*expectation{}, changes: map[string]*atomic.Int64{}}
	for _, ns := range namespaces {
		w.changes[ns] = &atomic.Int64{}
	}
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = capDriverLabel + "=" + benchDriver
			return client.StorageV1().CSIStorageCapacities("").List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = capDriverLabel + "=" + benchDriver
			return client.StorageV1().CSIStorageCapacities("").Watch(ctx, o)
		},
	}
	inf := cache.NewSharedIndexInformer(lw, &storagev1.CSIStorageCapacity{}, 0, cache.Indexers{})
	seen := func(obj any) {
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		o, ok := obj.(*storagev1.CSIStorageCapacity)
		if !ok {
			return
		}
		if c := w.changes[o.Namespace]; c != nil {
			c.Add(1)
		}
		if o.Capacity == nil || o.NodeTopology == nil {
			return
		}
		now := time.Now()
		k := capKey{ns: o.Namespace, class: o.StorageClassName, zone: o.NodeTopology.MatchLabels[capZoneKey]}
		w.mu.Lock()
		defer w.mu.Unlock()
		list := w.pending[k]
		for i := 0; i < len(list); {
			if e := list[i]; e.value == o.Capacity.Value() {
				e.seen = now
				close(e.done)
				list = slices.Delete(list, i, i+1)
				continue
			}
			i++
		}
		w.pending[k] = list
	}
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    seen,
		UpdateFunc: func(_, obj any) { seen(obj) },
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if o, ok := obj.(*storagev1.CSIStorageCapacity); ok {
				if c := w.changes[o.Namespace]; c != nil {
					c.Add(1)
				}
			}
		},
	})
	stop := make(chan struct{})
	b.Cleanup(func() { close(stop) })
	go inf.Run(stop)
	if !cache.WaitForCacheSync(b.Context().Done(), inf.HasSynced) {
		b.Fatal("the CSIStorageCapacity watch did not sync")
	}
	return w
}

// expect registers that k should show value from now on.
func (w *capWatch) expect(k capKey, value int64) *expectation {
	e := &expectation{value: value, since: time.Now(), done: make(chan struct{})}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.pending[k] = append(w.pending[k], e)
	return e
}

// waitAll waits for every expectation until deadline and returns how long
// each took (those not met are left out) and how many were not met.
func waitAll(ctx context.Context, es []*expectation, deadline time.Time) (took []time.Duration, missed int) {
	for _, e := range es {
		select {
		case <-e.done:
			took = append(took, e.seen.Sub(e.since))
		case <-time.After(time.Until(deadline)):
			missed++
		case <-ctx.Done():
			missed++
		}
	}
	return took, missed
}

func (w *capWatch) changesIn(ns string) int64 { return w.changes[ns].Load() }

// capacityController is one of the two controllers under test.
type capacityController struct {
	name string
	ns   string
	stub *capacityStub
	proc *sidecar

	publishAll   time.Duration // process start → every object right
	publishMiss  int
	publishCalls int64 // GetCapacity calls until then
	publishWrite int64 // object changes until then
	staleness    stats
	staleSamples int
	staleMissed  int
	steadyWrites float64 // object changes per minute in the steady window
	steadyCalls  float64 // GetCapacity calls per minute in the steady window
	mem          memory
	cpu          time.Duration
}

// BenchmarkCapacity measures the CSIStorageCapacity controllers side by
// side against one API server: loopvol's (`--controllers=capacity`) and the
// one of external-provisioner v6.4.0 (`--enable-capacity`, built from the
// module proxy into the cache), both at their default flags (owner level -1:
// the benchmark has no Pod), each with a stub CSI controller of its own
// (same driver name, same zone figures) and its own namespace. 100 nodes,
// each its own zone (local pools), and 3 WaitForFirstConsumer classes make
// 300 objects per controller.
//
//  1. publish: both start at once; time until every object exists with the
//     stub's figure.
//  2. loopvol staleness: events 1 s apart, each a volume made (the stub's
//     figure of a zone drops, then its PersistentVolume is created with that
//     zone's node affinity) or deleted (figure back up, PV deleted) in a zone
//     of its own; staleness is PV request → the watch sees each of the zone's
//     3 objects with the new figure. (External-provisioner is still
//     publishing meanwhile.)
//  3. steady state: once both have published, a window with no change:
//     object writes (API server counter and watch) and GetCapacity calls per
//     minute.
//  4. external-provisioner staleness: events 6 s apart over a minute (its
//     poll interval), in zones of their own, on its stub.
//
// It prints a markdown report for docs/benchmarks.md.
//
// Knobs (environment):
//
//	LOOPVOL_BENCH_CAPACITY_NODES=100            nodes, each its own zone
//	LOOPVOL_BENCH_CAPACITY_CLASSES=3            StorageClasses
//	LOOPVOL_BENCH_CAPACITY_EVENTS=30            volume events for loopvol
//	LOOPVOL_BENCH_CAPACITY_UPSTREAM_EVENTS=10   volume events for external-provisioner
//	LOOPVOL_BENCH_CAPACITY_STEADY=1m            steady-state window
//	LOOPVOL_BENCH_UPSTREAM=0                    loopvol alone
//	LOOPVOL_BENCH_EXTERNAL_PROVISIONER=<path>   use this csi-provisioner instead of building it
func BenchmarkCapacity(b *testing.B) {
	k := loadCapacityKnobs(b)
	env := cluster.Env(b)
	kubeconfig := env.Kubeconfig(b)
	fast := rest.CopyConfig(env.Config)
	fast.QPS = -1
	fast.ContentType = runtime.ContentTypeProtobuf
	client, err := kubernetes.NewForConfig(fast)
	if err != nil {
		b.Fatal(err)
	}
	ctx := b.Context()
	version := "unknown"
	if v, err := env.Client.Discovery().ServerVersion(); err == nil {
		version = v.GitVersion
	}
	ours := attacherproc.Binary(b)
	upstream := ""
	if k.upstream {
		upstream = k.upstreamBinary
		if upstream == "" {
			bctx, cancel := context.WithTimeout(ctx, 30*time.Minute)
			upstream, err = extprovisioner.Build(bctx, provisionerVersion, os.Stdout)
			cancel()
			if err != nil {
				fmt.Printf("external-provisioner %s could not be built, so loopvol's capacity controller runs alone: %v\n", provisionerVersion, err)
				upstream = ""
			}
		}
	}

	id := shortID()
	labels := map[string]string{benchLabel: id}
	b.Cleanup(func() { deleteCapacityObjects(b, client, id) })
	zones := make([]string, k.nodes)
	free := map[string]int64{}
	for i := range zones {
		zones[i] = fmt.Sprintf("zone-%s-%03d", id, i)
		free[zones[i]] = 500*gib + int64(i)*mib
	}
	err = parallel(ctx, k.nodes, clientWorkers, func(ctx context.Context, i int) error {
		name := fmt.Sprintf("bench-%s-node-%03d", id, i)
		nl := map[string]string{benchLabel: id, capZoneKey: zones[i]}
		if _, err := client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: nl}}, metav1.CreateOptions{}); err != nil {
			return err
		}
		_, err := client.StorageV1().CSINodes().Create(ctx, &storagev1.CSINode{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
			Spec:       storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{{Name: benchDriver, NodeID: name, TopologyKeys: []string{capZoneKey}}}},
		}, metav1.CreateOptions{})
		return err
	})
	if err != nil {
		b.Fatalf("create nodes: %v", err)
	}
	classes := make([]string, k.classes)
	for i := range classes {
		classes[i] = fmt.Sprintf("bench-%s-class-%d", id, i)
		_, err := client.StorageV1().StorageClasses().Create(ctx, &storagev1.StorageClass{
			ObjectMeta:        metav1.ObjectMeta{Name: classes[i], Labels: labels},
			Provisioner:       benchDriver,
			VolumeBindingMode: ptr.To(storagev1.VolumeBindingWaitForFirstConsumer),
		}, metav1.CreateOptions{})
		if err != nil {
			b.Fatal(err)
		}
	}

	// Zones of the events: loopvol's first, then external-provisioner's.
	// Half of each controller's events delete a volume that exists from
	// the start (its zone's figure already lower).
	oursZones, upZones := zones[:k.oursEvents], zones[k.oursEvents:k.oursEvents+k.upEvents]
	var preexisting []string // PV names
	pvName := func(zone string) string { return "bench-pv-" + zone }
	for _, set := range [][]string{oursZones, upZones} {
		for _, z := range set[len(set)/2:] {
			free[z] -= capVolume
			if err := createCapacityPV(ctx, client, pvName(z), classes[0], z, labels); err != nil {
				b.Fatal(err)
			}
			preexisting = append(preexisting, pvName(z))
		}
	}

	ctrls := []*capacityController{{name: "loopvol"}}
	if upstream != "" {
		ctrls = append(ctrls, &capacityController{name: "external-provisioner " + provisionerVersion})
	}
	var nss []string
	for _, c := range ctrls {
		c.ns = env.Namespace(b)
		nss = append(nss, c.ns)
		c.stub = startCapacityStub(b, benchDriver, cloneFree(free))
	}
	w := watchCapacities(b, client, nss...)

	// 1. Publish.
	var publish [][]*expectation
	for _, c := range ctrls {
		var es []*expectation
		for _, class := range classes {
			for _, z := range zones {
				es = append(es, w.expect(capKey{ns: c.ns, class: class, zone: z}, free[z]))
			}
		}
		publish = append(publish, es)
	}
	dir := b.TempDir()
	starts := make([]time.Time, len(ctrls))
	for i, c := range ctrls {
		// The process inherits NAMESPACE at its start.
		b.Setenv("NAMESPACE", c.ns)
		starts[i] = time.Now()
		if i == 0 {
			c.proc = startSidecar(b, dir, "loopvol", ours, "--controllers=capacity", "--kubeconfig="+kubeconfig,
				"--csi-address="+c.stub.Socket, "--capacity-ownerref-level=-1", "--v=2")
		} else {
			c.proc = startSidecar(b, dir, "external-provisioner", upstream, "--kubeconfig="+kubeconfig,
				"--csi-address="+c.stub.Socket, "--enable-capacity", "--capacity-ownerref-level=-1", "--v=2")
		}
	}
	publishDone := make([]chan struct{}, len(ctrls))
	for i, c := range ctrls {
		publishDone[i] = make(chan struct{})
		go func() {
			defer close(publishDone[i])
			took, missed := waitAll(ctx, publish[i], starts[i].Add(k.publishTimeout))
			c.publishMiss = missed
			for _, e := range publish[i] {
				select {
				case <-e.done:
					c.publishAll = max(c.publishAll, e.seen.Sub(starts[i]))
				default:
				}
			}
			_ = took
			c.publishCalls = c.stub.calls.Load()
			c.publishWrite = w.changesIn(c.ns)
		}()
	}

	// 2. loopvol's staleness, as soon as it has published.
	<-publishDone[0]
	events := func(c *capacityController, set []string, spacing time.Duration) []*expectation {
		var es []*expectation
		half := len(set) / 2
		for i, z := range set {
			if i > 0 {
				time.Sleep(spacing)
			}
			delta := int64(-capVolume)
			if i >= half {
				delta = capVolume
			}
			value := c.stub.add(z, delta)
			for _, class := range classes {
				es = append(es, w.expect(capKey{ns: c.ns, class: class, zone: z}, value))
			}
			var err error
			if i < half {
				err = createCapacityPV(ctx, client, pvName(z), classes[0], z, labels)
			} else {
				err = deleteCapacityPV(ctx, client, pvName(z))
			}
			if err != nil {
				b.Fatal(err)
			}
		}
		return es
	}
	if ctrls[0].publishMiss == 0 {
		es := events(ctrls[0], oursZones, k.oursSpacing)
		took, missed := waitAll(ctx, es, time.Now().Add(time.Minute))
		ctrls[0].staleMissed, ctrls[0].staleSamples = missed, len(took)
		if len(took) > 0 {
			ctrls[0].staleness = summarize(took)
		}
	}
	for i := range ctrls {
		<-publishDone[i]
	}

	// 3. Steady state, both at once.
	before, err := scrapeAPIServer(ctx, client)
	if err != nil {
		b.Fatal(err)
	}
	calls0, changes0 := make([]int64, len(ctrls)), make([]int64, len(ctrls))
	for i, c := range ctrls {
		calls0[i], changes0[i] = c.stub.calls.Load(), w.changesIn(c.ns)
	}
	time.Sleep(k.steady)
	after, err := scrapeAPIServer(ctx, client)
	if err != nil {
		b.Fatal(err)
	}
	steadyAPI := after.writes.since(before.writes).total("csistoragecapacities") / k.steady.Minutes()
	for i, c := range ctrls {
		c.steadyCalls = float64(c.stub.calls.Load()-calls0[i]) / k.steady.Minutes()
		c.steadyWrites = float64(w.changesIn(c.ns)-changes0[i]) / k.steady.Minutes()
	}

	// 4. external-provisioner's staleness.
	if len(ctrls) > 1 && ctrls[1].publishMiss == 0 {
		es := events(ctrls[1], upZones, k.upSpacing)
		took, missed := waitAll(ctx, es, time.Now().Add(k.upSettle))
		ctrls[1].staleMissed, ctrls[1].staleSamples = missed, len(took)
		if len(took) > 0 {
			ctrls[1].staleness = summarize(took)
		}
	}
	for _, c := range ctrls {
		if m, err := c.proc.memory(); err == nil {
			c.mem = m
		}
		if t, err := c.proc.cpuTime(); err == nil {
			c.cpu = t
		}
	}
	printCapacityReport(k, version, len(classes)*len(zones), steadyAPI, ctrls)
	for _, c := range ctrls {
		if c.name == "loopvol" {
			b.ReportMetric(c.publishAll.Seconds(), "publish-s")
			b.ReportMetric(float64(c.staleness.median.Milliseconds()), "stale-median-ms")
			b.ReportMetric(float64(c.staleness.p99.Milliseconds()), "stale-p99-ms")
			b.ReportMetric(c.steadyWrites, "steady-writes/min")
			b.ReportMetric(float64(c.mem.peakRSS)/1e6, "peak-RSS-MB")
		}
	}
}

func cloneFree(m map[string]int64) map[string]int64 {
	out := make(map[string]int64, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// createCapacityPV creates a PersistentVolume of the driver in zone, as the
// provisioner would after CreateVolume (Retain, so no provisioner acts on
// it).
func createCapacityPV(ctx context.Context, client kubernetes.Interface, name, class, zone string, labels map[string]string) error {
	_, err := client.CoreV1().PersistentVolumes().Create(ctx, &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: *resource.NewQuantity(capVolume, resource.BinarySI)},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			StorageClassName:              class,
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: benchDriver, VolumeHandle: name,
			}},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: capZoneKey, Operator: corev1.NodeSelectorOpIn, Values: []string{zone}}},
			}}}},
		},
	}, metav1.CreateOptions{})
	return err
}

// deleteCapacityPV deletes a PersistentVolume, with the pv-protection
// finalizer whose controller does not run here.
func deleteCapacityPV(ctx context.Context, client kubernetes.Interface, name string) error {
	if _, err := client.CoreV1().PersistentVolumes().Patch(ctx, name, types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{}); err != nil {
		return err
	}
	return client.CoreV1().PersistentVolumes().Delete(ctx, name, metav1.DeleteOptions{})
}

// deleteCapacityObjects removes the run's Nodes, StorageClasses, and (as
// deleteRunObjects) its PVs and CSINodes. The objects of the controllers
// stay in their namespaces, which nothing watches afterwards.
func deleteCapacityObjects(tb testing.TB, client kubernetes.Interface, id string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sel := metav1.ListOptions{LabelSelector: benchLabel + "=" + id}
	if err := client.CoreV1().Nodes().DeleteCollection(ctx, metav1.DeleteOptions{}, sel); err != nil {
		tb.Errorf("cleanup: Nodes: %v", err)
	}
	if err := client.StorageV1().StorageClasses().DeleteCollection(ctx, metav1.DeleteOptions{}, sel); err != nil {
		tb.Errorf("cleanup: StorageClasses: %v", err)
	}
	deleteRunObjects(tb, client, id)
}

// printCapacityReport prints the figures as markdown.
func printCapacityReport(k capacityKnobs, version string, objects int, steadyAPI float64, ctrls []*capacityController) {
	fmt.Printf("\n## capacity: CSIStorageCapacity controllers, kube-apiserver %s, %d nodes (one zone each) × %d classes = %d objects each, default flags\n\n",
		version, k.nodes, k.classes, objects)
	fmt.Println("| controller | all published | × slower than loopvol | writes to publish | GetCapacity to publish | staleness median | p99 | max | samples (missed) | writes/min steady | GetCapacity/min steady | peak RSS | CPU |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	for _, c := range ctrls {
		pub := fmt.Sprintf("%.1f s", c.publishAll.Seconds())
		if c.publishMiss > 0 {
			pub = fmt.Sprintf("%d of %d missing after %s", c.publishMiss, objects, k.publishTimeout)
		}
		ratio := "—"
		if c != ctrls[0] && ctrls[0].publishAll > 0 && c.publishMiss == 0 {
			ratio = fmt.Sprintf("%.1f×", c.publishAll.Seconds()/ctrls[0].publishAll.Seconds())
		}
		stale := "—"
		p99, mx := "—", "—"
		if c.staleSamples > 0 {
			stale, p99, mx = short(c.staleness.median), short(c.staleness.p99), short(c.staleness.max)
		}
		fmt.Printf("| %s | %s | %s | %d | %d | %s | %s | %s | %d (%d) | %.1f | %.0f | %.0f MB | %.1f s |\n",
			c.name, pub, ratio, c.publishWrite, c.publishCalls, stale, p99, mx, c.staleSamples, c.staleMissed,
			c.steadyWrites, c.steadyCalls, float64(c.mem.peakRSS)/1e6, c.cpu.Seconds())
	}
	fmt.Printf("\nSteady window %s with both running and nothing changing: the API server served %.1f CSIStorageCapacity writes/min (apiserver_request_total, all verbs that write).\n", k.steady, steadyAPI)
	fmt.Printf("Staleness: each event makes or deletes one volume in a zone of its own (the stub's figure changes, then the PersistentVolume with the zone's node affinity is created or deleted); a sample is one of the zone's %d objects, from the PV request to the watch seeing the new figure. loopvol: %d events %s apart; external-provisioner: %d events %s apart over its 1-minute poll.\n",
		k.classes, k.oursEvents, k.oursSpacing, k.upEvents, k.upSpacing)
	fmt.Println("Writes to publish are the object changes the watch saw until all were published; GetCapacity calls are counted by each controller's stub.")
}
