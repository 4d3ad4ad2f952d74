package cluster

import (
	"context"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/loopvol/loopvol/internal/harness/cluster"
	"github.com/loopvol/loopvol/internal/harness/cluster/clustertest"
)

// blockPod is VolumePod with the claim as the raw device /dev/xvda instead
// of a mount.
func blockPod(ns, name, claim, script string) *corev1.Pod {
	p := cluster.VolumePod(ns, name, claim, script)
	p.Spec.Containers[0].VolumeMounts = nil
	p.Spec.Containers[0].VolumeDevices = []corev1.VolumeDevice{{Name: "data", DevicePath: "/dev/xvda"}}
	return p
}

// create makes the claim and the pod.
func create(ctx context.Context, t *testing.T, c *cluster.Cluster, pvc *corev1.PersistentVolumeClaim, pod *corev1.Pod) {
	t.Helper()
	if pvc != nil {
		if _, err := c.Client.CoreV1().PersistentVolumeClaims(pvc.Namespace).Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if pod != nil {
		if _, err := c.Client.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// finished waits until the pod has run to its end, fails the test at once
// if it failed, and returns its main container's log.
func finished(ctx context.Context, t *testing.T, c *cluster.Cluster, ns, name string) string {
	t.Helper()
	var pod *corev1.Pod
	if err := c.Wait(ctx, "pod "+ns+"/"+name+" finished", 3*time.Minute, func(ctx context.Context) (bool, error) {
		p, err := c.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		pod = p
		return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed, nil
	}); err != nil {
		t.Fatal(err)
	}
	log, _ := c.ContainerLog(pod, "main")
	if pod.Status.Phase == corev1.PodFailed {
		t.Fatalf("pod %s/%s failed: %q", ns, name, log)
	}
	return log
}

// logLine waits until the pod's main container has written a line
// containing want and returns the whole log (clustertest.LogLine).
func logLine(ctx context.Context, t *testing.T, c *cluster.Cluster, pod *corev1.Pod, want string) string {
	t.Helper()
	return clustertest.LogLine(ctx, t, c, pod, want)
}

// field returns the word after prefix in log's last line that has it.
func field(log, prefix string) string {
	out := ""
	for _, l := range strings.Split(log, "\n") {
		if _, rest, ok := strings.Cut(l, prefix); ok {
			if f := strings.Fields(rest); len(f) > 0 {
				out = f[0]
			}
		}
	}
	return out
}

// volumeAttachments are the VolumeAttachments of loopvol.
func volumeAttachments(ctx context.Context, c *cluster.Cluster) ([]storagev1.VolumeAttachment, error) {
	vas, err := c.Client.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	var out []storagev1.VolumeAttachment
	for _, va := range vas.Items {
		if va.Spec.Attacher == cluster.DriverName {
			out = append(out, va)
		}
	}
	return out, nil
}

// noAttachments waits until no VolumeAttachment of loopvol is left.
func noAttachments(ctx context.Context, t *testing.T, c *cluster.Cluster) {
	t.Helper()
	if err := c.Wait(ctx, "no VolumeAttachment left", 2*time.Minute, func(ctx context.Context) (bool, error) {
		vas, err := volumeAttachments(ctx, c)
		return len(vas) == 0, err
	}); err != nil {
		t.Fatal(err)
	}
}

// deleteNamespace deletes ns and waits until it is gone: its pods'
// volumes unpublished, unstaged and detached, its claims' volumes deleted.
func deleteNamespace(ctx context.Context, t *testing.T, c *cluster.Cluster, ns string) {
	t.Helper()
	if err := c.Client.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.Wait(ctx, "namespace "+ns+" gone", 3*time.Minute, func(ctx context.Context) (bool, error) {
		_, err := c.Client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		return err != nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	noAttachments(ctx, t, c)
}

// mountsUnder lists the mount points under dir (the host's mount table).
func mountsUnder(t *testing.T, dir string) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) > 4 && strings.HasPrefix(f[4], dir) {
			out = append(out, f[4])
		}
	}
	return out
}

// loopBackedBy lists the loop devices whose backing file is image.
func loopBackedBy(image string) []string {
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	var out []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err == nil && strings.TrimSpace(string(b)) == image {
			out = append(out, f)
		}
	}
	return out
}

// imageOf is the pool file of the claim's volume.
func imageOf(ctx context.Context, t *testing.T, c *cluster.Cluster, ns, claim string) (pv, image string) {
	t.Helper()
	pvc, err := c.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, claim, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p, err := c.Client.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, hash, _ := strings.Cut(p.Spec.CSI.VolumeHandle, ".")
	return p.Name, filepath.Join(c.PoolDir(), "volumes", hash+".img")
}

// quantiles returns the median and the 99th percentile (nearest rank).
func quantiles(d []time.Duration) (median, p99 time.Duration) {
	if len(d) == 0 {
		return 0, 0
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	rank := func(q float64) time.Duration {
		i := int(q*float64(len(s))+0.999999) - 1
		if i < 0 {
			i = 0
		}
		if i >= len(s) {
			i = len(s) - 1
		}
		return s[i]
	}
	return rank(0.5), rank(0.99)
}
