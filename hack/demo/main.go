// Command demo brings up a real Kubernetes cluster of one node or more
// (internal/harness/cluster) in a network namespace of its own, as the
// tests do, deploys loopvol on it with `kubectl apply --server-side -k` and
// takes a claim from PVC to a running Pod and back, showing each step as it
// happens; then it tears everything down. `make demo` builds what is
// missing first; `make demo NODES=2 OVERLAY=shared` picks the nodes and
// the overlay; `make demo KEEP=1` keeps the cluster up until Ctrl-C, its
// API reachable from the host's network. docs/cluster.md tells more.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/loopvol/loopvol/internal/harness/cluster"
)

// overlays are the values of -overlay: the overlays of deploy/kubernetes
// the demo deploys.
var overlays = []string{"local", "shared", "distributed"}

// options are the demo's flags.
type options struct {
	root, dir, bin, images string
	keep                   bool
	nodes                  int
	overlay                string
}

func (o *options) validate() error {
	var errs []error
	if o.nodes < 1 || o.nodes > cluster.MaxNodes {
		errs = append(errs, fmt.Errorf("-nodes %d (NODES): want 1 to %d", o.nodes, cluster.MaxNodes))
	}
	if !slices.Contains(overlays, o.overlay) {
		errs = append(errs, fmt.Errorf("-overlay %q (OVERLAY): want one of %s", o.overlay, strings.Join(overlays, ", ")))
	}
	if o.overlay == "distributed" && o.nodes == 1 {
		// Tried: the claim stays Pending for good, its provisioner
		// logging "dial tcp 10.0.0.1:443: connect: network is
		// unreachable". A node of a cluster of nodes routes everything
		// through the control plane's namespace; a one-node cluster's
		// namespace has no default route.
		errs = append(errs, errors.New("-overlay distributed (OVERLAY) needs -nodes 2 or more (NODES=2): the csi-provisioner it adds to the node pods reaches the API through the kubernetes Service (10.0.0.1), which a one-node cluster here cannot route"))
	}
	// Absolute: the cluster's daemons and the generated kustomizations
	// resolve them from other directories.
	for _, p := range []*string{&o.root, &o.dir} {
		abs, err := filepath.Abs(*p)
		if err != nil {
			errs = append(errs, err)
		}
		*p = abs
	}
	return errors.Join(errs...)
}

// moves reports whether the demo's Pod can move to another node with its
// volume: a pool every node sees. overlays/local on a cluster of nodes has
// one too: the cluster gives every node the one pool directory unless
// NodePools, which only distributed sets.
func (o *options) moves() bool { return o.nodes > 1 && o.overlay != "distributed" }

func main() {
	var o options
	flag.StringVar(&o.root, "repo", ".", "The repository's top directory.")
	flag.StringVar(&o.dir, "dir", "_run/cluster", "The cluster's state directory.")
	flag.StringVar(&o.bin, "bin", "bin", "The binaries (make cluster-tools).")
	flag.StringVar(&o.images, "images", "_output/images", "The OCI archives (make images cluster-images).")
	flag.BoolVar(&o.keep, "keep", false, "Keep the cluster up after the demo, until Ctrl-C, with its API on the host's 127.0.0.1.")
	flag.IntVar(&o.nodes, "nodes", 1, fmt.Sprintf("The number of nodes, 1 to %d; each of a cluster of nodes has network and mount namespaces of its own.", cluster.MaxNodes))
	flag.StringVar(&o.overlay, "overlay", "local", "The overlay of deploy/kubernetes to deploy: local (overlays/local: one pool, a host directory every node sees), "+
		"shared (overlays/shared as users deploy it, the NFS volume replaced by that host directory) or "+
		"distributed (overlays/distributed: a controller and a pool of its own on every node, each node its own zone; 2 nodes or more).")
	flag.Parse()
	os.Exit(mainWithCode(o))
}

// mainWithCode runs the demo the way the tests run (clustertest.Main): in
// a network namespace of its own with a Node address that exists only
// there, so that ordinary Pods get a pod network and kubectl logs and exec
// reach kubelet. The API port is forwarded from the host's 127.0.0.1,
// which the printed kubeconfig names. The process started on the host
// waits for the one in the namespace, passes Ctrl-C on to it, and exits
// with its code.
func mainWithCode(o options) int {
	if err := o.validate(); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		return 2
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "demo: the cluster needs root (loop devices, mounts, cgroups, network namespaces)")
		return 1
	}
	code, child, err := cluster.InNetNSForwarding(cluster.DefaultNodeIP, cluster.DefaultAPIPort)
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		return 1
	}
	if !child {
		return code
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		return 1
	}
	return 0
}

// demo is the state of one run.
type demo struct {
	o     options
	c     *cluster.Cluster
	start time.Time
	step  string
}

func (d *demo) say(format string, args ...any) {
	fmt.Printf("[%6.1fs] %s\n", time.Since(d.start).Seconds(), fmt.Sprintf(format, args...))
}

// run does the demo's steps; the first that fails ends it, with the step's
// name and where the logs are, and the cluster is torn down in any case.
func run(ctx context.Context, o options) (err error) {
	d := &demo{o: o, start: time.Now()}
	var archives []string
	for _, i := range []string{"loopvol-node", "loopvol-controller", "csi-provisioner", "pause", "busybox"} {
		archives = append(archives, filepath.Join(o.images, i+".tar"))
	}
	cfg := cluster.Config{Dir: o.dir, BinDir: o.bin, Images: archives, NodeIP: cluster.NetNSNodeIP(), Out: prefixed{d}}
	what := "A one-node cluster"
	if o.nodes > 1 {
		cfg.Nodes, cfg.NodeName = o.nodes, "node"
		// distributed: a local disk per node, each its own pool.
		cfg.NodePools = o.overlay == "distributed"
		if cfg.NodePools {
			cfg.NodePoolBytes = nodePoolBytes
		}
		what = fmt.Sprintf("A cluster of %d nodes (each its own network and mount namespaces, kubelet and containerd, joined by a bridge)", o.nodes)
	}
	d.step = "cluster up"
	fmt.Printf("== 1. %s in a network namespace of its own (control plane %s; the API forwarded from the host's 127.0.0.1:%d): etcd, kube-apiserver, kube-controller-manager, kube-scheduler, containerd, kubelet, kube-proxy\n",
		what, cfg.NodeIP, cluster.DefaultAPIPort)
	c, err := cluster.Up(ctx, cfg)
	if err != nil {
		return fmt.Errorf("step %q failed: %w (logs: %s)", d.step, err, filepath.Join(o.dir, "logs"))
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
			logs, cerr := keepPodLogs(c)
			if cerr != nil {
				logs = fmt.Sprintf("%s (copying them to %s: %v)", logs, filepath.Join(c.LogDir, "pod-logs"), cerr)
			}
			err = fmt.Errorf("step %q failed: %w\n  daemon logs: %s\n  container logs: %s", d.step, err, c.LogDir, logs)
		}
	}()
	for _, s := range []struct {
		name string
		f    func(context.Context) error
	}{
		{"deploy loopvol", d.deploy},
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
	fmt.Printf("== Done: every step passed in %.1fs\n", time.Since(d.start).Seconds())
	if o.keep {
		d.printKeep()
		<-ctx.Done()
	}
	return nil
}

// nodePoolBytes is the size of each node's own pool file system with
// -overlay distributed on a cluster of nodes: small enough to cost
// nothing, and each node's CSIStorageCapacity then is its own disk's.
const nodePoolBytes = 1 << 30

// keepPodLogs copies every node's container logs to <LogDir>/pod-logs/<node>
// and returns that directory: Down keeps the daemons' logs but removes the
// nodes' state, container logs with it, and a failed step's message must
// still point at them afterwards. On an error it returns the nodes' own
// directories instead.
func keepPodLogs(c *cluster.Cluster) (string, error) {
	dst := filepath.Join(c.LogDir, "pod-logs")
	var dirs []string
	for _, n := range c.Nodes() {
		dirs = append(dirs, n.PodLogDir)
	}
	// A failed run's copy from before goes first: CopyFS never overwrites.
	if err := os.RemoveAll(dst); err != nil {
		return strings.Join(dirs, ", "), err
	}
	for _, n := range c.Nodes() {
		if err := os.CopyFS(filepath.Join(dst, n.Name), os.DirFS(n.PodLogDir)); err != nil {
			return strings.Join(dirs, ", "), err
		}
	}
	return dst, nil
}

func (d *demo) deploy(ctx context.Context) error {
	overlays := filepath.Join(d.o.root, "deploy", "kubernetes", "overlays")
	var from string
	switch d.o.overlay {
	case "local":
		fmt.Println("== 2. loopvol: kubectl apply --server-side -k (overlays/local, with kubelet's directory and the pool under the cluster's)")
		from = filepath.Join(overlays, "local")
	case "distributed":
		fmt.Println("== 2. loopvol: kubectl apply --server-side -k (overlays/distributed: the controller side on every node, --node-deployment; each node's pool its own, each node its own zone)")
		from = filepath.Join(overlays, "distributed")
	case "shared":
		fmt.Println("== 2. loopvol: kubectl apply --server-side -k (overlays/shared as users deploy it; only its NFS pool volume replaced by a host directory every node sees, the stand-in for NFS, which this kernel cannot mount, and overlays/local's images, pull policy, host network and API address)")
		gen, err := sharedOverlay(filepath.Join(overlays, "local"), filepath.Join(overlays, "shared"), filepath.Join(d.o.dir, "demo-shared"))
		if err != nil {
			return err
		}
		d.say("wrote %s", filepath.Join(gen, "kustomization.yaml"))
		from = gen
	}
	overlay, err := d.c.Overlay(from)
	if err != nil {
		return err
	}
	return d.c.Deploy(ctx, overlay)
}

func (d *demo) registration(ctx context.Context) error {
	fmt.Println("== 3. kubelet registered the driver (through the registrar's socket) and wrote CSINode; the sidecar published capacity")
	for _, node := range d.c.Nodes() {
		n, err := d.c.Client.StorageV1().CSINodes().Get(ctx, node.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, drv := range n.Spec.Drivers {
			count := "unset"
			if drv.Allocatable != nil && drv.Allocatable.Count != nil {
				count = fmt.Sprint(*drv.Allocatable.Count)
			}
			d.say("CSINode %s (address %s): driver %s, nodeID %s, topology keys %v, allocatable count %s", n.Name, node.IP, drv.Name, drv.NodeID, drv.TopologyKeys, count)
		}
	}
	_, err := d.capacities(ctx, "before")
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
	// What an operator sees of it, with the kubectl plugin.
	if err := d.plugin(ctx, "status"); err != nil {
		return err
	}
	if err := d.plugin(ctx, "describe", "pvc", "data", "-n", ns); err != nil {
		return err
	}

	w, err := core.Pods(ns).Get(ctx, "writer", metav1.GetOptions{})
	if err != nil {
		return err
	}
	from := w.Spec.NodeName
	if d.o.moves() {
		// As a drain would, without evicting loopvol's own node pod.
		fmt.Printf("== 5. Node %s cordoned, the Pod deleted; a new one, scheduled to another node, reads the file back (the volume detached from %s, attached to the other)\n", from, from)
		if err := d.cordon(ctx, from, true); err != nil {
			return err
		}
	} else {
		fmt.Println("== 5. The Pod deleted; a new one reads the file back")
		if d.o.nodes > 1 {
			d.say("the volume lives in node %s's own pool: the new Pod is scheduled there again (the PV's node affinity, the node's zone)", from)
		}
	}
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
	if d.o.moves() {
		r, err := core.Pods(ns).Get(ctx, "reader", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if r.Spec.NodeName == from {
			return fmt.Errorf("reader runs on %s, the cordoned node", from)
		}
		if err := d.cordon(ctx, from, false); err != nil {
			return err
		}
		d.say("reader on node %s read /data/file, sha256 %s: the same as the writer's on %s", r.Spec.NodeName, sum2, from)
	} else {
		d.say("reader read /data/file, sha256 %s: the same", sum2)
	}

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
	// old are the VolumeAttachments of the last Pod, by name, and their
	// nodes: on a move to another node, the detach shows.
	old := map[string]string{}
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
			current := map[string]bool{}
			for _, va := range vas.Items {
				if va.Spec.Source.PersistentVolumeName == nil || *va.Spec.Source.PersistentVolumeName != pvc.Spec.VolumeName {
					continue
				}
				current[va.Name] = true
				if va.CreationTimestamp.Time.Before(t0.Truncate(time.Second)) {
					old[va.Name] = va.Spec.NodeName
					mark("VolumeAttachment %s (node %s) still there from the last Pod", va.Name, va.Spec.NodeName)
					continue
				}
				mark("VolumeAttachment %s created for node %s (attach/detach controller)", va.Name, va.Spec.NodeName)
				if va.Status.Attached {
					mark("VolumeAttachment attached to node %s (loopvol sidecar: ControllerPublishVolume)", va.Spec.NodeName)
				}
			}
			for name, node := range old {
				if !current[name] {
					mark("VolumeAttachment %s gone: detached from node %s (ControllerUnpublishVolume, after kubelet unstaged it)", name, node)
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

// plugin runs `kubectl loopvol` (bin/kubectl-loopvol, which make demo
// builds) with the cluster's kubeconfig and prints what it shows.
func (d *demo) plugin(ctx context.Context, args ...string) error {
	fmt.Printf("   $ kubectl loopvol %s\n", strings.Join(args, " "))
	cmd := exec.CommandContext(ctx, filepath.Join(d.o.bin, "kubectl-loopvol"), append([]string{"--kubeconfig", d.c.Kubeconfig}, args...)...)
	out, err := cmd.CombinedOutput()
	for _, line := range strings.Split(strings.TrimRight(string(out), "\n"), "\n") {
		fmt.Println("   " + line)
	}
	if err != nil {
		return fmt.Errorf("kubectl loopvol %s: %w", strings.Join(args, " "), err)
	}
	return nil
}

// cordon marks the node unschedulable (kubectl cordon), or schedulable
// again.
func (d *demo) cordon(ctx context.Context, node string, on bool) error {
	patch := fmt.Sprintf(`{"spec":{"unschedulable":%t}}`, on)
	if _, err := d.c.Client.CoreV1().Nodes().Patch(ctx, node, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		return err
	}
	if on {
		d.say("node %s cordoned (kubectl cordon %s)", node, node)
	} else {
		d.say("node %s uncordoned (kubectl uncordon %s)", node, node)
	}
	return nil
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
