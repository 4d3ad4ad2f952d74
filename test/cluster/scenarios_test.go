package cluster

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/loopvol/loopvol/internal/harness/cluster"
)

// testRawBlock: a claim of volumeMode Block as the pod's device /dev/xvda:
// one pod writes random data to it and reads it back, a second pod reads
// the same bytes from the device.
func testRawBlock(t *testing.T, c *cluster.Cluster) {
	ctx := context.Background()
	ns := namespace(t, c, "block")
	pvc := cluster.Claim(ns, "raw", "loopvol", "32Mi")
	block := corev1.PersistentVolumeBlock
	pvc.Spec.VolumeMode = &block
	// The image has no writable directory but the volume: what is
	// written is summed on its way to the device (tee), and read back.
	writer := blockPod(ns, "writer", "raw",
		"echo \"wrote $(busybox dd if=/dev/urandom bs=1M count=4 2>/dev/null | busybox tee /dev/xvda | busybox sha256sum)\" && busybox sync && "+
			"echo \"read $(busybox dd if=/dev/xvda bs=1M count=4 2>/dev/null | busybox sha256sum)\"")
	create(ctx, t, c, pvc, writer)
	log := finished(ctx, t, c, ns, "writer")
	want := field(log, "wrote ")
	if got := field(log, "read "); len(want) != 64 || got != want {
		t.Fatalf("writer: %q", log)
	}
	if pv, err := c.Client.CoreV1().PersistentVolumes().Get(ctx, mustVolume(ctx, t, c, ns, "raw"), metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	} else if pv.Spec.VolumeMode == nil || *pv.Spec.VolumeMode != corev1.PersistentVolumeBlock {
		t.Fatalf("PV %s has volumeMode %v", pv.Name, pv.Spec.VolumeMode)
	}
	deletePod(ctx, t, c, ns, "writer")

	create(ctx, t, c, nil, blockPod(ns, "reader", "raw",
		"echo \"read $(busybox dd if=/dev/xvda bs=1M count=4 2>/dev/null | busybox sha256sum)\""))
	log = finished(ctx, t, c, ns, "reader")
	if got := field(log, "read "); got != want {
		t.Fatalf("the device holds %q, the writer wrote %q (reader log %q)", got, want, log)
	}
	t.Logf("4 MiB written to and read back from the raw device, and read again by a second pod: sha256 %s", want)
	deleteNamespace(ctx, t, c, ns)
}

func mustVolume(ctx context.Context, t *testing.T, c *cluster.Cluster, ns, claim string) string {
	t.Helper()
	pvc, err := c.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, claim, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return pvc.Spec.VolumeName
}

// burstSize is how many claims and pods testBurst applies at once.
const burstSize = 20

// testBurst: 20 claims and 20 pods created at once all reach Running. It
// prints the time until all run and, per pod, the median and p99 of
// provision (claim Bound), attach (VolumeAttachment attached) and stage +
// publish (Running after attached), taken from watch events.
func testBurst(t *testing.T, c *cluster.Cluster) {
	ctx := context.Background()
	ns := namespace(t, c, "burst")
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	tl := watchTimeline(wctx, c, ns)

	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, 2*burstSize)
	for i := range burstSize {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := fmt.Sprintf("v%02d", i)
			if _, err := c.Client.CoreV1().PersistentVolumeClaims(ns).Create(ctx, cluster.Claim(ns, name, "loopvol", "16Mi"), metav1.CreateOptions{}); err != nil {
				errs <- err
				return
			}
			pod := cluster.VolumePod(ns, name, name, "echo up > /data/up && busybox sleep 1000000 & wait")
			if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	applied := time.Since(start)
	if err := c.Wait(ctx, fmt.Sprintf("%d pods Running", burstSize), 5*time.Minute, func(ctx context.Context) (bool, error) {
		pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		n := 0
		for _, p := range pods.Items {
			switch p.Status.Phase {
			case corev1.PodRunning:
				n++
			case corev1.PodFailed, corev1.PodSucceeded:
				return false, fmt.Errorf("pod %s is %s", p.Name, p.Status.Phase)
			}
		}
		return n == burstSize, nil
	}); err != nil {
		t.Fatal(err)
	}
	all := time.Since(start)
	t.Logf("%d PVCs + %d Pods created in %s; all Running %s after the first create", burstSize, burstSize, applied.Round(time.Millisecond), all.Round(time.Millisecond))

	// The watches may lag the list a little.
	var ph []phases
	if err := c.Wait(ctx, "every pod's phases seen by the watches", 30*time.Second, func(context.Context) (bool, error) {
		ph = ph[:0]
		for i := range burstSize {
			name := fmt.Sprintf("v%02d", i)
			p := tl.of(start, name, name)
			if !p.complete {
				return false, nil
			}
			ph = append(ph, p)
		}
		return true, nil
	}); err != nil {
		t.Logf("per-pod phases not reported: %v", err)
	} else {
		var prov, att, sp, tot []time.Duration
		for _, p := range ph {
			prov, att, sp, tot = append(prov, p.provision), append(att, p.attach), append(sp, p.stagePublish), append(tot, p.total)
		}
		for _, q := range []struct {
			name string
			d    []time.Duration
		}{{"provision (created → PVC Bound)", prov}, {"attach (Bound → VA attached)", att}, {"stage+publish (attached → Running)", sp}, {"total (created → Running)", tot}} {
			m, p99 := quantiles(q.d)
			t.Logf("  %-38s median %7s  p99 %7s", q.name, m.Round(time.Millisecond), p99.Round(time.Millisecond))
		}
	}
	stop()
	deleteNamespace(ctx, t, c, ns)
}
