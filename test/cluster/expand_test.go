package cluster

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/loopvol/loopvol/internal/harness/cluster"
)

// sizeLoop writes data and its checksum once, then every second logs
// the filesystem's size in KiB ("size N") and the checksum's verdict.
const sizeLoop = "cd /data && ( [ -e file ] || { busybox dd if=/dev/urandom of=file bs=1M count=8 2>/dev/null && busybox sha256sum file > file.sha256 && busybox sync; } ) && " +
	"while true; do echo \"size $(busybox df -k /data | busybox tail -1 | busybox awk '{print $2}')\"; busybox sha256sum -c file.sha256; busybox sleep 1; done & wait"

// testExpansion: a claim's request raised while its Pod runs. The resizer
// (our sidecar) grows the volume (the PV's capacity), then the filesystem
// inside the Pod grows: xfs online, while the Pod runs; ext4 online when
// the node plugin may (CAP_SYS_RESOURCE), else offline at the next stage,
// so the Pod is recreated. The data stays intact either way.
func testExpansion(t *testing.T, c *cluster.Cluster) {
	ctx := context.Background()
	xfs := &storagev1.StorageClass{
		ObjectMeta:           metav1.ObjectMeta{Name: "loopvol-xfs"},
		Provisioner:          cluster.DriverName,
		VolumeBindingMode:    ptr.To(storagev1.VolumeBindingWaitForFirstConsumer),
		AllowVolumeExpansion: ptr.To(true),
		ReclaimPolicy:        ptr.To(corev1.PersistentVolumeReclaimDelete),
		Parameters:           map[string]string{"pool": "default", "csi.storage.k8s.io/fstype": "xfs"},
	}
	if _, err := c.Client.StorageV1().StorageClasses().Create(ctx, xfs, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Client.StorageV1().StorageClasses().Delete(context.Background(), xfs.Name, metav1.DeleteOptions{})
	})
	for _, tc := range []struct {
		fs, class, from, to string
		online              bool // must grow while the Pod runs
	}{
		{"ext4", "loopvol", "64Mi", "128Mi", false},
		// mkfs.xfs refuses filesystems under 300 MB.
		{"xfs", "loopvol-xfs", "320Mi", "480Mi", true},
	} {
		t.Run(tc.fs, func(t *testing.T) {
			ns := namespace(t, c, "expand-"+tc.fs)
			core := c.Client.CoreV1()
			create(ctx, t, c, cluster.Claim(ns, "data", tc.class, tc.from), cluster.VolumePod(ns, "before", "data", sizeLoop))
			pod, err := c.PodPhase(ctx, ns, "before", corev1.PodRunning, 3*time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			before := sizeKiB(t, logLine(ctx, t, c, pod, "file: OK"))
			patch := fmt.Sprintf(`{"spec":{"resources":{"requests":{"storage":%q}}}}`, tc.to)
			if _, err := core.PersistentVolumeClaims(ns).Patch(ctx, "data", types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
				t.Fatal(err)
			}
			want := resource.MustParse(tc.to)
			pvName := mustVolume(ctx, t, c, ns, "data")
			if err := c.Wait(ctx, "PV "+pvName+" grown to "+tc.to, 2*time.Minute, func(ctx context.Context) (bool, error) {
				pv, err := core.PersistentVolumes().Get(ctx, pvName, metav1.GetOptions{})
				if err != nil {
					return false, err
				}
				got := pv.Spec.Capacity[corev1.ResourceStorage]
				return got.Cmp(want) >= 0, nil
			}); err != nil {
				t.Fatal(err)
			}
			grown := func(log string) bool { return sizeKiB(t, log) > before+(want.Value()/1024-before)/2 }
			var after int64
			if tc.online {
				log := ""
				if err := c.Wait(ctx, "the filesystem grown inside the running Pod", 2*time.Minute, func(context.Context) (bool, error) {
					log, _ = c.ContainerLog(pod, "main")
					return grown(log), nil
				}); err != nil {
					t.Fatal(err)
				}
				after = sizeKiB(t, log)
				n := strings.Count(log, "file: OK")
				logLineCount(ctx, t, c, pod, "file: OK", n+1)
				if strings.Contains(log, "FAILED") {
					t.Fatalf("checksum failed: %q", log)
				}
				t.Logf("%s grew online from %d KiB to %d KiB while the Pod ran; data intact", tc.fs, before, after)
			} else {
				log, _ := c.ContainerLog(pod, "main")
				deletePod(ctx, t, c, ns, "before")
				if grown(log) {
					t.Logf("%s grew online while the Pod ran", tc.fs)
				}
				create(ctx, t, c, nil, cluster.VolumePod(ns, "after", "data", sizeLoop))
				pod, err := c.PodPhase(ctx, ns, "after", corev1.PodRunning, 3*time.Minute)
				if err != nil {
					t.Fatal(err)
				}
				log = logLine(ctx, t, c, pod, "file: OK")
				if strings.Contains(log, "FAILED") {
					t.Fatalf("checksum failed: %q", log)
				}
				after = sizeKiB(t, log)
				if !grown(log) {
					t.Fatalf("%s: %d KiB before, %d KiB after the Pod was recreated; the claim asks for %s", tc.fs, before, after, tc.to)
				}
				t.Logf("%s grew from %d KiB to %d KiB (the Pod recreated); data intact", tc.fs, before, after)
			}
			if err := c.Wait(ctx, "PVC status capacity "+tc.to+", no resize pending", 2*time.Minute, func(ctx context.Context) (bool, error) {
				pvc, err := core.PersistentVolumeClaims(ns).Get(ctx, "data", metav1.GetOptions{})
				if err != nil {
					return false, err
				}
				got := pvc.Status.Capacity[corev1.ResourceStorage]
				for _, cond := range pvc.Status.Conditions {
					if cond.Type == corev1.PersistentVolumeClaimResizing || cond.Type == corev1.PersistentVolumeClaimFileSystemResizePending {
						return false, nil
					}
				}
				return got.Cmp(want) >= 0, nil
			}); err != nil {
				t.Fatal(err)
			}
			deleteNamespace(ctx, t, c, ns)
		})
	}
}

// sizeKiB is the last "size N" of a sizeLoop log.
func sizeKiB(t *testing.T, log string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(field(log, "size "), 10, 64)
	if err != nil {
		return 0
	}
	return n
}

// logLineCount waits until the pod's log holds want at least n times.
func logLineCount(ctx context.Context, t *testing.T, c *cluster.Cluster, pod *corev1.Pod, want string, n int) string {
	t.Helper()
	var log string
	if err := c.Wait(ctx, fmt.Sprintf("%s/%s logs %q %d times", pod.Namespace, pod.Name, want, n), 2*time.Minute, func(context.Context) (bool, error) {
		log, _ = c.ContainerLog(pod, "main")
		return strings.Count(log, want) >= n, nil
	}); err != nil {
		t.Fatalf("%v; log so far: %q", err, log)
	}
	return log
}
