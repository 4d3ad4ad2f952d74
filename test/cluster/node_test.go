package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/loopvol/loopvol/internal/harness/cluster"
	"github.com/loopvol/loopvol/internal/harness/cluster/clustertest"
)

// checkLoop writes data and its checksum once, then every second
// appends a tick to the volume and logs the checksum's verdict.
const checkLoop = "cd /data && busybox dd if=/dev/urandom of=file bs=1M count=8 2>/dev/null && busybox sha256sum file > file.sha256 && busybox sync && " +
	"while true; do echo tick >> ticks; busybox sha256sum -c file.sha256; busybox sleep 1; done & wait"

// nodePod is the running node plugin pod.
func nodePod(ctx context.Context, c *cluster.Cluster) (*corev1.Pod, error) {
	pods, err := c.Client.CoreV1().Pods(cluster.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=node"})
	if err != nil {
		return nil, err
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning && podReady(p) {
			return p, nil
		}
	}
	return nil, nil
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// csiNodeCount is the allocatable count kubelet wrote for loopvol into the
// node's CSINode, or -1 when there is none.
func csiNodeCount(ctx context.Context, c *cluster.Cluster) (int32, error) {
	return clustertest.CSINodeCount(ctx, c, c.NodeName)
}

// testNodePluginRestart: the node plugin pod deleted while a Pod uses its
// volume. The DaemonSet brings it back, kubelet registers it again, the Pod
// keeps reading its data and writing, and afterwards its volume is
// unpublished, unstaged and detached through the new plugin: nothing left
// mounted, no loop device on the image.
func testNodePluginRestart(t *testing.T, c *cluster.Cluster) {
	// Found by this test: after the restart the loop device's backing_file
	// reads "/volumes/<hash>.img" (relative to the old container's mount
	// of the pool, which is gone); the new plugin now matches the device by
	// the image's device and inode (pkg/loop Find).
	ctx := context.Background()
	ns := namespace(t, c, "restart")
	create(ctx, t, c, cluster.Claim(ns, "data", "loopvol", "64Mi"), cluster.VolumePod(ns, "user", "data", checkLoop))
	user, err := c.PodPhase(ctx, ns, "user", corev1.PodRunning, 3*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	logLine(ctx, t, c, user, "file: OK")
	pvName, image := imageOf(ctx, t, c, ns, "data")
	vaName := attachment(ctx, t, c, pvName)

	old, err := nodePod(ctx, c)
	if err != nil || old == nil {
		t.Fatalf("no running node plugin pod: %v", err)
	}
	if err := c.Client.CoreV1().Pods(cluster.Namespace).Delete(ctx, old.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	var fresh *corev1.Pod
	if err := c.Wait(ctx, "the old node plugin pod gone and a new one Ready", 3*time.Minute, func(ctx context.Context) (bool, error) {
		p, err := nodePod(ctx, c)
		if err != nil || p == nil || p.UID == old.UID {
			return false, err
		}
		_, err = c.Client.CoreV1().Pods(cluster.Namespace).Get(ctx, old.Name, metav1.GetOptions{})
		if err == nil {
			// Same name (a DaemonSet pod's name is random, but be sure).
			cur, _ := c.Client.CoreV1().Pods(cluster.Namespace).Get(ctx, old.Name, metav1.GetOptions{})
			if cur != nil && cur.UID == old.UID {
				return false, nil
			}
		}
		fresh = p
		return true, nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := c.Wait(ctx, "CSINode lists the driver again", 2*time.Minute, func(ctx context.Context) (bool, error) {
		n, err := csiNodeCount(ctx, c)
		return n >= 0, err
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("node plugin pod %s replaced by %s", old.Name, fresh.Name)

	log, _ := c.ContainerLog(user, "main")
	logLineCount(ctx, t, c, user, "file: OK", strings.Count(log, "file: OK")+2)
	p, err := c.Client.CoreV1().Pods(ns).Get(ctx, "user", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.UID != user.UID || p.Status.Phase != corev1.PodRunning || p.Status.ContainerStatuses[0].RestartCount != 0 {
		t.Fatalf("the Pod was disturbed: phase %s, restarts %d", p.Status.Phase, p.Status.ContainerStatuses[0].RestartCount)
	}
	if log, _ := c.ContainerLog(user, "main"); strings.Contains(log, "FAILED") || strings.Contains(log, "rror") {
		t.Fatalf("the Pod's volume misbehaved: %q", log)
	}

	deletePod(ctx, t, c, ns, "user")
	if err := c.Wait(ctx, "VolumeAttachment "+vaName+" gone", 2*time.Minute, func(ctx context.Context) (bool, error) {
		_, err := c.Client.StorageV1().VolumeAttachments().Get(ctx, vaName, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, m := range mountsUnder(t, c.KubeletDir) {
		if strings.Contains(m, pvName) || strings.Contains(m, "kubernetes.io/csi/"+cluster.DriverName) {
			t.Errorf("still mounted after unpublish and unstage: %s", m)
		}
	}
	if l := loopBackedBy(image); len(l) > 0 {
		t.Errorf("loop devices still on %s: %v", image, l)
	}

	create(ctx, t, c, nil, cluster.VolumePod(ns, "reader", "data", "cd /data && busybox sha256sum -c file.sha256 && busybox wc -l ticks"))
	reader, err := c.PodPhase(ctx, ns, "reader", corev1.PodSucceeded, 3*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if log, _ := c.ContainerLog(reader, "main"); !strings.Contains(log, "file: OK") {
		t.Fatalf("reader: %q", log)
	} else {
		t.Logf("after the restart: unpublished, unstaged, detached; the data read back: %s", strings.TrimSpace(strings.ReplaceAll(log, "\n", "; ")))
	}
	deleteNamespace(ctx, t, c, ns)
}

// testRBAC: no container of loopvol logged "forbidden" (the shipped RBAC
// is enough for all the scenarios before), and a VolumeAttachment status
// forged by another ServiceAccount, one that RBAC lets write it, is
// denied by the admission policy loopvol-volumeattachment-status.
func testRBAC(t *testing.T, c *cluster.Cluster) {
	ctx := context.Background()
	var read []string
	err := filepath.WalkDir(c.PodLogDir(), func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasPrefix(filepath.Base(filepath.Dir(filepath.Dir(path))), cluster.Namespace+"_") {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(c.PodLogDir(), path)
		read = append(read, rel)
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(strings.ToLower(l), "forbidden") {
				t.Errorf("%s: %s", rel, l)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sidecar := false
	for _, r := range read {
		if strings.Contains(r, "/sidecar/") {
			sidecar = true
		}
	}
	if !sidecar {
		t.Fatalf("no log of the sidecar read (read %v)", read)
	}
	t.Logf("no \"forbidden\" in %d container logs of loopvol", len(read))

	ns := namespace(t, c, "forge")
	create(ctx, t, c, cluster.Claim(ns, "data", "loopvol", "16Mi"), cluster.VolumePod(ns, "user", "data", "busybox sleep 1000000 & wait"))
	if _, err := c.PodPhase(ctx, ns, "user", corev1.PodRunning, 3*time.Minute); err != nil {
		t.Fatal(err)
	}
	vaName := attachment(ctx, t, c, mustVolume(ctx, t, c, ns, "data"))

	const role = "loopvol-test-forger"
	rbac := c.Client.RbacV1()
	if _, err := c.Client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "forger"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := rbac.ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: role},
		Rules: []rbacv1.PolicyRule{{
			APIGroups: []string{"storage.k8s.io"},
			Resources: []string{"volumeattachments", "volumeattachments/status"},
			Verbs:     []string{"get", "patch", "update"},
		}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rbac.ClusterRoles().Delete(context.Background(), role, metav1.DeleteOptions{}) })
	if _, err := rbac.ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: ns, Name: "forger"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rbac.ClusterRoleBindings().Delete(context.Background(), role, metav1.DeleteOptions{}) })
	tok, err := c.Client.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "forger", &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](600)},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := rest.AnonymousClientConfig(c.Rest)
	cfg.BearerToken = tok.Status.Token
	forger, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// RBAC lets the forger read it (the binding is in effect) ...
	if err := c.Wait(ctx, "the forger's RBAC in effect", time.Minute, func(ctx context.Context) (bool, error) {
		_, err := forger.StorageV1().VolumeAttachments().Get(ctx, vaName, metav1.GetOptions{})
		return err == nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	// ... but the policy refuses its status write.
	patch, _ := json.Marshal(map[string]any{"status": map[string]any{"attached": false}})
	_, err = forger.StorageV1().VolumeAttachments().Patch(ctx, vaName, types.MergePatchType, patch, metav1.PatchOptions{}, "status")
	if err == nil {
		t.Fatalf("system:serviceaccount:%s:forger changed the status of VolumeAttachment %s", ns, vaName)
	}
	if !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "loopvol-volumeattachment-status") || !strings.Contains(err.Error(), "only loopvol's sidecar") {
		t.Fatalf("the forged status was refused, but not by the policy: %v", err)
	}
	t.Logf("forged status denied: %v", err)
	va, err := c.Client.StorageV1().VolumeAttachments().Get(ctx, vaName, metav1.GetOptions{})
	if err != nil || !va.Status.Attached {
		t.Fatalf("VolumeAttachment %s after the forgery: %v, %v", vaName, va, err)
	}
	deleteNamespace(ctx, t, c, ns)
}

// testNodeLimit runs last: it restarts the node plugin with
// --max-volumes-per-node=3. kubelet writes 3 into CSINode, the scheduler
// keeps the fourth of four Pods Pending with its reason, no VolumeAttachment
// is made for it (none fails on RESOURCE_EXHAUSTED), and once a Pod is
// deleted the fourth runs. The DaemonSet is restored afterwards.
func testNodeLimit(t *testing.T, c *cluster.Cluster) {
	ctx := context.Background()
	args, err := clustertest.DriverArgs(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	origCount, err := csiNodeCount(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	limited := append(slices.Clone(args), "--max-volumes-per-node=3")
	t.Cleanup(func() {
		if err := clustertest.SetDriverArgs(context.Background(), c, args, origCount); err != nil {
			t.Errorf("restoring the node plugin: %v", err)
		}
	})
	if err := clustertest.SetDriverArgs(ctx, c, limited, 3); err != nil {
		t.Fatal(err)
	}

	ns := namespace(t, c, "limit")
	for i := range 4 {
		name := fmt.Sprintf("v%d", i)
		create(ctx, t, c, cluster.Claim(ns, name, "loopvol", "16Mi"), cluster.VolumePod(ns, name, name, "busybox sleep 1000000 & wait"))
	}
	var pending *corev1.Pod
	reason := ""
	if err := c.Wait(ctx, "3 Pods Running and the fourth unschedulable", 3*time.Minute, func(ctx context.Context) (bool, error) {
		pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		running := 0
		pending = nil
		for i := range pods.Items {
			p := &pods.Items[i]
			switch p.Status.Phase {
			case corev1.PodRunning:
				running++
			case corev1.PodPending:
				for _, cond := range p.Status.Conditions {
					if cond.Type == corev1.PodScheduled && cond.Status == corev1.ConditionFalse && cond.Reason == corev1.PodReasonUnschedulable {
						pending, reason = p, cond.Message
					}
				}
			}
		}
		return running == 3 && pending != nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(reason, "max volume count") {
		t.Fatalf("pod %s is unschedulable, but not for the volume limit: %q", pending.Name, reason)
	}
	t.Logf("pod %s Pending: %s", pending.Name, reason)
	vas, err := volumeAttachments(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	if len(vas) != 3 {
		t.Errorf("%d VolumeAttachments, want 3", len(vas))
	}
	for _, va := range vas {
		if !va.Status.Attached || va.Status.AttachError != nil {
			t.Errorf("VolumeAttachment %s: attached %v, error %v", va.Name, va.Status.Attached, va.Status.AttachError)
		}
	}
	if n := sidecarLogCount(t, c, "ResourceExhausted", "RESOURCE_EXHAUSTED"); n != 0 {
		t.Errorf("the sidecar logged RESOURCE_EXHAUSTED %d times", n)
	}

	// The limit is the only reason: one Pod gone, the fourth runs.
	for i := range 4 {
		if name := fmt.Sprintf("v%d", i); name != pending.Name {
			deletePod(ctx, t, c, ns, name)
			break
		}
	}
	if _, err := c.PodPhase(ctx, ns, pending.Name, corev1.PodRunning, 3*time.Minute); err != nil {
		t.Fatal(err)
	}
	if n := sidecarLogCount(t, c, "ResourceExhausted", "RESOURCE_EXHAUSTED"); n != 0 {
		t.Errorf("the sidecar logged RESOURCE_EXHAUSTED %d times", n)
	}
	deleteNamespace(ctx, t, c, ns)
}

// sidecarLogCount counts the sidecar's log lines that hold any of words.
func sidecarLogCount(t *testing.T, c *cluster.Cluster, words ...string) int {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(c.PodLogDir(), cluster.Namespace+"_loopvol-controller-*", "sidecar", "*.log"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no sidecar log: %v", err)
	}
	n := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(string(b), "\n") {
			for _, w := range words {
				if strings.Contains(l, w) {
					n++
					break
				}
			}
		}
	}
	return n
}
