package cluster

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/loopvol/loopvol/internal/harness/proc"
)

// Node is one node of a running cluster, as a test or an operator acts on
// it.
type Node struct {
	// Name is the Node's name.
	Name string
	// IP is the Node's address ("" on a one-node cluster without
	// Config.NodeIP).
	IP string
	// PodCIDR is the range of the node's pod bridge ("" without IP).
	PodCIDR string
	// PID is the process that holds the node's network, mount and UTS
	// namespaces, in which every daemon of the node runs; 0 on a
	// one-node cluster, whose daemons run in this process's namespaces.
	PID int
	// NetNS and MountNS name those namespaces for nsenter(1) or
	// setns(2) (/proc/<PID>/ns/net and /ns/mnt); "" on a one-node cluster.
	NetNS, MountNS string
	// Link is the node's end of the cable: the veth device in this
	// process's network namespace, on the nodes' bridge, whose going down
	// cuts the node off from the API server and the other nodes ("" on a
	// one-node cluster).
	Link string
	// ContainerdSocket is the node's containerd socket, reachable from
	// this process.
	ContainerdSocket string
	// StateDir holds the node's own state: containerd's, the pods' logs,
	// and on a cluster of nodes kubelet's root (which the node sees at
	// the cluster's KubeletDir) and, with Config.NodePools, its pools.
	StateDir string
	// PodLogDir holds the logs of the node's containers.
	PodLogDir string
}

// node is a Node and what Up and Down keep of it.
type node struct {
	Node
	index         int
	containerdDir string
	// ns is the namespace holder of a node of a cluster of nodes (nil on
	// a one-node cluster).
	ns *nodeNS
	// cgroupRoot is kubelet's cgroupRoot: its default on a one-node
	// cluster, one of its own on each node of a cluster of nodes (two
	// kubelets under one kubepods would each take the other's pods for
	// orphans).
	cgroupRoot                      string
	kubeletPort, kubeletHealthzPort int
	// mu in Cluster guards kubelet, which StopKubelet and StartKubelet
	// change while the cluster runs.
	kubelet, containerd *proc.Process
	// kubeletArgs and kubeletEnv start kubelet again (StartKubelet).
	kubeletArgs []string
	kubeletEnv  []string
	// frozen: FreezeNode stopped the node's processes, stopped (by PID),
	// and ThawNode has not continued them yet; Down thaws it first. Both
	// guarded by mu in Cluster.
	frozen  bool
	stopped map[int]bool
}

// multi reports whether the cluster has nodes of their own namespaces.
func (c *Cluster) multi() bool { return c.cfg.Nodes > 1 }

// daemonName is the process (and log) name of a node's daemon: name itself
// on a one-node cluster, name-<node> on a cluster of nodes.
func (c *Cluster) daemonName(n *node, name string) string {
	if !c.multi() {
		return name
	}
	return name + "-" + n.Name
}

// newNodes lays out the nodes: on a one-node cluster the one node's state
// is the cluster's directory itself, as it always was; on a cluster of
// nodes each has <Dir>/nodes/<name>, an address on the nodes' bridge and
// a pod range of its own.
func (c *Cluster) newNodes() []*node {
	if !c.multi() {
		n := &node{Node: Node{Name: c.cfg.NodeName, IP: c.cfg.NodeIP, StateDir: c.cfg.Dir}}
		if n.IP != "" {
			n.PodCIDR = c.cfg.PodCIDR
		}
		c.layOut(n)
		return []*node{n}
	}
	var nodes []*node
	for i := range c.cfg.Nodes {
		name := fmt.Sprintf("%s-%d", c.cfg.NodeName, i+1)
		n := &node{
			Node: Node{
				Name:     name,
				IP:       nodeAddress(c.cfg.NodeIP, i),
				PodCIDR:  nodePodCIDR(i),
				StateDir: filepath.Join(c.cfg.Dir, "nodes", name),
				Link:     fmt.Sprintf("lvnode%d", i+1),
			},
			index:              i,
			cgroupRoot:         "/loopvol-" + name,
			kubeletPort:        10250,
			kubeletHealthzPort: 10248,
		}
		c.layOut(n)
		nodes = append(nodes, n)
	}
	return nodes
}

func (c *Cluster) layOut(n *node) {
	n.containerdDir = filepath.Join(n.StateDir, "containerd")
	n.ContainerdSocket = filepath.Join(n.containerdDir, "containerd.sock")
	n.PodLogDir = filepath.Join(n.StateDir, "pod-logs")
}

// nodeAddress is the address of the node i of a cluster of nodes: in the
// control plane's /24, from .11 on.
func nodeAddress(controlPlane string, i int) string {
	ip := net.ParseIP(controlPlane).To4()
	return net.IPv4(ip[0], ip[1], ip[2], byte(11+i)).String()
}

// nodesNetwork is the /24 of the control plane's address, the nodes'.
func nodesNetwork(controlPlane string) string {
	ip := net.ParseIP(controlPlane).To4()
	return (&net.IPNet{IP: ip.Mask(net.CIDRMask(24, 32)), Mask: net.CIDRMask(24, 32)}).String()
}

// nodePodCIDR is the pod range of the node i of a cluster of nodes, inside
// clusterPodCIDR.
func nodePodCIDR(i int) string { return fmt.Sprintf("10.201.%d.0/24", i+1) }

// clusterPodCIDR holds every node's pod range (kube-proxy's --cluster-cidr
// on a cluster of nodes).
const clusterPodCIDR = "10.201.0.0/16"

// startOn runs the daemon name of BinDir on node n: in the node's
// namespaces through nsenter on a cluster of nodes.
func (c *Cluster) startOn(n *node, name string, env []string, args ...string) (*proc.Process, error) {
	bin := filepath.Join(c.cfg.BinDir, name)
	if n.ns != nil {
		args = append(n.ns.enter(bin), args...)
		bin = nsenterPath
	}
	return c.run(c.daemonName(n, name), name, bin, env, args...)
}

// upContainerd starts containerd on n and imports the images.
func (c *Cluster) upContainerd(n *node) error {
	step := time.Now()
	for _, d := range []string{n.containerdDir, filepath.Join(n.StateDir, "cni"), n.PodLogDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if err := os.WriteFile(filepath.Join(n.StateDir, "cni", "10-pods.conflist"), []byte(c.cniConfig(n)), 0o644); err != nil {
		return err
	}
	conf := filepath.Join(n.containerdDir, "config.toml")
	if err := os.WriteFile(conf, []byte(c.containerdConfig(n)), 0o644); err != nil {
		return err
	}
	path := c.pathEnv()
	var err error
	if n.containerd, err = c.startOn(n, "containerd", []string{path}, "--config="+conf, "--log-level=warn"); err != nil {
		return err
	}
	if err := c.poll(c.daemonName(n, "containerd")+" serving", time.Minute, func() error {
		_, err := c.ctr(n, "version")
		return err
	}); err != nil {
		return err
	}
	for _, img := range c.cfg.Images {
		if _, err := c.ctr(n, "images", "import", "--local", img); err != nil {
			return fmt.Errorf("node %s: import %s: %w", n.Name, img, err)
		}
	}
	c.say("cluster: node %s: containerd up in %s, %d images imported", n.Name, since(step), len(c.cfg.Images))
	return nil
}

// upKubelet starts kubelet on n; it does not wait for the Node to be Ready.
func (c *Cluster) upKubelet(n *node) error {
	path := c.pathEnv()

	if n.cgroupRoot != "" {
		if err := makeCgroupRoot(n.cgroupRoot); err != nil {
			return err
		}
	}
	kconf := filepath.Join(n.StateDir, "kubelet-config.yaml")
	if err := os.WriteFile(kconf, []byte(c.kubeletConfig(n)), 0o644); err != nil {
		return err
	}
	kubeconfig, err := c.nodeKubeconfig(n, "kubelet")
	if err != nil {
		return err
	}
	args := []string{
		"--config=" + kconf,
		"--kubeconfig=" + kubeconfig,
		"--root-dir=" + c.KubeletDir,
		"--hostname-override=" + n.Name,
		"--v=2"}
	if n.IP != "" {
		args = append(args, "--node-ip="+n.IP)
	}
	n.kubeletArgs, n.kubeletEnv = args, []string{path}
	return c.runKubelet(n)
}

// pathEnv is containerd's and kubelet's PATH: BinDir first, where
// containerd finds its shim.
func (c *Cluster) pathEnv() string { return "PATH=" + c.cfg.BinDir + ":" + os.Getenv("PATH") }

// nodeKubeconfig writes the kubeconfig of a node's daemon (kubelet,
// kube-proxy): with the certificate of that node's kubelet, or the
// component's own, and, on a cluster of nodes, the API server at the
// control plane's address, which is what a node reaches it by.
func (c *Cluster) nodeKubeconfig(n *node, component string) (string, error) {
	cert := component
	if component == "kubelet" {
		cert = c.kubeletCertName(n, false)
	}
	if !c.multi() {
		return c.kubeconfig(cert)
	}
	server := "https://" + net.JoinHostPort(c.cfg.NodeIP, strconv.Itoa(c.cfg.APIPort))
	return c.kubeconfigFor(cert, c.daemonName(n, component), server)
}

// kubeletCertName names a node's kubelet certificate (client, or serving).
func (c *Cluster) kubeletCertName(n *node, serving bool) string {
	name := "kubelet"
	if serving {
		name = "kubelet-serving"
	}
	return c.daemonName(n, name)
}

// nodesReady waits until every node is Ready without the not-ready taint.
func (c *Cluster) nodesReady(ctx context.Context) error {
	for _, n := range c.nodes {
		if err := c.poll("node "+n.Name+" Ready without the not-ready taint", 3*time.Minute, func() error {
			node, err := c.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			for _, t := range node.Spec.Taints {
				if t.Key == corev1.TaintNodeNotReady {
					return fmt.Errorf("taint %s", t.Key)
				}
			}
			for _, cond := range node.Status.Conditions {
				if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
					return nil
				}
			}
			return errNotReady
		}); err != nil {
			return err
		}
	}
	return nil
}

// startProxy runs kube-proxy on n (iptables mode, in n's network namespace,
// or the one InNetNS made) and waits until it has programmed the Services.
func (c *Cluster) startProxy(n *node, healthzPort, metricsPort int) error {
	kubeconfig, err := c.nodeKubeconfig(n, "kube-proxy")
	if err != nil {
		return err
	}
	// On a cluster of nodes its ports are the node's own (its address,
	// its namespace): this process reaches them there.
	local, clusterCIDR := "127.0.0.1", n.PodCIDR
	if c.multi() {
		local, clusterCIDR = n.IP, clusterPodCIDR
	}
	if _, err := c.startOn(n, "kube-proxy", nil,
		"--kubeconfig="+kubeconfig,
		"--hostname-override="+n.Name,
		"--bind-address="+n.IP,
		"--proxy-mode=iptables",
		"--cluster-cidr="+clusterCIDR,
		"--healthz-bind-address="+net.JoinHostPort(local, strconv.Itoa(healthzPort)),
		"--metrics-bind-address="+net.JoinHostPort(local, strconv.Itoa(metricsPort)),
		// The conntrack table's size is the host's, not the namespace's:
		// leave it and the timeouts as they are.
		"--conntrack-max-per-core=0",
		"--conntrack-tcp-timeout-established=0", "--conntrack-tcp-timeout-close-wait=0",
		"--v=1"); err != nil {
		return err
	}
	// /healthz answers 200 once the rules are synced.
	url := "http://" + net.JoinHostPort(local, strconv.Itoa(healthzPort)) + "/healthz"
	return c.poll(c.daemonName(n, "kube-proxy")+" synced", time.Minute, func() error { return httpOK(http.DefaultClient, url) })
}

// Nodes are the cluster's nodes, in the order of their names.
func (c *Cluster) Nodes() []Node {
	out := make([]Node, 0, len(c.nodes))
	for _, n := range c.nodes {
		out = append(out, n.Node)
	}
	return out
}

// node is the node called name, or nil.
func (c *Cluster) node(name string) *node {
	for _, n := range c.nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// SetLink cuts the node name off from the API server and the other nodes
// (up false: its veth on the bridge goes down, as when a cable is pulled),
// or connects it again. Only on a cluster of nodes.
func (c *Cluster) SetLink(name string, up bool) error {
	n := c.node(name)
	if n == nil || n.Link == "" {
		return fmt.Errorf("node %q: no link of its own (a cluster of nodes has one per node)", name)
	}
	state := "down"
	if up {
		state = "up"
	}
	if err := ip("link", "set", n.Link, state); err != nil {
		return err
	}
	c.say("cluster: node %s: link %s %s", name, n.Link, state)
	return nil
}

// StopKubeletOn and StartKubeletOn stop and start the kubelet of the node
// name, as StopKubelet and StartKubelet do the first node's.
func (c *Cluster) StopKubeletOn(name string) error {
	n := c.node(name)
	if n == nil {
		return fmt.Errorf("no node %q", name)
	}
	c.stopKubelet(n)
	return nil
}

// StartKubeletOn: StopKubeletOn says.
func (c *Cluster) StartKubeletOn(name string) error {
	n := c.node(name)
	if n == nil {
		return fmt.Errorf("no node %q", name)
	}
	return c.startKubelet(n)
}
