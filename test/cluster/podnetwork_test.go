package cluster

import (
	"context"
	"net"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/loopvol/loopvol/internal/harness/cluster"
)

// testPodNetwork: a pod on the bridge network (not hostNetwork) reaches
// the apiserver through the kubernetes Service, at the address and port
// kubelet gives it in KUBERNETES_SERVICE_HOST and _PORT, as client-go's
// in-cluster configuration dials it: the Service's endpoint is the Node's
// address and kube-proxy routes the ClusterIP there. What the upstream
// suite's volume populator (a controller in a pod of the pod network)
// needs. The pod speaks plain HTTP to the TLS port: only a Go TLS server
// answers that with "Client sent an HTTP request to an HTTPS server".
func testPodNetwork(t *testing.T, c *cluster.Cluster) {
	ctx := context.Background()
	if cluster.NetNSNodeIP() == "" {
		t.Skip("the pod network needs a Node address (the test binary in its own network namespace: TestMain)")
	}
	u, err := url.Parse(c.Server)
	if err != nil {
		t.Fatal(err)
	}
	list, err := c.Client.DiscoveryV1().EndpointSlices(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=kubernetes"})
	if err != nil {
		t.Fatal(err)
	}
	var endpoints []string
	for _, s := range list.Items {
		for _, e := range s.Endpoints {
			for _, p := range s.Ports {
				for _, a := range e.Addresses {
					endpoints = append(endpoints, net.JoinHostPort(a, strconv.Itoa(int(ptr.Deref(p.Port, 0)))))
				}
			}
		}
	}
	if want := net.JoinHostPort(cluster.NetNSNodeIP(), u.Port()); len(endpoints) != 1 || endpoints[0] != want {
		t.Fatalf("the kubernetes Service's endpoints are %v, want [%s]", endpoints, want)
	}

	ns := namespace(t, c, "pod-network")
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "dial-api"},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: ptr.To[int64](5),
			Containers: []corev1.Container{{
				Name:            "main",
				Image:           cluster.BusyboxImage,
				ImagePullPolicy: corev1.PullNever,
				Command: []string{"/bin/busybox", "sh", "-c",
					`echo "dialing $KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT"; ` +
						`printf 'GET /livez HTTP/1.0\r\n\r\n' | nc -w 10 "$KUBERNETES_SERVICE_HOST" "$KUBERNETES_SERVICE_PORT"`},
			}},
		},
	}
	if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Client.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{})
	})
	done, err := c.PodPhase(ctx, ns, pod.Name, corev1.PodSucceeded, 2*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if done.Status.PodIP == "" || done.Status.PodIP == cluster.NetNSNodeIP() {
		t.Fatalf("pod IP %q: the pod is not on the bridge network", done.Status.PodIP)
	}
	log, err := c.ContainerLog(done, "main")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(log, "Client sent an HTTP request to an HTTPS server") {
		t.Fatalf("the pod (%s) did not reach the apiserver through the kubernetes Service; its log:\n%s", done.Status.PodIP, log)
	}
	t.Logf("pod %s reached the apiserver at the kubernetes Service: %s", done.Status.PodIP, strings.SplitN(log, "\n", 2)[0])
}
