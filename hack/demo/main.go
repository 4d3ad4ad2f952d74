// Command demo brings up a real one-node Kubernetes cluster
// (internal/harness/cluster), deploys loopvol on it with `kubectl apply
// --server-side -k` and takes a claim from PVC to a running Pod, showing
// each step as it happens; then it tears everything down. `make demo` builds
// what is missing first; `make demo KEEP=1` keeps the cluster up until
// Ctrl-C. docs/cluster.md tells more.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/loopvol/loopvol/internal/harness/cluster"
)

func main() {
	root := flag.String("repo", ".", "The repository's top directory.")
	dir := flag.String("dir", "_run/cluster", "The cluster's state directory.")
	bin := flag.String("bin", "bin", "The binaries (make cluster-tools).")
	images := flag.String("images", "_output/images", "The OCI archives (make images cluster-images).")
	keep := flag.Bool("keep", false, "Keep the cluster up after the demo, until Ctrl-C.")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *root, *dir, *bin, *images, *keep); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

// demo is the state of one run.
type demo struct {
	c     *cluster.Cluster
	start time.Time
	step  string
}

func (d *demo) say(format string, args ...any) {
	fmt.Printf("[%6.1fs] %s\n", time.Since(d.start).Seconds(), fmt.Sprintf(format, args...))
}

// run does the demo's steps; the first that fails ends it, with the step's
// name and where the logs are, and the cluster is torn down in any case.
func run(ctx context.Context, root, dir, bin, imageDir string, keep bool) (err error) {
	if os.Geteuid() != 0 {
		return errors.New("the cluster needs root (loop devices, mounts, cgroups)")
	}
	d := &demo{start: time.Now()}
	var archives []string
	for _, i := range []string{"loopvol-node", "loopvol-controller", "csi-provisioner", "pause", "busybox"} {
		archives = append(archives, filepath.Join(imageDir, i+".tar"))
	}
	d.step = "cluster up"
	fmt.Println("== 1. A one-node cluster on loopback: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, containerd, kubelet")
	c, err := cluster.Up(ctx, cluster.Config{Dir: dir, BinDir: bin, Images: archives, Out: prefixed{d}})
	if err != nil {
		return fmt.Errorf("step %q failed: %w (logs: %s)", d.step, err, filepath.Join(dir, "logs"))
	}
	d.c = c
	defer func() {
		fmt.Println("== Teardown")
		if derr := c.Down(context.Background()); derr != nil {
			err = errors.Join(err, fmt.Errorf("teardown: %w", derr))
		}
	}()
	defer func() {
		if err != nil {
			err = fmt.Errorf("step %q failed: %w\n  daemon logs: %s\n  container logs: %s", d.step, err, c.LogDir, c.PodLogDir())
		}
	}()
	for _, s := range []struct {
		name string
		f    func(context.Context) error
	}{
		{"deploy loopvol", func(ctx context.Context) error { return d.deploy(ctx, root) }},
		{"CSINode and capacity", d.registration},
		{"PVC and Pod", d.claimToPod},
		{"invalid StorageClass", d.invalidClass},
	} {
		d.step = s.name
		if err := s.f(ctx); err != nil {
			return err
		}
	}
	d.step = ""
	fmt.Println("== Done: every step passed")
	if keep {
		fmt.Printf(`
The cluster stays up until Ctrl-C. In another shell:
  export KUBECONFIG=%s
  %s get nodes,csinodes,csidrivers
  %s -n loopvol get pods,csistoragecapacities
  %s get pv,pvc,volumeattachments -A
  ls %s   # container logs (kubectl logs needs a node address; there is none)
`, c.Kubeconfig, c.KubectlPath(), c.KubectlPath(), c.KubectlPath(), c.PodLogDir())
		<-ctx.Done()
	}
	return nil
}

func (d *demo) deploy(ctx context.Context, root string) error {
	fmt.Println("== 2. loopvol: kubectl apply --server-side -k (overlays/local, with kubelet's directory and the pool under the cluster's)")
	overlay, err := d.c.Overlay(filepath.Join(root, "deploy", "kubernetes", "overlays", "local"))
	if err != nil {
		return err
	}
	return d.c.Deploy(ctx, overlay)
}

func (d *demo) registration(ctx context.Context) error {
	fmt.Println("== 3. kubelet registered the driver (through the registrar's socket) and wrote CSINode; the sidecar published capacity")
	n, err := d.c.Client.StorageV1().CSINodes().Get(ctx, d.c.NodeName, metav1.GetOptions{})
	if err != nil {
		return err
	}
	for _, drv := range n.Spec.Drivers {
		count := "unset"
		if drv.Allocatable != nil && drv.Allocatable.Count != nil {
			count = fmt.Sprint(*drv.Allocatable.Count)
		}
		d.say("CSINode %s: driver %s, nodeID %s, topology keys %v, allocatable count %s", n.Name, drv.Name, drv.NodeID, drv.TopologyKeys, count)
	}
	_, err = d.capacities(ctx, "before")
	return err
}

// capacities waits for the CSIStorageCapacity objects of class loopvol
// and prints them.
func (d *demo) capacities(ctx context.Context, when string) (map[string]string, error) {
	var list *storagev1.CSIStorageCapacityList
	if err := d.c.Wait(ctx, "CSIStorageCapacity of class loopvol", 2*time.Minute, func(ctx context.Context) (bool, error) {
		l, err := d.c.Client.StorageV1().CSIStorageCapacities(cluster.Namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		list = l
		return len(l.Items) > 0, nil
	}); err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, c := range list.Items {
		capacity, maxSize := "-", "-"
		if c.Capacity != nil {
			capacity = c.Capacity.String()
		}
		if c.MaximumVolumeSize != nil {
			maxSize = c.MaximumVolumeSize.String()
		}
		out[c.Name] = capacity
		d.say("CSIStorageCapacity %s (%s): class %s, topology %v, capacity %s, maximumVolumeSize %s", c.Name, when, c.StorageClassName, c.NodeTopology.MatchLabels, capacity, maxSize)
	}
	return out, nil
}

func (d *demo) claimToPod(ctx context.Context) error {
	fmt.Println("== 4. A PVC of class loopvol and a Pod that writes a file")
	ns := "demo"
	core := d.c.Client.CoreV1()
	if _, err := core.Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	t0 := time.Now()
	if _, err := core.PersistentVolumeClaims(ns).Create(ctx, cluster.Claim(ns, "data", "loopvol", "64Mi"), metav1.CreateOptions{}); err != nil {
		return err
	}
	d.say("PVC %s/data created (64Mi, WaitForFirstConsumer: it waits for a Pod)", ns)
	writer := cluster.VolumePod(ns, "writer", "data",
		"busybox dd if=/dev/urandom of=/data/file bs=1M count=8 2>/dev/null && busybox sha256sum /data/file | busybox tee /data/file.sha256 && busybox sleep 1000000 & wait")
	if _, err := core.Pods(ns).Create(ctx, writer, metav1.CreateOptions{}); err != nil {
		return err
	}
	d.say("Pod %s/writer created", ns)
	if err := d.follow(ctx, ns, "writer", t0); err != nil {
		return err
	}
	sum, err := d.checksum(ctx, ns, "writer")
	if err != nil {
		return err
	}
	d.say("writer wrote /data/file, sha256 %s", sum)
	if _, err := d.capacities(ctx, "after provisioning"); err != nil {
		return err
	}

	fmt.Println("== 5. The Pod deleted; a new one reads the file back")
	if err := d.deletePod(ctx, ns, "writer"); err != nil {
		return err
	}
	reader := cluster.VolumePod(ns, "reader", "data", "busybox sha256sum /data/file && busybox sleep 1000000 & wait")
	t1 := time.Now()
	if _, err := core.Pods(ns).Create(ctx, reader, metav1.CreateOptions{}); err != nil {
		return err
	}
	if err := d.follow(ctx, ns, "reader", t1); err != nil {
		return err
	}
	sum2, err := d.checksum(ctx, ns, "reader")
	if err != nil {
		return err
	}
	if sum2 != sum {
		return fmt.Errorf("reader's sha256 %s differs from the writer's %s", sum2, sum)
	}
	d.say("reader read /data/file, sha256 %s: the same", sum2)

	fmt.Println("== 6. The Pod and the PVC deleted: detached, unstaged, the volume deleted")
	if err := d.deletePod(ctx, ns, "reader"); err != nil {
		return err
	}
	pvc, err := core.PersistentVolumeClaims(ns).Get(ctx, "data", metav1.GetOptions{})
	if err != nil {
		return err
	}
	if err := core.PersistentVolumeClaims(ns).Delete(ctx, "data", metav1.DeleteOptions{}); err != nil {
		return err
	}
	if err := d.c.Wait(ctx, "PV "+pvc.Spec.VolumeName+" deleted", 2*time.Minute, func(ctx context.Context) (bool, error) {
		_, err := core.PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	}); err != nil {
		return err
	}
	d.say("PV %s deleted, its image gone from the pool", pvc.Spec.VolumeName)
	_, err = d.capacities(ctx, "after deletion")
	return err
}

// follow prints the pod's way to Running as it happens: scheduled, the
// claim bound (provisioned), the VolumeAttachment attached, the volume
// staged and published by kubelet (the pod's volume mounted), Running.
func (d *demo) follow(ctx context.Context, ns, name string, t0 time.Time) error {
	seen := map[string]bool{}
	if pvc, err := d.c.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "data", metav1.GetOptions{}); err == nil && pvc.Status.Phase == corev1.ClaimBound {
		d.say("  PVC still bound to %s", pvc.Spec.VolumeName)
		seen["PVC bound to %s (csi-provisioner: CreateVolume)"] = true
	}
	mark := func(what string, args ...any) {
		if !seen[what] {
			seen[what] = true
			d.say("  +%.2fs %s", time.Since(t0).Seconds(), fmt.Sprintf(what, args...))
		}
	}
	return d.c.Wait(ctx, "pod "+ns+"/"+name+" Running", 3*time.Minute, func(ctx context.Context) (bool, error) {
		pod, err := d.c.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if pod.Spec.NodeName != "" {
			mark("scheduled to node %s (the scheduler checked CSIStorageCapacity)", pod.Spec.NodeName)
		}
		pvc, err := d.c.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "data", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if pvc.Status.Phase == corev1.ClaimBound {
			mark("PVC bound to %s (csi-provisioner: CreateVolume)", pvc.Spec.VolumeName)
			vas, err := d.c.Client.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
			if err != nil {
				return false, err
			}
			for _, va := range vas.Items {
				if va.Spec.Source.PersistentVolumeName != nil && *va.Spec.Source.PersistentVolumeName == pvc.Spec.VolumeName {
					if va.CreationTimestamp.Time.Before(t0.Truncate(time.Second)) {
						mark("VolumeAttachment %s still there from the last Pod", va.Name)
						continue
					}
					mark("VolumeAttachment %s created (attach/detach controller)", va.Name)
					if va.Status.Attached {
						mark("VolumeAttachment attached (loopvol sidecar: ControllerPublishVolume)")
					}
				}
			}
		}
		for _, cs := range pod.Status.ContainerStatuses {
			if cs.State.Running != nil || cs.State.Terminated != nil {
				mark("volume staged and published by kubelet (NodeStageVolume, NodePublishVolume), container started")
			}
		}
		switch pod.Status.Phase {
		case corev1.PodRunning:
			mark("Pod Running")
			return true, nil
		case corev1.PodFailed, corev1.PodSucceeded:
			log, _ := d.c.ContainerLog(pod, "main")
			return false, fmt.Errorf("pod %s/%s %s: %s", ns, name, pod.Status.Phase, log)
		}
		return false, nil
	})
}

// checksum waits for the sha256sum line in the pod's log.
func (d *demo) checksum(ctx context.Context, ns, name string) (string, error) {
	pod, err := d.c.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	var sum string
	err = d.c.Wait(ctx, "the checksum in "+name+"'s log", time.Minute, func(context.Context) (bool, error) {
		log, _ := d.c.ContainerLog(pod, "main")
		for _, line := range strings.Split(log, "\n") {
			// CRI log lines: <time> <stream> <tag> <text>.
			f := strings.Fields(line)
			if len(f) == 5 && f[4] == "/data/file" && len(f[3]) == 64 {
				sum = f[3]
				return true, nil
			}
		}
		return false, nil
	})
	return sum, err
}

func (d *demo) deletePod(ctx context.Context, ns, name string) error {
	if err := d.c.Client.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		return err
	}
	t0 := time.Now()
	err := d.c.Wait(ctx, "pod "+ns+"/"+name+" gone", 2*time.Minute, func(ctx context.Context) (bool, error) {
		_, err := d.c.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err == nil {
		d.say("Pod %s/%s deleted in %.2fs (NodeUnpublishVolume; the volume stays staged and attached until no Pod on the node uses it)", ns, name, time.Since(t0).Seconds())
	}
	return err
}

func (d *demo) invalidClass(ctx context.Context) error {
	fmt.Println("== 7. A StorageClass with an invalid pool, denied by loopvol's admission policy")
	sc := &storagev1.StorageClass{
		ObjectMeta:  metav1.ObjectMeta{Name: "loopvol-bad-pool"},
		Provisioner: cluster.DriverName,
		Parameters:  map[string]string{"pool": "Fast_Pool"},
	}
	// The policy is enforced a moment after it was created.
	var denied error
	err := d.c.Wait(ctx, "the StorageClass denied", time.Minute, func(ctx context.Context) (bool, error) {
		_, err := d.c.Client.StorageV1().StorageClasses().Create(ctx, sc, metav1.CreateOptions{})
		switch {
		case err == nil:
			return false, d.c.Client.StorageV1().StorageClasses().Delete(ctx, sc.Name, metav1.DeleteOptions{})
		case apierrors.IsInvalid(err) || apierrors.IsForbidden(err):
			denied = err
			return true, nil
		default:
			return false, err
		}
	})
	if err != nil {
		return err
	}
	d.say("denied: %v", denied)
	return nil
}

// prefixed prints the cluster's own lines with the demo's clock.
type prefixed struct{ d *demo }

func (p prefixed) Write(b []byte) (int, error) {
	for _, line := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		p.d.say("%s", line)
	}
	return len(b), nil
}
