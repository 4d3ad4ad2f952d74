package cluster

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// kubeconfig writes a kubeconfig for the client certificate <pki>/<name>.
func (c *Cluster) kubeconfig(name string) (string, error) {
	return c.kubeconfigFor(name, name, c.Server)
}

// kubeconfigFor writes <Dir>/kubeconfig-<file> for the client certificate
// <pki>/<name> and the API server at server.
func (c *Cluster) kubeconfigFor(name, file, server string) (string, error) {
	path := filepath.Join(c.cfg.Dir, "kubeconfig-"+file)
	data := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
  - name: loopvol
    cluster:
      server: %s
      certificate-authority: %s
users:
  - name: %s
    user:
      client-certificate: %s
      client-key: %s
contexts:
  - name: loopvol
    context: {cluster: loopvol, user: %s}
current-context: loopvol
`, server, filepath.Join(c.pki, "ca.crt"), name, filepath.Join(c.pki, name+".crt"), filepath.Join(c.pki, name+".key"), name)
	return path, os.WriteFile(path, []byte(data), 0o600)
}

// containerdConfig is containerd 2's configuration: everything under Dir,
// the CRI plugin with runc (cgroupfs), the local sandbox image, no
// oom_score_adj below containerd's own (root lacks CAP_SYS_RESOURCE here)
// and the loopback-only CNI configuration.
func (c *Cluster) containerdConfig(n *node) string {
	q := func(s string) string { return fmt.Sprintf("%q", s) }
	return strings.Join([]string{
		`version = 3`,
		`root = ` + q(filepath.Join(n.containerdDir, "root")),
		`state = ` + q(filepath.Join(n.containerdDir, "state")),
		`[grpc]`,
		`  address = ` + q(n.ContainerdSocket),
		`[ttrpc]`,
		`  address = ` + q(n.ContainerdSocket+".ttrpc"),
		`[debug]`,
		`  address = ""`,
		`[metrics]`,
		`  address = ""`,
		`[plugins."io.containerd.cri.v1.runtime"]`,
		`  restrict_oom_score_adj = true`,
		`  enable_selinux = false`,
		`  [plugins."io.containerd.cri.v1.runtime".containerd]`,
		`    default_runtime_name = "runc"`,
		`    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]`,
		`      runtime_type = "io.containerd.runc.v2"`,
		`      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]`,
		`        BinaryName = ` + q(filepath.Join(c.cfg.BinDir, "runc")),
		`        SystemdCgroup = false`,
		`  [plugins."io.containerd.cri.v1.runtime".cni]`,
		`    bin_dirs = [` + q(c.cfg.CNIBinDir) + `]`,
		`    conf_dir = ` + q(filepath.Join(n.StateDir, "cni")),
		`[plugins."io.containerd.cri.v1.images"]`,
		`  snapshotter = "overlayfs"`,
		`  [plugins."io.containerd.cri.v1.images".pinned_images]`,
		`    sandbox = ` + q(c.cfg.SandboxImage),
		`[plugins."io.containerd.grpc.v1.cri"]`,
		`  disable_tcp_service = true`,
		`  stream_server_address = "127.0.0.1"`,
		`  stream_server_port = "0"`,
		``,
	}, "\n")
}

// cniConfig is the pods' network configuration. Loopback only (the
// runtime then reports NetworkReady; pods use the host's network) unless
// the cluster has a NodeIP: then a bridge of PodCIDR in this network
// namespace, its addresses kept under Dir. No masquerading, no port
// mapping: nothing is routed out of the namespace.
func (c *Cluster) cniConfig(n *node) string {
	if n.IP == "" {
		return `{"cniVersion": "1.0.0", "name": "loopback-only", "plugins": [{"type": "loopback"}]}` + "\n"
	}
	return fmt.Sprintf(`{"cniVersion": "1.0.0", "name": "loopvol-pods", "plugins": [{"type": "bridge", "bridge": "lvpods0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
  "ipam": {"type": "host-local", "ranges": [[{"subnet": %q}]], "routes": [{"dst": "0.0.0.0/0"}], "dataDir": %q}}]}
`, n.PodCIDR, filepath.Join(n.StateDir, "cni", "ipam"))
}

// kubeletConfig is n's kubelet's KubeletConfiguration.
func (c *Cluster) kubeletConfig(n *node) string {
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This kind of machine has cgroup v1, which kubelet 1.37 refuses by default.
failCgroupV1: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://%s
address: %s
port: %d
healthzBindAddress: 127.0.0.1
healthzPort: %d
readOnlyPort: 0
tlsCertFile: %s
tlsPrivateKeyFile: %s
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: %s}
authorization:
  mode: Webhook
podLogsDir: %s
failSwapOn: false
serializeImagePulls: false
# Images are imported, never pulled: keep them.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 1Mi
  nodefs.available: 1%%
  imagefs.available: 1%%
  nodefs.inodesFree: 1%%
registerNode: true
maxPods: 110
# A running Pod's volumes are grown online (NodeExpandVolume) only at its
# next periodic sync: at the default 1m that was 60-90 s after the resize;
# on a node of a few test pods the extra syncs cost nothing.
syncFrequency: 10s
# kubelet's iptables chains (KUBE-FIREWALL, the canaries) are for other
# components of the node; outside the cluster's own network namespace
# they would land in the host's tables.
makeIPTablesUtilChains: %t
%s`, n.ContainerdSocket, cmp.Or(n.IP, "127.0.0.1"), n.kubeletPort, n.kubeletHealthzPort,
		filepath.Join(c.pki, c.kubeletCertName(n, true)+".crt"), filepath.Join(c.pki, c.kubeletCertName(n, true)+".key"),
		filepath.Join(c.pki, "ca.crt"), n.PodLogDir, c.serviceProxy, cgroupRootSetting(n.cgroupRoot))
}

// cgroupRootSetting is kubelet's cgroupRoot line, when it has one of its
// own: on a cluster of nodes each node's (Up makes it in every hierarchy,
// Down removes it), so that its kubepods are its own.
func cgroupRootSetting(root string) string {
	if root == "" {
		return ""
	}
	return "cgroupRoot: " + root + "\n"
}
