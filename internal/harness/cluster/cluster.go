package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/loopvol/loopvol/internal/harness/proc"
)

// Cluster is a running cluster: one node, or a cluster of nodes
// (Config.Nodes).
type Cluster struct {
	cfg Config

	// Server is the apiserver's URL (https://127.0.0.1:<port>).
	Server string
	// Kubeconfig is the path of a cluster-admin kubeconfig.
	Kubeconfig string
	// Rest is the cluster-admin client configuration.
	Rest *rest.Config
	// Client is a cluster-admin client.
	Client kubernetes.Interface
	// NodeName is the first Node's name (Nodes lists them all).
	NodeName string
	// KubeletDir is kubelet's root directory (<Dir>/kubelet).
	KubeletDir string
	// LogDir holds every daemon's log (<Dir>/logs) and, under pods/, the
	// containers' logs.
	LogDir string
	// ContainerdSocket is containerd's socket.
	ContainerdSocket string

	pki string
	// nodes are the cluster's nodes (one, unless Config.Nodes).
	nodes []*node
	// mu guards procs and each node's kubelet, which StopKubelet and
	// StartKubelet change while the cluster runs.
	mu    sync.Mutex
	procs []*proc.Process
	// created are the directories outside Dir that this cluster made,
	// removed by Down.
	created []string
	// hostLock is HostLockPath or NodesLockPath (clusterLockPath), and
	// dirsLock DirsLockPath shared: both held from Up to the end of Down.
	hostLock, dirsLock *hostLock
	// sysfs holds the network namespace's sysfs read-write (holdSysfs)
	// in a namespace of its own; nil elsewhere.
	sysfs *os.File
	// serviceProxy: kube-proxy routes the Services' ClusterIPs, which it
	// does only in the network namespace InNetNS made for NodeIP (its
	// rules must never reach the host's).
	serviceProxy bool
}

// Up starts the cluster and waits until its node is Ready. On an error it
// tears down what it started. The caller must call Down when Up succeeded.
func Up(ctx context.Context, cfg Config) (*Cluster, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := &Cluster{
		cfg:        cfg,
		NodeName:   cfg.NodeName,
		KubeletDir: filepath.Join(cfg.Dir, "kubelet"),
		LogDir:     filepath.Join(cfg.Dir, "logs"),
		pki:        filepath.Join(cfg.Dir, "pki"),
	}
	c.nodes = c.newNodes()
	c.ContainerdSocket = c.nodes[0].ContainerdSocket
	c.Server = "https://127.0.0.1:" + strconv.Itoa(cfg.APIPort)
	c.serviceProxy = cfg.NodeIP != "" && cfg.NodeIP == NetNSNodeIP() && ownNetNS()
	start := time.Now()
	lock, err := lockHost(ctx, clusterLockPath(cfg.Nodes), false, c.say)
	if err != nil {
		return nil, err
	}
	c.hostLock = lock
	if c.dirsLock, err = lockHost(ctx, DirsLockPath, true, c.say); err != nil {
		c.hostLock.release()
		return nil, err
	}
	if err := c.up(ctx); err != nil {
		c.say("cluster: up failed after %s: %v", since(start), err)
		if derr := c.Down(context.Background()); derr != nil {
			err = errors.Join(err, fmt.Errorf("teardown: %w", derr))
		}
		return nil, err
	}
	var names []string
	for _, n := range c.nodes {
		names = append(names, n.Name)
	}
	c.say("cluster: up in %s (nodes %s Ready; kubeconfig %s; logs %s)", since(start), strings.Join(names, ", "), c.Kubeconfig, c.LogDir)
	return c, nil
}

func (c *Cluster) say(format string, args ...any) {
	fmt.Fprintf(c.cfg.Out, format+"\n", args...)
}

func since(t time.Time) time.Duration { return time.Since(t).Round(10 * time.Millisecond) }

func (c *Cluster) up(ctx context.Context) error {
	for _, n := range c.nodes {
		if pids := pidsWithArg(n.ContainerdSocket); len(pids) > 0 {
			return fmt.Errorf("%s: processes %v of an earlier cluster still run there", c.cfg.Dir, pids)
		}
	}
	if l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(c.cfg.APIPort))); err != nil {
		return fmt.Errorf("apiserver port %d: %w", c.cfg.APIPort, err)
	} else {
		l.Close()
	}
	// Earlier state (a run that was killed) goes; the logs stay, appended
	// to. Its mounts and loop devices lie under Dir: ours to undo.
	if err := c.unmountAll(); err != nil {
		return err
	}
	if err := c.detachLoops(); err != nil {
		return err
	}
	for _, d := range stateDirs {
		if err := c.removeTree(filepath.Join(c.cfg.Dir, d)); err != nil {
			return err
		}
	}
	for _, d := range []string{c.pki, c.LogDir, c.KubeletDir, filepath.Join(c.cfg.Dir, "pools")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if c.cfg.SharedPoolReflinkBytes > 0 {
		if err := c.sharedPoolDisk(); err != nil {
			return err
		}
	}
	// Paths kubelet and containerd use whatever their configuration says.
	for _, d := range []string{"/var/lib/kubelet/device-plugins", "/run/containerd"} {
		if err := c.mkdirOutside(d); err != nil {
			return err
		}
	}

	if ownNetNS() && c.sysfs == nil {
		// A cluster without it works; only the node plugin's loop device
		// tuning fails (and says so in its log).
		if f, err := holdSysfs(c.cfg.Dir); err != nil {
			c.say("cluster: warning: a read-write sysfs for the network namespace: %v", err)
		} else {
			c.sysfs = f
		}
	}

	step := time.Now()
	if err := c.writePKI(); err != nil {
		return fmt.Errorf("certificates: %w", err)
	}
	ports, err := freePorts(8)
	if err != nil {
		return err
	}
	etcdClient, etcdPeer, kcmPort, schedPort := ports[0], ports[1], ports[2], ports[3]
	if !c.multi() {
		// A node of a cluster of nodes has its own address: kubelet's
		// usual ports there.
		c.nodes[0].kubeletPort, c.nodes[0].kubeletHealthzPort = ports[4], ports[5]
	}
	proxyHealthzPort, proxyMetricsPort := ports[6], ports[7]

	// etcd
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(etcdClient)
	peerURL := "http://127.0.0.1:" + strconv.Itoa(etcdPeer)
	if _, err := c.start("etcd", nil,
		"--name=loopvol", "--data-dir="+filepath.Join(c.cfg.Dir, "etcd"),
		"--listen-client-urls="+etcdURL, "--advertise-client-urls="+etcdURL,
		"--listen-peer-urls="+peerURL, "--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=loopvol="+peerURL, "--unsafe-no-fsync", "--log-level=warn"); err != nil {
		return err
	}
	if err := c.poll("etcd healthy", time.Minute, func() error { return httpOK(http.DefaultClient, etcdURL+"/health") }); err != nil {
		return err
	}
	c.say("cluster: etcd up in %s", since(step))

	// kube-apiserver
	step = time.Now()
	pki := func(f string) string { return filepath.Join(c.pki, f) }
	apiserverArgs := []string{
		"--etcd-servers=" + etcdURL,
		"--secure-port=" + strconv.Itoa(c.cfg.APIPort),
		"--tls-cert-file=" + pki("apiserver.crt"), "--tls-private-key-file=" + pki("apiserver.key"),
		"--client-ca-file=" + pki("ca.crt"),
		"--kubelet-client-certificate=" + pki("apiserver-kubelet-client.crt"), "--kubelet-client-key=" + pki("apiserver-kubelet-client.key"),
		"--kubelet-certificate-authority=" + pki("ca.crt"),
		"--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
		"--allow-privileged=true",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + pki("sa.pub"), "--service-account-signing-key-file=" + pki("sa.key"),
		"--service-cluster-ip-range=" + serviceCIDR,
		"--profiling=false", "--v=1"}
	if c.serviceProxy {
		// Pods on the bridge reach the API as on any cluster: through the
		// kubernetes Service, whose endpoint (kept by the apiserver's
		// lease reconciler) is NodeIP, which kube-proxy routes to. Every
		// address of the namespace is the cluster's own.
		apiserverArgs = append(apiserverArgs, "--bind-address=0.0.0.0", "--advertise-address="+c.cfg.NodeIP)
	} else {
		apiserverArgs = append(apiserverArgs, "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
			// The kubernetes Service's endpoint would be 127.0.0.1, which
			// the endpoint reconciler refuses; nothing routes to it anyway.
			"--endpoint-reconciler-type=none")
	}
	if c.cfg.NodeIP != "" {
		apiserverArgs = append(apiserverArgs,
			// The Node's address, not its name (which resolves to the
			// host's), for exec, logs and port-forward.
			"--kubelet-preferred-address-types=InternalIP",
			// Webhooks and aggregated APIs through their Service's
			// endpoints: there is no kube-proxy to route a ClusterIP.
			"--enable-aggregator-routing=true")
	}
	if _, err := c.start("kube-apiserver", nil, apiserverArgs...); err != nil {
		return err
	}
	if c.Kubeconfig, err = c.kubeconfig("admin"); err != nil {
		return err
	}
	if c.Rest, err = clientcmd.BuildConfigFromFlags("", c.Kubeconfig); err != nil {
		return err
	}
	c.Rest.QPS, c.Rest.Burst = 50, 100
	c.Rest.WarningHandler = rest.NewWarningWriter(c.cfg.Out, rest.WarningWriterOptions{Deduplicate: true})
	if c.Client, err = kubernetes.NewForConfig(c.Rest); err != nil {
		return err
	}
	if err := c.poll("kube-apiserver ready", 2*time.Minute, func() error {
		return c.Client.Discovery().RESTClient().Get().AbsPath("/readyz").Do(ctx).Error()
	}); err != nil {
		return err
	}
	c.say("cluster: kube-apiserver up in %s (%s)", since(step), c.Server)

	// Each node's namespaces and containerd (with the images), the
	// controllers, then each node's kubelet: the order one node always
	// had.
	step = time.Now()
	if c.multi() {
		if err := c.nodeBridgeUp(); err != nil {
			return fmt.Errorf("the nodes' bridge: %w", err)
		}
		for _, n := range c.nodes {
			if err := c.startNodeNS(n); err != nil {
				return err
			}
		}
		c.say("cluster: %d nodes' namespaces up in %s, on bridge %s", len(c.nodes), since(step), nodeBridge)
	}
	for _, n := range c.nodes {
		if err := c.upContainerd(n); err != nil {
			return err
		}
	}
	step = time.Now()
	for _, name := range []string{"controller-manager", "scheduler"} {
		if _, err := c.kubeconfig(name); err != nil {
			return err
		}
	}
	if _, err := c.start("kube-controller-manager", nil,
		"--kubeconfig="+filepath.Join(c.cfg.Dir, "kubeconfig-controller-manager"),
		"--bind-address=127.0.0.1", "--secure-port="+strconv.Itoa(kcmPort),
		// Each controller with its own ServiceAccount: without it they
		// are forbidden and the node's not-ready taint stays.
		"--use-service-account-credentials=true",
		"--service-account-private-key-file="+pki("sa.key"), "--root-ca-file="+pki("ca.crt"),
		"--cluster-signing-cert-file="+pki("ca.crt"), "--cluster-signing-key-file="+pki("ca.key"),
		// Its default, 20 QPS per controller, is what limits a bulk of
		// claims once the provisioner is fast: the PV controller makes
		// about five writes per claim (hand-off annotation, events,
		// binding both ways). 200 Immediate claims took up to 20.2 s
		// from PV to Bound at 20 QPS, 8.0 s at 100, 3.5 s at 400 (all
		// Bound after 5.3 s; test/cluster BulkProvisioning). A cluster
		// that provisions in bulk raises it the same way.
		"--kube-api-qps=400", "--kube-api-burst=800",
		"--leader-elect=false", "--controllers=*", "--v=1"); err != nil {
		return err
	}
	if _, err := c.start("kube-scheduler", nil,
		"--kubeconfig="+filepath.Join(c.cfg.Dir, "kubeconfig-scheduler"),
		"--bind-address=127.0.0.1", "--secure-port="+strconv.Itoa(schedPort),
		"--leader-elect=false", "--v=1"); err != nil {
		return err
	}
	for _, n := range c.nodes {
		if err := c.upKubelet(n); err != nil {
			return err
		}
	}
	if err := c.nodesReady(ctx); err != nil {
		return err
	}
	c.say("cluster: controller-manager, scheduler, kubelet up, node Ready in %s", since(step))
	if c.serviceProxy {
		step = time.Now()
		for _, n := range c.nodes {
			if err := c.startProxy(n, proxyHealthzPort, proxyMetricsPort); err != nil {
				return err
			}
		}
		c.say("cluster: kube-proxy up in %s (Services route in the nodes' network namespaces)", since(step))
	}
	return nil
}

// stateDirs are what Up makes under Dir and Down removes, but the logs.
var stateDirs = []string{"etcd", "kubelet", "containerd", "cni", "pod-logs", "pools", "nodes", "pki"}

// writePKI makes the CA, the serving and client certificates, and the
// ServiceAccount signing key.
func (c *Cluster) writePKI() error {
	ca, err := newCA(c.pki)
	if err != nil {
		return err
	}
	if err := writeKey(filepath.Join(c.pki, "ca.key"), ca.key); err != nil {
		return err
	}
	type cert struct {
		name, cn string
		orgs     []string
		serving  bool
		ips      []net.IP
	}
	var controlIPs []net.IP
	if c.cfg.NodeIP != "" {
		controlIPs = append(controlIPs, net.ParseIP(c.cfg.NodeIP))
	}
	certs := []cert{
		// What pods dial: the kubernetes Service's ClusterIP.
		{"apiserver", "kube-apiserver", nil, true, append(controlIPs, net.ParseIP(kubernetesServiceIP))},
		{"apiserver-kubelet-client", "kube-apiserver-kubelet-client", []string{"system:masters"}, false, controlIPs},
		{"admin", "loopvol-admin", []string{"system:masters"}, false, controlIPs},
		{"controller-manager", "system:kube-controller-manager", nil, false, controlIPs},
		{"scheduler", "system:kube-scheduler", nil, false, controlIPs},
		// The user the system:node-proxier binding names.
		{"kube-proxy", "system:kube-proxy", nil, false, controlIPs},
	}
	for _, n := range c.nodes {
		var ips []net.IP
		if n.IP != "" {
			ips = append(ips, net.ParseIP(n.IP))
		}
		// The Node authorizer and NodeRestriction know a kubelet by
		// its user: each node's own.
		certs = append(certs,
			cert{c.kubeletCertName(n, false), "system:node:" + n.Name, []string{"system:nodes"}, false, ips},
			cert{c.kubeletCertName(n, true), "system:node:" + n.Name, []string{"system:nodes"}, true, ips})
	}
	for _, i := range certs {
		if err := ca.issue(c.pki, i.name, i.cn, i.orgs, i.serving, i.ips...); err != nil {
			return err
		}
	}
	return serviceAccountKey(c.pki)
}

// ctr runs ctr against n's containerd in the k8s.io namespace.
func (c *Cluster) ctr(n *node, args ...string) (string, error) {
	cmd := exec.Command(filepath.Join(c.cfg.BinDir, "ctr"), append([]string{"--address", n.ContainerdSocket, "--namespace", "k8s.io"}, args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}

// Kubectl runs kubectl with the admin kubeconfig and returns its output.
func (c *Cluster) Kubectl(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(c.cfg.BinDir, "kubectl"), append([]string{"--kubeconfig", c.Kubeconfig}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// KubectlPath is the kubectl binary.
func (c *Cluster) KubectlPath() string { return filepath.Join(c.cfg.BinDir, "kubectl") }

// mkdirOutside makes dir (outside Dir) and remembers it for Down when it
// did not exist (its parents too).
func (c *Cluster) mkdirOutside(dir string) error {
	var missing []string
	for d := dir; d != "/" && d != "."; d = filepath.Dir(d) {
		if _, err := os.Stat(d); err == nil {
			break
		}
		missing = append(missing, d)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	// Deepest first, so Down removes children before parents.
	c.created = append(c.created, missing...)
	return nil
}

func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func httpOK(client *http.Client, url string) error {
	resp, err := client.Get(url)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	return nil
}
