package cluster

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/loopvol/loopvol/internal/harness/testenv"
)

// TestNodeLayout: a one-node cluster's node is the cluster's directory as
// before; a cluster of nodes gives each its own state, address, pod range,
// link and cgroup root, and its daemons names of their own.
func TestNodeLayout(t *testing.T) {
	dir := t.TempDir()
	one := &Cluster{cfg: Config{Dir: dir, Nodes: 1, NodeName: "host", NodeIP: DefaultNodeIP, PodCIDR: DefaultPodCIDR}}
	nodes := one.newNodes()
	if len(nodes) != 1 || nodes[0].StateDir != dir || nodes[0].Name != "host" || nodes[0].cgroupRoot != "" || nodes[0].Link != "" ||
		nodes[0].ContainerdSocket != filepath.Join(dir, "containerd", "containerd.sock") || nodes[0].PodLogDir != filepath.Join(dir, "pod-logs") {
		t.Fatalf("one node: %+v", nodes[0].Node)
	}
	if got := one.daemonName(nodes[0], "kubelet"); got != "kubelet" {
		t.Errorf("one node's kubelet is named %q", got)
	}

	many := &Cluster{cfg: Config{Dir: dir, Nodes: 3, NodeName: "node", NodeIP: DefaultNodeIP}}
	nodes = many.newNodes()
	if len(nodes) != 3 {
		t.Fatalf("%d nodes, want 3", len(nodes))
	}
	for i, want := range []struct{ name, ip, cidr, link string }{
		{"node-1", "10.200.0.11", "10.201.1.0/24", "lvnode1"},
		{"node-2", "10.200.0.12", "10.201.2.0/24", "lvnode2"},
		{"node-3", "10.200.0.13", "10.201.3.0/24", "lvnode3"},
	} {
		n := nodes[i]
		if n.Name != want.name || n.IP != want.ip || n.PodCIDR != want.cidr || n.Link != want.link ||
			n.StateDir != filepath.Join(dir, "nodes", want.name) || n.cgroupRoot != "/loopvol-"+want.name {
			t.Errorf("node %d: %+v, cgroup root %q; want %+v", i, n.Node, n.cgroupRoot, want)
		}
		if got := many.daemonName(n, "kubelet"); got != "kubelet-"+want.name {
			t.Errorf("node %s's kubelet is named %q", n.Name, got)
		}
	}
	if got := nodesNetwork(DefaultNodeIP); got != "10.200.0.0/24" {
		t.Errorf("nodesNetwork: %s", got)
	}
}

// TestConfigNodes: a cluster of nodes needs the address InNetNS made, and
// the node pool settings their node count.
func TestConfigNodes(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{Nodes: 2, NodeIP: DefaultNodeIP}, "needs NodeIP to be the address of the network namespace InNetNS made"}, // not in it here
		{Config{Nodes: MaxNodes + 1}, "want 1 to"},
		{Config{Nodes: -1}, "want 1 to"},
		{Config{NodePools: true}, "NodePools: only on a cluster of nodes"},
		{Config{Nodes: 2, NodePoolBytes: 1 << 20}, "NodePoolBytes 1048576: a positive size, with NodePools"},
		{Config{Nodes: 2, NodePools: true, SharedPoolReflinkBytes: 1 << 30}, "SharedPoolReflinkBytes 1073741824: a positive size, without NodePools"},
	} {
		cfg := tc.cfg
		cfg.Dir, cfg.BinDir = t.TempDir(), t.TempDir()
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.cfg, err, tc.want)
		}
	}
}

// TestOverlayDistributed: on a cluster of nodes, overlays/distributed's
// node pods get the pool and kubelet's directory under the cluster's, and
// the API server at the control plane's address; there is no StatefulSet to
// patch, and the containers that mount kubelet's directory are its own.
func TestOverlayDistributed(t *testing.T) {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	c := &Cluster{cfg: Config{Dir: dir, APIPort: DefaultAPIPort, Nodes: 2, NodeIP: DefaultNodeIP}, KubeletDir: filepath.Join(dir, "kubelet")}
	overlay, err := c.Overlay(filepath.Join(root, "deploy", "kubernetes", "overlays", "distributed"))
	if err != nil {
		t.Fatal(err)
	}
	res, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), overlay)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", overlay, err)
	}
	daemonSets := 0
	for _, r := range res.Resources() {
		switch r.GetKind() {
		case "StatefulSet":
			t.Errorf("StatefulSet %s in overlays/distributed", r.GetName())
		case "DaemonSet":
			daemonSets++
			y, err := r.AsYAML()
			if err != nil {
				t.Fatal(err)
			}
			var ds struct {
				Spec struct {
					Template corev1.PodTemplateSpec `json:"template"`
				} `json:"spec"`
			}
			if err := yaml.Unmarshal(y, &ds); err != nil {
				t.Fatal(err)
			}
			spec := ds.Spec.Template.Spec
			for _, v := range spec.Volumes {
				if v.Name == "pool-default" && v.HostPath.Path != c.PoolDir() {
					t.Errorf("pool host path %s, want %s", v.HostPath.Path, c.PoolDir())
				}
			}
			var mounters []string
			for _, ctr := range spec.Containers {
				if ctr.ImagePullPolicy != corev1.PullNever {
					t.Errorf("container %s: imagePullPolicy %s", ctr.Name, ctr.ImagePullPolicy)
				}
				if strings.HasPrefix(ctr.Image, "registry.k8s.io/") {
					t.Errorf("container %s: image %s, not the one make images imports", ctr.Name, ctr.Image)
				}
				for _, m := range ctr.VolumeMounts {
					if m.Name == "kubelet-dir" {
						mounters = append(mounters, ctr.Name)
						if m.MountPath != c.KubeletDir {
							t.Errorf("container %s mounts kubelet's directory at %s, want %s", ctr.Name, m.MountPath, c.KubeletDir)
						}
					}
				}
				if i := slices.IndexFunc(ctr.Env, func(e corev1.EnvVar) bool { return e.Name == "KUBERNETES_SERVICE_HOST" }); i >= 0 && ctr.Env[i].Value != DefaultNodeIP {
					t.Errorf("container %s: KUBERNETES_SERVICE_HOST %s, want the control plane's %s", ctr.Name, ctr.Env[i].Value, DefaultNodeIP)
				}
			}
			slices.Sort(mounters)
			if !slices.Equal(mounters, []string{"csi-provisioner", "driver", "sidecar"}) {
				t.Errorf("containers mounting kubelet's directory: %v", mounters)
			}
		}
	}
	if daemonSets != 1 {
		t.Fatalf("%d DaemonSets, want 1", daemonSets)
	}
}
