package cluster

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/utils/ptr"

	"github.com/loopvol/loopvol/internal/harness/cluster"
)

var volumeSnapshots = schema.GroupVersionResource{Group: "snapshot.storage.k8s.io", Version: "v1", Resource: "volumesnapshots"}

// testSnapshots: external-snapshotter v8.7.0 (snapshot-controller and
// csi-snapshotter, components/snapshotter) on the real cluster. A
// VolumeSnapshot of a claim whose Pod is still writing; a new, larger claim
// restored from it; a Pod reads the data written before the snapshot and
// sees the filesystem grown to the new size (the first stage grows it);
// deleting the namespace removes the snapshot's content too.
func testSnapshots(t *testing.T, c *cluster.Cluster) {
	ctx := context.Background()
	ns := namespace(t, c, "snapshots")
	dyn, err := dynamic.NewForConfig(c.Rest)
	if err != nil {
		t.Fatal(err)
	}
	create(ctx, t, c, cluster.Claim(ns, "source", "loopvol", "64Mi"), cluster.VolumePod(ns, "writer", "source",
		"echo before-the-snapshot > /data/file && busybox sync && echo written && "+
			"while true; do busybox date >> /data/log; busybox sleep 0.2; done & wait"))
	writer, err := c.PodPhase(ctx, ns, "writer", corev1.PodRunning, 3*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	logLine(ctx, t, c, writer, "written")

	start := time.Now()
	snap := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "snapshot.storage.k8s.io/v1",
		"kind":       "VolumeSnapshot",
		"metadata":   map[string]any{"name": "snap", "namespace": ns},
		"spec": map[string]any{
			"volumeSnapshotClassName": "loopvol",
			"source":                  map[string]any{"persistentVolumeClaimName": "source"},
		},
	}}
	if _, err := dyn.Resource(volumeSnapshots).Namespace(ns).Create(ctx, snap, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var content string
	if err := c.Wait(ctx, "VolumeSnapshot snap ready to use", 2*time.Minute, func(ctx context.Context) (bool, error) {
		s, err := dyn.Resource(volumeSnapshots).Namespace(ns).Get(ctx, "snap", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if msg, found, _ := unstructured.NestedString(s.Object, "status", "error", "message"); found {
			t.Logf("snapshot error so far: %s", msg)
		}
		content, _, _ = unstructured.NestedString(s.Object, "status", "boundVolumeSnapshotContentName")
		ready, _, _ := unstructured.NestedBool(s.Object, "status", "readyToUse")
		return ready, nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("VolumeSnapshot of a claim in use ready in %s (content %s)", time.Since(start).Round(time.Millisecond), content)
	undisturbed(ctx, t, c, writer)

	restored := cluster.Claim(ns, "restored", "loopvol", "128Mi")
	restored.Spec.DataSource = &corev1.TypedLocalObjectReference{APIGroup: ptr.To("snapshot.storage.k8s.io"), Kind: "VolumeSnapshot", Name: "snap"}
	start = time.Now()
	create(ctx, t, c, restored, cluster.VolumePod(ns, "reader", "restored",
		"echo read=$(busybox cat /data/file) && echo kib=$(busybox df -k /data | busybox tail -n 1 | busybox awk '{print $2}')"))
	log := finished(ctx, t, c, ns, "reader")
	if got := field(log, "read="); got != "before-the-snapshot" {
		t.Fatalf("the restored claim reads %q, want %q (log %q)", got, "before-the-snapshot", log)
	}
	kib, err := strconv.Atoi(field(log, "kib="))
	if err != nil || kib < 100*1024 {
		t.Fatalf("the restored filesystem has %q KiB, want it grown to about 128 MiB (log %q)", field(log, "kib="), log)
	}
	t.Logf("restored into a claim twice the size and read back in %s; its filesystem %d KiB (grown at the first stage)", time.Since(start).Round(time.Millisecond), kib)

	deleteNamespace(ctx, t, c, ns)
	if content != "" {
		contents := schema.GroupVersionResource{Group: "snapshot.storage.k8s.io", Version: "v1", Resource: "volumesnapshotcontents"}
		if err := c.Wait(ctx, "VolumeSnapshotContent "+content+" deleted", 2*time.Minute, func(ctx context.Context) (bool, error) {
			_, err := dyn.Resource(contents).Get(ctx, content, metav1.GetOptions{})
			return apierrors.IsNotFound(err), nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	if leftovers := strings.TrimSpace(strings.Join(mountsUnder(t, c.KubeletDir), " ")); strings.Contains(leftovers, ns) {
		t.Fatalf("mounts of the namespace left: %s", leftovers)
	}
}
