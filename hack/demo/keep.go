package main

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/loopvol/loopvol/internal/harness/cluster"
)

// printKeep prints how to work in the cluster that KEEP=1 keeps up: from
// any shell of the host (the API is forwarded there), in a node's
// namespaces, and how to fail a node (cut its link, stop its processes).
func (d *demo) printKeep() {
	c := d.c
	// This process holds the control plane's network namespace (the one
	// InNetNS made): the nodes' bridge and their links are there.
	self := os.Getpid()
	fmt.Printf(`
The cluster stays up until Ctrl-C. From any shell of the host (the API is forwarded to its 127.0.0.1:%d):
  export KUBECONFIG=%s
  alias kubectl=%s
  kubectl get nodes -o wide
  kubectl -n loopvol get pods,csistoragecapacities -o wide
  kubectl get pv,pvc,volumeattachments -A
  kubectl run bb --image=%s --image-pull-policy=Never --restart=Never -- sh -c 'trap "exit 0" TERM; hostname -i; sleep 3600 & wait'   # an ordinary Pod, on the pods' network
  kubectl logs bb
  kubectl exec bb -- busybox ip -4 addr show eth0
  kubectl delete pod bb

The control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler): address %s, pid %d,
  network namespace /proc/%d/ns/net (nsenter -t %d -n); daemon logs %s
`, cluster.DefaultAPIPort, c.Kubeconfig, c.KubectlPath(), cluster.BusyboxImage, cluster.NetNSNodeIP(), self, self, self, c.LogDir)
	for _, n := range c.Nodes() {
		if n.PID == 0 {
			fmt.Printf("Node %s: address %s; its kubelet, containerd and kube-proxy run in the control plane's namespaces; container logs %s\n", n.Name, n.IP, n.PodLogDir)
			continue
		}
		stop := fmt.Sprintf("$(find -L /proc/[0-9]*/ns/net -maxdepth 0 -samefile %s 2>/dev/null | cut -d/ -f3)", n.NetNS)
		if cg := podCgroup(n); cg != "" {
			// The pods not on the host network are in namespaces of
			// their own, but in the node's cgroup.
			stop += fmt.Sprintf(" $(find %s -name cgroup.procs -exec cat {} +)", cg)
		}
		fmt.Printf(`Node %s: address %s, pod range %s, pid %d: network namespace %s, mounts %s
  a shell in it:   nsenter -t %d -n -m -u
  cut its link:    nsenter --net=/proc/%d/ns/net ip link set %s down   (and up again: ... up)
  stop all of its processes (kubelet, containerd, kube-proxy, the shims, its pods):
                   kill -STOP %s
                   (the same with -CONT resumes them; do so before Ctrl-C, or the teardown waits for them)
  container logs %s
`, n.Name, n.IP, n.PodCIDR, n.PID, n.NetNS, n.MountNS, n.PID, self, n.Link, stop, n.PodLogDir)
	}
}

// podCgroup is the cgroup that holds the node's pods in the pids hierarchy
// (or the unified one of cgroup v2): the cgroupRoot of the node's kubelet,
// read from the configuration it runs with, or "" when it has none of its
// own.
func podCgroup(n cluster.Node) string {
	f, err := os.Open(filepath.Join(n.StateDir, "kubelet-config.yaml"))
	if err != nil {
		return ""
	}
	defer f.Close()
	var root string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if r, ok := strings.CutPrefix(sc.Text(), "cgroupRoot: "); ok {
			root = strings.TrimSpace(r)
		}
	}
	if root == "" {
		return ""
	}
	for _, h := range []string{"/sys/fs/cgroup/pids", "/sys/fs/cgroup"} {
		if _, err := os.Stat(filepath.Join(h, root, "cgroup.procs")); err == nil {
			return filepath.Join(h, root)
		}
	}
	return ""
}
