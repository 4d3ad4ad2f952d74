package cluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// BusyboxImage is the workload image of the tests and the demo
// (hack/images -tools): Debian's static busybox as /bin/busybox.
const BusyboxImage = "localhost/loopvol/busybox:bookworm"

// Claim is a PersistentVolumeClaim of class for size bytes.
func Claim(namespace, name, class, size string) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: ptr.To(class),
			Resources: corev1.VolumeResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)},
			},
		},
	}
}

// VolumePod is a Pod that runs script (busybox sh; applets as `busybox
// <applet>`) with claim mounted at /data. It shares the node's network (the
// cluster has no pod network) and never restarts; SIGTERM ends it at once
// when the script waits with `busybox sleep 1000000 & wait`.
func VolumePod(namespace, name, claim, script string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: corev1.PodSpec{
			HostNetwork:                   true,
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: ptr.To[int64](5),
			Containers: []corev1.Container{{
				Name:            "main",
				Image:           BusyboxImage,
				ImagePullPolicy: corev1.PullNever,
				Command:         []string{"/bin/busybox", "sh", "-c", "trap 'exit 0' TERM; " + script},
				VolumeMounts:    []corev1.VolumeMount{{Name: "data", MountPath: "/data"}},
			}},
			Volumes: []corev1.Volume{{
				Name:         "data",
				VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}},
			}},
		},
	}
}

// ContainerLog returns what a container of pod wrote (its first run), read
// from the podLogsDir of the pod's node's kubelet.
func (c *Cluster) ContainerLog(pod *corev1.Pod, container string) (string, error) {
	logs := c.firstNode().PodLogDir
	if n := c.node(pod.Spec.NodeName); n != nil {
		logs = n.PodLogDir
	}
	dir := filepath.Join(logs, pod.Namespace+"_"+pod.Name+"_"+string(pod.UID), container)
	b, err := os.ReadFile(filepath.Join(dir, "0.log"))
	return string(b), err
}

// PodLogDir is where the first node's kubelet keeps the containers' logs
// (Node.PodLogDir: each node's).
func (c *Cluster) PodLogDir() string { return c.firstNode().PodLogDir }

// Wait calls done every 100 ms until it reports true, returns an error, the
// timeout passes or a daemon of the cluster exits.
func (c *Cluster) Wait(ctx context.Context, what string, timeout time.Duration, done func(ctx context.Context) (bool, error)) error {
	return c.poll(what, timeout, func() error {
		if err := ctx.Err(); err != nil {
			return err
		}
		ok, err := done(ctx)
		if err != nil {
			return err
		}
		if !ok {
			return errNotReady
		}
		return nil
	})
}

// PodPhase waits until the pod reaches phase; a pod that fails (or
// succeeds when phase is Running) is an error that names its log.
func (c *Cluster) PodPhase(ctx context.Context, namespace, name string, phase corev1.PodPhase, timeout time.Duration) (*corev1.Pod, error) {
	var pod *corev1.Pod
	err := c.Wait(ctx, fmt.Sprintf("pod %s/%s %s", namespace, name, phase), timeout, func(ctx context.Context) (bool, error) {
		p, err := c.Client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		pod = p
		switch {
		case p.Status.Phase == phase:
			return true, nil
		case p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded:
			log, _ := c.ContainerLog(p, "main")
			return false, fmt.Errorf("pod %s/%s is %s: %s", namespace, name, p.Status.Phase, log)
		}
		return false, nil
	})
	return pod, err
}
