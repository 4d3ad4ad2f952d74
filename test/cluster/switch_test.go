package cluster

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/loopvol/loopvol/internal/harness/cluster"
	"github.com/loopvol/loopvol/internal/harness/cluster/clustertest"
	"github.com/loopvol/loopvol/internal/harness/testenv"
)

// upstreamAttacher is the image of hack/tools/attacher's csi-attacher that
// `make cluster-images` imports, under the name the component's image is
// renamed to.
const upstreamAttacher = "localhost/loopvol/csi-attacher:v4.13.0"

// testSwitching swaps loopvol's attach controller for upstream's
// external-attacher (deploy/kubernetes/components/upstream-attacher) while
// a Pod uses a volume, and back: the Pod is never disturbed, a volume
// attached by one is detached by the other, and no VolumeAttachment is
// left behind.
func testSwitching(t *testing.T, c *cluster.Cluster) {
	ctx := context.Background()
	ns := namespace(t, c, "switching")
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	ours := deployed
	upstream := upstreamOverlay(t, c, ours, filepath.Join(root, "deploy", "kubernetes", "components", "upstream-attacher"))

	// Attached by loopvol's sidecar.
	create(ctx, t, c, cluster.Claim(ns, "first", "loopvol", "16Mi"), cluster.VolumePod(ns, "first", "first",
		"echo first > /data/owner && busybox sync && echo written && busybox sleep 1000000 & wait"))
	first, err := c.PodPhase(ctx, ns, "first", corev1.PodRunning, 3*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	logLine(ctx, t, c, first, "written")
	firstVA := attachment(ctx, t, c, mustVolume(ctx, t, c, ns, "first"))

	start := time.Now()
	if err := c.Deploy(ctx, upstream); err != nil {
		t.Fatalf("switching to upstream's attacher: %v", err)
	}
	controller := controllerPod(ctx, t, c)
	if !hasContainer(controller, "csi-attacher") {
		t.Fatalf("the controller pod %s has no csi-attacher after the switch", controller.Name)
	}
	t.Logf("switched to external-attacher v4.13.0 in %s", time.Since(start).Round(time.Millisecond))
	undisturbed(ctx, t, c, first)

	// Attached by upstream's, then the first volume, attached by ours,
	// detached by upstream's.
	create(ctx, t, c, cluster.Claim(ns, "second", "loopvol", "16Mi"), cluster.VolumePod(ns, "second", "second",
		"echo second > /data/owner && busybox sync && echo written && busybox sleep 1000000 & wait"))
	second, err := c.PodPhase(ctx, ns, "second", corev1.PodRunning, 3*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	logLine(ctx, t, c, second, "written")
	secondVA := attachment(ctx, t, c, mustVolume(ctx, t, c, ns, "second"))
	deletePod(ctx, t, c, ns, "first")
	if err := c.Wait(ctx, "VolumeAttachment "+firstVA+" detached and gone", 2*time.Minute, func(ctx context.Context) (bool, error) {
		vas, err := volumeAttachments(ctx, c)
		for _, va := range vas {
			if va.Name == firstVA {
				return false, err
			}
		}
		return true, err
	}); err != nil {
		t.Fatal(err)
	}
	log, err := c.ContainerLog(controller, "csi-attacher")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{secondVA, firstVA} {
		if !strings.Contains(log, want) {
			t.Errorf("external-attacher's log does not name %s, which it should have handled:\n%s", want, log)
		}
	}

	// And back.
	start = time.Now()
	if err := c.Deploy(ctx, ours); err != nil {
		t.Fatalf("switching back to loopvol's attacher: %v", err)
	}
	controller = controllerPod(ctx, t, c)
	if hasContainer(controller, "csi-attacher") {
		t.Fatalf("the controller pod %s still runs csi-attacher after switching back", controller.Name)
	}
	t.Logf("switched back to loopvol's attacher in %s", time.Since(start).Round(time.Millisecond))
	undisturbed(ctx, t, c, second)

	// The first volume attached again, by ours, its data intact; the
	// second, attached by upstream's, detached by ours.
	create(ctx, t, c, nil, cluster.VolumePod(ns, "again", "first", "echo owner=$(busybox cat /data/owner)"))
	if got := field(finished(ctx, t, c, ns, "again"), "owner="); got != "first" {
		t.Fatalf("the first volume read back owner %q, want %q", got, "first")
	}
	deletePod(ctx, t, c, ns, "second")
	deleteNamespace(ctx, t, c, ns)
	log, err = c.ContainerLog(controllerPod(ctx, t, c), "sidecar")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(log, secondVA) {
		t.Errorf("loopvol's sidecar log does not name %s, which it should have detached", secondVA)
	}
}

// upstreamOverlay writes a kustomization beside ours (the cluster's
// overlays/local) that adds the upstream-attacher component, as a user's
// overlay would, with the local cluster's own settings for the new
// container: the imported image, the apiserver on loopback.
func upstreamOverlay(t *testing.T, c *cluster.Cluster, ours, component string) string {
	t.Helper()
	dir := filepath.Join(filepath.Dir(ours), "deploy-upstream-attacher")
	name, tag, _ := strings.Cut(upstreamAttacher, ":")
	clustertest.WriteKustomization(t, c, dir, func(rel func(string) string, apiHost, apiPort string) string {
		return fmt.Sprintf(`# Generated by test/cluster: the cluster's overlay with upstream's attacher.
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - %s
components:
  - %s
images:
  - name: registry.k8s.io/sig-storage/csi-attacher
    newName: %s
    newTag: %s
patches:
  - patch: |-
      apiVersion: apps/v1
      kind: StatefulSet
      metadata: {name: loopvol-controller, namespace: loopvol}
      spec:
        template:
          spec:
            containers:
              - name: csi-attacher
                imagePullPolicy: Never
                env:
                  - {name: KUBERNETES_SERVICE_HOST, value: %s}
                  - {name: KUBERNETES_SERVICE_PORT, value: "%s"}
`, rel(ours), rel(component), name, tag, apiHost, apiPort)
	})
	return dir
}

// controllerPod is the running pod of the StatefulSet loopvol-controller.
func controllerPod(ctx context.Context, t *testing.T, c *cluster.Cluster) *corev1.Pod {
	t.Helper()
	p, err := c.Client.CoreV1().Pods(cluster.Namespace).Get(ctx, "loopvol-controller-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func hasContainer(p *corev1.Pod, name string) bool {
	for _, ctr := range p.Spec.Containers {
		if ctr.Name == name {
			return true
		}
	}
	return false
}

// undisturbed fails the test unless pod is the same pod, still Running,
// never restarted, and its volume still attached.
func undisturbed(ctx context.Context, t *testing.T, c *cluster.Cluster, pod *corev1.Pod) {
	t.Helper()
	now, err := c.Client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if now.UID != pod.UID || now.Status.Phase != corev1.PodRunning {
		t.Fatalf("pod %s/%s disturbed by the switch: uid %s → %s, phase %s", pod.Namespace, pod.Name, pod.UID, now.UID, now.Status.Phase)
	}
	for _, s := range now.Status.ContainerStatuses {
		if s.RestartCount != 0 {
			t.Fatalf("pod %s/%s: container %s restarted %d times during the switch", pod.Namespace, pod.Name, s.Name, s.RestartCount)
		}
	}
	claim := pod.Spec.Volumes[0].PersistentVolumeClaim.ClaimName
	attachment(ctx, t, c, mustVolume(ctx, t, c, pod.Namespace, claim))
}
