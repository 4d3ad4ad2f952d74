package multinode

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/loopvol/loopvol/internal/harness/cluster"
)

// TestSharedPool runs the scenarios of one pool every node sees
// (overlays/local with its pool a host directory of the cluster's that
// both nodes mount: the stand-in for overlays/shared's NFS export).
func TestSharedPool(t *testing.T) {
	c, _ := up(t, false, "local")
	t.Run("PodNetwork", func(t *testing.T) { testPodNetwork(t, c) })
	t.Run("KubectlPlugin", func(t *testing.T) { testKubectlPlugin(t, c) })
	t.Run("Move", func(t *testing.T) { testMove(t, c) })
	t.Run("Fencing", func(t *testing.T) { testFencing(t, c) })
	t.Run("MultiAttach", func(t *testing.T) { testMultiAttach(t, c) })
	t.Run("LeaderFailover", func(t *testing.T) { testLeaderFailover(t, c) })
	// Last: the controller's pod may be on the drained node and move.
	t.Run("Drain", func(t *testing.T) { testDrainShared(t, c) })
}

// testPodNetwork: ordinary Pods (not hostNetwork) on both nodes, each on
// its node's pod range; one reaches the other across the nodes, and the
// API server through the kubernetes Service, as on any cluster.
func testPodNetwork(t *testing.T, c *cluster.Cluster) {
	ctx := context.Background()
	ns := namespace(t, c, "pod-network")
	nodes := c.Nodes()
	server := onNode(plainPod(ns, "server", `busybox mkdir -p /www && echo hello-from-$NODE > /www/index.html && busybox httpd -f -p 8080 -h /www`), nodes[1].Name)
	if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, server, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	srv := running(ctx, t, c, ns, "server")
	if !podIPIn(srv.Status.PodIP, nodes[1].PodCIDR) {
		t.Fatalf("server pod IP %s: not in node %s's pod range %s", srv.Status.PodIP, nodes[1].Name, nodes[1].PodCIDR)
	}
	client := onNode(plainPod(ns, "client", fmt.Sprintf(
		`printf 'GET / HTTP/1.0\r\n\r\n' | busybox nc -w 10 %s 8080 && `+
			`printf 'GET /livez HTTP/1.0\r\n\r\n' | busybox nc -w 10 "$KUBERNETES_SERVICE_HOST" "$KUBERNETES_SERVICE_PORT"`, srv.Status.PodIP)), nodes[0].Name)
	client.Spec.RestartPolicy = corev1.RestartPolicyNever
	if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, client, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	done, err := c.PodPhase(ctx, ns, "client", corev1.PodSucceeded, 2*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	log, _ := c.ContainerLog(done, "main")
	if !strings.Contains(log, "hello-from-"+nodes[1].Name) || !strings.Contains(log, "Client sent an HTTP request to an HTTPS server") {
		t.Fatalf("the pod on %s (%s) did not reach the pod on %s (%s) and the API server; its log:\n%s", nodes[0].Name, done.Status.PodIP, nodes[1].Name, srv.Status.PodIP, log)
	}
	// kubectl logs and exec go through the API server to the node's
	// kubelet, at the node's address.
	if out := kubectl(ctx, t, c, "logs", "-n", ns, "client"); !strings.Contains(out, "hello-from-") {
		t.Fatalf("kubectl logs: %q", out)
	}
	if out := kubectl(ctx, t, c, "exec", "-n", ns, "server", "--", "/bin/busybox", "cat", "/www/index.html"); !strings.Contains(out, "hello-from-"+nodes[1].Name) {
		t.Fatalf("kubectl exec: %q", out)
	}
	t.Logf("pod %s on %s reached pod %s on %s and the API server; kubectl logs and exec work", done.Status.PodIP, nodes[0].Name, srv.Status.PodIP, nodes[1].Name)
}

// plainPod is a busybox Pod on the pod network that runs script ($NODE is
// its node's name).
func plainPod(ns, name, script string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: ptr.To[int64](2),
			Containers: []corev1.Container{{
				Name:            "main",
				Image:           cluster.BusyboxImage,
				ImagePullPolicy: corev1.PullNever,
				Command:         []string{"/bin/busybox", "sh", "-c", "trap 'exit 0' TERM; " + script},
				Env:             []corev1.EnvVar{{Name: "NODE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}}},
			}},
		},
	}
}

func podIPIn(ip, cidr string) bool {
	_, n, err := net.ParseCIDR(cidr)
	return err == nil && n.Contains(net.ParseIP(ip))
}

// moveScript writes data and its checksum the first time, and checks it
// every time after, on whichever node the Pod runs.
const moveScript = `cd /data && if [ -f file.sha256 ]; then busybox sha256sum -c file.sha256 && echo "verified on $NODE"; ` +
	`else busybox dd if=/dev/urandom of=file bs=1M count=8 2>/dev/null && busybox sha256sum file > file.sha256 && busybox sync && echo "written on $NODE"; fi; ` +
	`busybox sleep 1000000 & wait`

// testMove: a StatefulSet's Pod writes data on one node; the node is
// cordoned and the Pod deleted; it runs again on the other node and reads
// the same checksum; the old VolumeAttachment is gone and the new one names
// the other node. Five moves, back and forth, timed: delete → the old
// VolumeAttachment gone (detach) → the new one attached (attach) → the Pod
// Running (stage, publish and the container's start).
func testMove(t *testing.T, c *cluster.Cluster) {
	ctx := context.Background()
	ns := namespace(t, c, "move")
	pod, pv := startMover(ctx, t, c, ns)
	// The scenarios after this one need both nodes, even when it fails.
	t.Cleanup(func() {
		for _, n := range c.Nodes() {
			_, _ = c.Kubectl(context.Background(), "uncordon", n.Name)
		}
	})
	var detach, attach, start, total []time.Duration
	for i := range 5 {
		from := pod.Spec.NodeName
		to := other(c, from)
		kubectl(ctx, t, c, "cordon", from)
		kubectl(ctx, t, c, "uncordon", to)
		old, err := attachmentOf(ctx, c, pv.Name)
		if err != nil || old == nil || old.Spec.NodeName != from {
			t.Fatalf("move %d: the VolumeAttachment before the move: %+v, %v; want one on %s", i+1, old, err, from)
		}
		t0 := time.Now()
		if err := c.Client.CoreV1().Pods(ns).Delete(ctx, "app-0", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		var tDetach, tAttach time.Duration
		if err := c.Wait(ctx, fmt.Sprintf("move %d: app-0 Running on %s", i+1, to), 3*time.Minute, func(ctx context.Context) (bool, error) {
			va, err := attachmentOf(ctx, c, pv.Name)
			if err != nil {
				return false, err
			}
			if tDetach == 0 && (va == nil || va.Name != old.Name) {
				tDetach = time.Since(t0)
			}
			if tAttach == 0 && va != nil && va.Spec.NodeName == to && va.Status.Attached {
				tAttach = time.Since(t0)
			}
			p, err := c.Client.CoreV1().Pods(ns).Get(ctx, "app-0", metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return false, nil
			}
			if err != nil {
				return false, err
			}
			pod = p
			return p.UID != "" && p.Spec.NodeName == to && p.Status.Phase == corev1.PodRunning && tAttach != 0, nil
		}); err != nil {
			t.Fatal(err)
		}
		tRun := time.Since(t0)
		logLine(ctx, t, c, pod, "file: OK")
		logLine(ctx, t, c, pod, "verified on "+to)
		va, err := attachmentOf(ctx, c, pv.Name)
		if err != nil || va == nil || va.Spec.NodeName != to || va.Name == old.Name {
			t.Fatalf("move %d: the VolumeAttachment after: %+v, %v; want a new one on %s", i+1, va, err, to)
		}
		detach, attach, start, total = append(detach, tDetach), append(attach, tAttach-tDetach), append(start, tRun-tAttach), append(total, tRun)
		t.Logf("move %d, %s → %s: detached after %s, attached %s later, Running %s later: %s in all",
			i+1, from, to, tDetach.Round(time.Millisecond), (tAttach - tDetach).Round(time.Millisecond), (tRun - tAttach).Round(time.Millisecond), tRun.Round(time.Millisecond))
	}
	t.Logf("a Pod's move between nodes, median of %d: %s in all (detach %s, attach %s, stage + publish + container start %s)",
		len(total), median(total), median(detach), median(attach), median(start))
}

// startMover makes the StatefulSet app (one replica) of moveScript with a
// claim of the class loopvol, waits until its pod has written its data,
// and returns the pod and its volume.
func startMover(ctx context.Context, t *testing.T, c *cluster.Cluster, ns string) (*corev1.Pod, *corev1.PersistentVolume) {
	t.Helper()
	ss := &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "app"},
		Spec: appsv1.StatefulSetSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "move"}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "move"}},
				Spec:       volumePodSpec("data", moveScript),
			},
			VolumeClaimTemplates: []corev1.PersistentVolumeClaim{*cluster.Claim("", "data", "loopvol", "64Mi")},
		},
	}
	if _, err := c.Client.AppsV1().StatefulSets(ns).Create(ctx, ss, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := running(ctx, t, c, ns, "app-0")
	logLine(ctx, t, c, pod, "written on "+pod.Spec.NodeName)
	return pod, volumeOf(ctx, t, c, ns, "data-app-0")
}

// volumePodSpec is cluster.VolumePod's spec with $NODE, for claim.
func volumePodSpec(claim, script string) corev1.PodSpec {
	spec := cluster.VolumePod("", "", claim, script).Spec
	spec.Containers[0].Env = []corev1.EnvVar{{Name: "NODE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}}}
	spec.RestartPolicy = corev1.RestartPolicyAlways
	return spec
}

// testFencing: while a volume is attached to one node, NodeStageVolume on
// the other node's socket (the node plugin's, as kubelet would call it) is
// refused with FAILED_PRECONDITION and mounts nothing there.
func testFencing(t *testing.T, c *cluster.Cluster) {
	ctx := context.Background()
	ns := namespace(t, c, "fencing")
	nodes := c.Nodes()
	a, b := nodes[0], nodes[1]
	if _, err := c.Client.CoreV1().PersistentVolumeClaims(ns).Create(ctx, cluster.Claim(ns, "data", "loopvol", "64Mi"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := onNode(cluster.VolumePod(ns, "holder", "data", "echo holding && busybox sleep 1000000 & wait"), a.Name)
	if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	running(ctx, t, c, ns, "holder")
	pv := volumeOf(ctx, t, c, ns, "data")
	va, err := attachmentOf(ctx, c, pv.Name)
	if err != nil || va == nil || va.Spec.NodeName != a.Name || !va.Status.Attached {
		t.Fatalf("VolumeAttachment: %+v, %v; want attached to %s", va, err, a.Name)
	}

	// Node B's plugin socket, by the host's path of B's kubelet root.
	sock := filepath.Join(b.StateDir, "kubelet", "plugins", cluster.DriverName, "csi.sock")
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	staging := filepath.Join(c.KubeletDir, "plugins", "kubernetes.io", "csi", cluster.DriverName, "fencing-test", "globalmount")
	mountsBefore := nodeMounts(t, b)
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, err = csi.NewNodeClient(conn).NodeStageVolume(rctx, &csi.NodeStageVolumeRequest{
		VolumeId:          pv.Spec.CSI.VolumeHandle,
		PublishContext:    va.Status.AttachmentMetadata,
		StagingTargetPath: staging,
		VolumeCapability: &csi.VolumeCapability{
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: pv.Spec.CSI.FSType}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		},
		VolumeContext: pv.Spec.CSI.VolumeAttributes,
	})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("NodeStageVolume on %s of a volume attached to %s: %v, want FAILED_PRECONDITION", b.Name, a.Name, err)
	}
	t.Logf("NodeStageVolume on %s refused: %v", b.Name, err)
	if after := nodeMounts(t, b); len(after) != len(mountsBefore) {
		t.Fatalf("node %s's mounts changed: %d before, %d after", b.Name, len(mountsBefore), len(after))
	}
	for _, m := range nodeMounts(t, b) {
		if strings.Contains(m, "fencing-test") {
			t.Fatalf("node %s mounted %s", b.Name, m)
		}
	}
}

// nodeMounts are the mount points of node n's mount namespace.
func nodeMounts(t *testing.T, n cluster.Node) []string {
	t.Helper()
	b, err := readFile(fmt.Sprintf("/proc/%d/mountinfo", n.PID))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(b, "\n") {
		if f := strings.Fields(l); len(f) > 4 {
			out = append(out, f[4])
		}
	}
	return out
}

// testMultiAttach: a ReadWriteOnce claim used by Pods on both nodes: the
// second waits with the Multi-Attach event and runs once the first is gone.
func testMultiAttach(t *testing.T, c *cluster.Cluster) {
	ctx := context.Background()
	ns := namespace(t, c, "multi-attach")
	nodes := c.Nodes()
	if _, err := c.Client.CoreV1().PersistentVolumeClaims(ns).Create(ctx, cluster.Claim(ns, "data", "loopvol", "64Mi"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	first := onNode(cluster.VolumePod(ns, "first", "data", "echo first && busybox sleep 1000000 & wait"), nodes[0].Name)
	if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, first, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	running(ctx, t, c, ns, "first")
	second := onNode(cluster.VolumePod(ns, "second", "data", "echo second && busybox sleep 1000000 & wait"), nodes[1].Name)
	if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, second, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var event string
	if err := c.Wait(ctx, "the Multi-Attach (FailedAttachVolume) event of pod second", 2*time.Minute, func(ctx context.Context) (bool, error) {
		evs, err := c.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=second"})
		if err != nil {
			return false, err
		}
		for _, e := range evs.Items {
			// Kubernetes 1.37 words it "Waiting for detach for volume
			// ... Volume is already used by pod(s) first"; before, it
			// began "Multi-Attach error".
			if e.Reason == "FailedAttachVolume" && (strings.Contains(e.Message, "Multi-Attach error") || strings.Contains(e.Message, "already used by pod(s) first")) {
				event = e.Message
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		evs, _ := c.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
		for _, e := range evs.Items {
			t.Logf("event %s %s: %s %s", e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, e.Message)
		}
		t.Fatal(err)
	}
	t.Logf("pod second waits: %s", event)
	if p, err := c.Client.CoreV1().Pods(ns).Get(ctx, "second", metav1.GetOptions{}); err != nil || p.Status.Phase != corev1.PodPending {
		t.Fatalf("pod second: %v, %v; want Pending while first holds the volume", p.Status.Phase, err)
	}
	if err := c.Client.CoreV1().Pods(ns).Delete(ctx, "first", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	running(ctx, t, c, ns, "second")
	pv := volumeOf(ctx, t, c, ns, "data")
	if va, err := attachmentOf(ctx, c, pv.Name); err != nil || va == nil || va.Spec.NodeName != nodes[1].Name {
		t.Fatalf("VolumeAttachment after: %+v, %v; want one on %s", va, err, nodes[1].Name)
	}
}

func median(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2].Round(time.Millisecond)
}
