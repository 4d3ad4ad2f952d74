package cluster

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/loopvol/loopvol/internal/harness/cluster"
)

// bulkSize is how many claims testBulkProvisioning applies at once: the
// figure published for a local hostpath provisioner (openebs
// dynamic-localpv-provisioner issue 4050) is for 200.
const bulkSize = 200

// provisionerMetrics is csi-provisioner's metrics endpoint: the controller
// pod shares the node's network (overlays/local, --http-endpoint=:9810).
const provisionerMetrics = "http://127.0.0.1:9810/metrics"

// testBulkProvisioning: 200 claims of 16 MiB of an Immediate class created
// at once all turn Bound. Each claim's way is taken apart from watch
// events into the three parties it passes: kube-controller-manager's PV
// controller hands the claim to the provisioner (the
// volume.kubernetes.io/storage-provisioner annotation), csi-provisioner
// calls CreateVolume and creates the PV, the PV controller binds both. The
// provisioner's own histogram gives CreateVolume's share; the slowest
// party is the bottleneck, printed as such.
func testBulkProvisioning(t *testing.T, c *cluster.Cluster) {
	ctx := context.Background()
	ns := namespace(t, c, "bulk")
	class := immediateClass(ctx, t, c)

	wctx, stop := context.WithCancel(ctx)
	defer stop()
	bt := watchBulk(wctx, c, ns)
	before, err := createVolumeSeconds(ctx)
	if err != nil {
		t.Fatal(err)
	}

	// A client of its own, unthrottled: the creates must not be what is
	// measured.
	rc := *c.Rest
	rc.QPS, rc.Burst = 5000, 5000
	client, err := kubernetes.NewForConfig(&rc)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, bulkSize)
	for i := range bulkSize {
		wg.Go(func() {
			name := fmt.Sprintf("b%03d", i)
			if _, err := client.CoreV1().PersistentVolumeClaims(ns).Create(ctx, cluster.Claim(ns, name, class, "16Mi"), metav1.CreateOptions{}); err != nil {
				errs <- err
				return
			}
			bt.mark(bt.created, name, time.Now())
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	applied := time.Since(start)
	if err := c.Wait(ctx, fmt.Sprintf("%d claims Bound", bulkSize), 5*time.Minute, func(context.Context) (bool, error) {
		return bt.count(bt.bound) == bulkSize, nil
	}); err != nil {
		t.Fatal(err)
	}
	all := time.Since(start)
	after, err := createVolumeSeconds(ctx)
	if err != nil {
		t.Fatal(err)
	}

	var toBound, handOff, provision, bind []time.Duration
	bt.mu.Lock()
	for name, b := range bt.bound {
		cr, a, p := bt.created[name], bt.annotated[name], bt.volume[name]
		toBound = append(toBound, b.Sub(cr))
		if !a.IsZero() && !p.IsZero() {
			handOff, provision, bind = append(handOff, a.Sub(cr)), append(provision, p.Sub(a)), append(bind, b.Sub(p))
		}
	}
	bt.mu.Unlock()
	t.Logf("%d PVCs of 16 MiB (class %s, Immediate) created in %s; all Bound %s after the first create",
		bulkSize, class, applied.Round(time.Millisecond), all.Round(time.Millisecond))
	mean, maxB := meanMax(toBound)
	t.Logf("  created → Bound: mean %s, max %s (openebs localpv hostpath, issue 4050: mean 85.8 s, max 157 s)", mean.Round(time.Millisecond), maxB.Round(time.Millisecond))
	calls := after.count - before.count
	var perCall time.Duration
	if calls > 0 {
		perCall = time.Duration((after.sum - before.sum) / calls * float64(time.Second))
	}
	t.Logf("  CreateVolume: %.0f calls, mean %s each (csi-provisioner's csi_sidecar_operations_seconds)", calls, perCall.Round(time.Microsecond))
	slowest, slowestName := time.Duration(0), ""
	for _, q := range []struct {
		name string
		d    []time.Duration
	}{
		{"hand-off (created → annotated by kube-controller-manager)", handOff},
		{"provision (annotated → PV created by csi-provisioner)", provision},
		{"bind (PV created → PVC Bound by kube-controller-manager)", bind},
	} {
		m, p99 := quantiles(q.d)
		_, mx := meanMax(q.d)
		t.Logf("  %-58s median %8s  p99 %8s  max %8s", q.name, m.Round(time.Millisecond), p99.Round(time.Millisecond), mx.Round(time.Millisecond))
		if mx > slowest {
			slowest, slowestName = mx, q.name
		}
	}
	t.Logf("  bottleneck: %s", slowestName)
	stop()

	start = time.Now()
	if err := client.CoreV1().PersistentVolumeClaims(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.Wait(ctx, fmt.Sprintf("the %d PVs deleted", bulkSize), 5*time.Minute, func(ctx context.Context) (bool, error) {
		pvs, err := c.Client.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for _, pv := range pvs.Items {
			if pv.Spec.ClaimRef != nil && pv.Spec.ClaimRef.Namespace == ns {
				return false, nil
			}
		}
		return true, nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("  all %d PVCs deleted → every PV and volume gone in %s", bulkSize, time.Since(start).Round(time.Millisecond))
	deleteNamespace(ctx, t, c, ns)
}

// immediateClass is the shipped class "loopvol" with Immediate binding,
// deleted when the test ends.
func immediateClass(ctx context.Context, t *testing.T, c *cluster.Cluster) string {
	t.Helper()
	sc, err := c.Client.StorageV1().StorageClasses().Get(ctx, "loopvol", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	immediate := storagev1.VolumeBindingImmediate
	class := &storagev1.StorageClass{
		ObjectMeta:           metav1.ObjectMeta{Name: "loopvol-immediate"},
		Provisioner:          sc.Provisioner,
		Parameters:           sc.Parameters,
		ReclaimPolicy:        sc.ReclaimPolicy,
		AllowVolumeExpansion: sc.AllowVolumeExpansion,
		VolumeBindingMode:    &immediate,
	}
	if _, err := c.Client.StorageV1().StorageClasses().Create(ctx, class, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Client.StorageV1().StorageClasses().Delete(context.Background(), class.Name, metav1.DeleteOptions{})
	})
	return class.Name
}

// bulkTimeline is when each claim of a namespace was created (the create
// call's return), annotated for the provisioner, got its PV, and was
// Bound, from watch events as they arrive.
type bulkTimeline struct {
	// timeline lends its watch loop and lock; the maps are this test's.
	timeline
	created, annotated, volume, bound map[string]time.Time
}

func watchBulk(ctx context.Context, c *cluster.Cluster, ns string) *bulkTimeline {
	bt := &bulkTimeline{timeline: timeline{opened: make(chan struct{}, 2)},
		created: map[string]time.Time{}, annotated: map[string]time.Time{}, volume: map[string]time.Time{}, bound: map[string]time.Time{}}
	first := func(m map[string]time.Time, name string, now time.Time) {
		if _, seen := m[name]; !seen {
			m[name] = now
		}
	}
	go bt.watch(ctx, func(ctx context.Context) (watch.Interface, error) {
		return c.Client.CoreV1().PersistentVolumeClaims(ns).Watch(ctx, metav1.ListOptions{})
	}, func(obj any, now time.Time) {
		pvc, ok := obj.(*corev1.PersistentVolumeClaim)
		if !ok {
			return
		}
		if pvc.Annotations["volume.kubernetes.io/storage-provisioner"] != "" {
			first(bt.annotated, pvc.Name, now)
		}
		if pvc.Status.Phase == corev1.ClaimBound {
			first(bt.bound, pvc.Name, now)
		}
	})
	go bt.watch(ctx, func(ctx context.Context) (watch.Interface, error) {
		return c.Client.CoreV1().PersistentVolumes().Watch(ctx, metav1.ListOptions{})
	}, func(obj any, now time.Time) {
		if pv, ok := obj.(*corev1.PersistentVolume); ok && pv.Spec.ClaimRef != nil && pv.Spec.ClaimRef.Namespace == ns {
			first(bt.volume, pv.Spec.ClaimRef.Name, now)
		}
	})
	for range 2 {
		select {
		case <-bt.opened:
		case <-ctx.Done():
		}
	}
	return bt
}

// mark records now for name in m (one of bt's maps) unless it has a time.
func (bt *bulkTimeline) mark(m map[string]time.Time, name string, now time.Time) {
	bt.mu.Lock()
	defer bt.mu.Unlock()
	if _, seen := m[name]; !seen {
		m[name] = now
	}
}

func (bt *bulkTimeline) count(m map[string]time.Time) int {
	bt.mu.Lock()
	defer bt.mu.Unlock()
	return len(m)
}

type histogram struct{ sum, count float64 }

// createVolumeSeconds reads csi-provisioner's histogram of CreateVolume
// calls (csi-lib-utils' csi_sidecar_operations_seconds).
func createVolumeSeconds(ctx context.Context) (histogram, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, provisionerMetrics, nil)
	if err != nil {
		return histogram{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return histogram{}, fmt.Errorf("csi-provisioner's metrics: %w", err)
	}
	defer resp.Body.Close()
	var h histogram
	s := bufio.NewScanner(resp.Body)
	for s.Scan() {
		l := s.Text()
		if !strings.Contains(l, `method_name="/csi.v1.Controller/CreateVolume"`) {
			continue
		}
		f := strings.Fields(l)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			continue
		}
		switch {
		case strings.HasPrefix(l, "csi_sidecar_operations_seconds_sum"):
			h.sum += v
		case strings.HasPrefix(l, "csi_sidecar_operations_seconds_count"):
			h.count += v
		}
	}
	return h, s.Err()
}

func meanMax(d []time.Duration) (mean, maxD time.Duration) {
	if len(d) == 0 {
		return 0, 0
	}
	var sum time.Duration
	for _, x := range d {
		sum += x
		maxD = max(maxD, x)
	}
	return sum / time.Duration(len(d)), maxD
}
