package cluster

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/loopvol/loopvol/internal/harness/cluster"
)

// testVolumeAttributesClass: a claim made with a VolumeAttributesClass
// (csi-provisioner passes its parameters to CreateVolume), written to by a
// Pod; with the Pod gone, the claim's class changed to one whose pool is
// "fast": our sidecar's modify controller calls ControllerModifyVolume,
// the driver moves the volume to the other pool keeping its ID, the claim
// reports the new class, and a new Pod reads the data from there.
func testVolumeAttributesClass(t *testing.T, c *cluster.Cluster) {
	ctx := context.Background()
	ns := namespace(t, c, "vac")
	storage := c.Client.StorageV1()
	for _, vac := range []*storagev1.VolumeAttributesClass{
		{ObjectMeta: metav1.ObjectMeta{Name: "loopvol-thin"}, DriverName: cluster.DriverName, Parameters: map[string]string{"preallocate": "false"}},
		{ObjectMeta: metav1.ObjectMeta{Name: "loopvol-fast"}, DriverName: cluster.DriverName, Parameters: map[string]string{"preallocate": "false", "pool": "fast"}},
	} {
		if _, err := storage.VolumeAttributesClasses().Create(ctx, vac, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = storage.VolumeAttributesClasses().Delete(context.Background(), vac.Name, metav1.DeleteOptions{})
		})
	}

	pvc := cluster.Claim(ns, "data", "loopvol", "64Mi")
	pvc.Spec.VolumeAttributesClassName = ptr.To("loopvol-thin")
	create(ctx, t, c, pvc, cluster.VolumePod(ns, "writer", "data",
		"echo moved-data > /data/file && busybox sync && echo written && busybox sleep 1000000 & wait"))
	writer, err := c.PodPhase(ctx, ns, "writer", corev1.PodRunning, 3*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	logLine(ctx, t, c, writer, "written")
	pvName, image := imageOf(ctx, t, c, ns, "data")
	pv, err := c.Client.CoreV1().PersistentVolumes().Get(ctx, pvName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	handle := pv.Spec.CSI.VolumeHandle
	if got := ptr.Deref(pv.Spec.VolumeAttributesClassName, ""); got != "loopvol-thin" {
		t.Fatalf("PV %s: volumeAttributesClassName %q, want loopvol-thin", pvName, got)
	}
	deletePod(ctx, t, c, ns, "writer")
	noAttachments(ctx, t, c)

	start := time.Now()
	patch := []byte(`{"spec":{"volumeAttributesClassName":"loopvol-fast"}}`)
	if _, err := c.Client.CoreV1().PersistentVolumeClaims(ns).Patch(ctx, "data", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.Wait(ctx, "the claim's current class loopvol-fast", 2*time.Minute, func(ctx context.Context) (bool, error) {
		p, err := c.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "data", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if s := p.Status.ModifyVolumeStatus; s != nil && s.Status == corev1.PersistentVolumeClaimModifyVolumeInfeasible {
			t.Fatalf("the class change is infeasible: %+v, conditions %+v", s, p.Status.Conditions)
		}
		return ptr.Deref(p.Status.CurrentVolumeAttributesClassName, "") == "loopvol-fast" && p.Status.ModifyVolumeStatus == nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("class changed → ControllerModifyVolume moved the volume to pool fast in %s", time.Since(start).Round(time.Millisecond))
	pv, err = c.Client.CoreV1().PersistentVolumes().Get(ctx, pvName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pv.Spec.CSI.VolumeHandle != handle || ptr.Deref(pv.Spec.VolumeAttributesClassName, "") != "loopvol-fast" {
		t.Fatalf("PV after the move: handle %s (was %s), class %v", pv.Spec.CSI.VolumeHandle, handle, pv.Spec.VolumeAttributesClassName)
	}
	moved := filepath.Join(c.PoolDirOf("fast"), "volumes", filepath.Base(image))
	if _, err := os.Stat(moved); err != nil {
		t.Fatalf("no image in pool fast after the move: %v", err)
	}
	if _, err := os.Stat(image); !os.IsNotExist(err) {
		t.Fatalf("the image is still in pool default after the move (%v)", err)
	}

	create(ctx, t, c, nil, cluster.VolumePod(ns, "reader", "data", "echo read=$(busybox cat /data/file)"))
	if got := field(finished(ctx, t, c, ns, "reader"), "read="); got != "moved-data" {
		t.Fatalf("after the move the volume reads %q, want %q", got, "moved-data")
	}
	deleteNamespace(ctx, t, c, ns)
	if err := c.Wait(ctx, "the moved volume deleted from pool fast", time.Minute, func(context.Context) (bool, error) {
		_, err := os.Stat(moved)
		return os.IsNotExist(err), nil
	}); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(handle, "fast") {
		t.Fatalf("the volume's ID %s names pool fast: it must keep naming its home pool", handle)
	}
}
