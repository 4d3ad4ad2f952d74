package cluster

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
)

// Binaries the cluster runs, looked up in Config.BinDir.
var Binaries = []string{
	"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kubectl",
	"containerd", "containerd-shim-runc-v2", "ctr", "runc", "kube-proxy",
}

// DefaultAPIPort is the apiserver's port that deploy/kubernetes/overlays/local
// expects (KUBERNETES_SERVICE_PORT).
const DefaultAPIPort = 6443

// MaxNodes is the most nodes a cluster has here.
const MaxNodes = 8

// DefaultSandboxImage is the pause image hack/images builds (-tools).
const DefaultSandboxImage = "localhost/loopvol/pause:3.10"

// Config says where the cluster's binaries, images and state are.
type Config struct {
	// Dir holds all of the cluster's state: certificates, configuration,
	// data, kubelet's root directory, containerd's root and state, logs.
	// Created if missing; it must not hold a running cluster.
	Dir string
	// BinDir holds the Binaries (hack/tools/build.sh cluster).
	BinDir string
	// Images are OCI archives imported into containerd (ctr images import).
	Images []string
	// SandboxImage is containerd's sandbox (pause) image; it must be one of Images.
	SandboxImage string
	// NodeName is the Node's name (default: the host name, lowercased);
	// on a cluster of nodes the nodes are <NodeName>-1 to -<Nodes>.
	NodeName string
	// Nodes is the number of nodes (default 1). A cluster of more than
	// one needs NodeIP to be the address of the network namespace InNetNS
	// made, which becomes the control plane's: each node then gets a
	// network and a mount namespace of its own (the Node type tells
	// more), joined to the control plane's by a bridge, at the addresses
	// after it in its /24 (.11, .12, ...).
	Nodes int
	// NodePools gives each node of a cluster of nodes pools of its own
	// (<Dir>/nodes/<name>/pools, which the node sees at <Dir>/pools): a
	// local disk per node. Without it every node sees the one <Dir>/pools,
	// the stand-in for a shared file system (NFS).
	NodePools bool
	// NodePoolBytes, with NodePools, makes each node's pools a file
	// system of their own of that size (ext4 on a loop device, mounted
	// at <Dir>/nodes/<name>/pools before the node starts): a local disk
	// per node, whose free space is the node's alone. Zero: the nodes'
	// pool directories share the file system of Dir.
	NodePoolBytes int64
	// SharedPoolReflinkBytes, without NodePools, makes <Dir>/pools, the
	// pool every node sees, an xfs with reflink of that size (on a loop
	// device, mounted before any node starts): a shared file system whose
	// fences are reflinks, where the default (Dir's own file system, ext4
	// on this machine) fences by copy. Zero: Dir's file system.
	SharedPoolReflinkBytes int64
	// APIPort is the apiserver's secure port on 127.0.0.1 (default 6443).
	APIPort int
	// CNIBinDir holds the CNI plugins (loopback, bridge and host-local;
	// default /usr/lib/cni, Debian's containernetworking-plugins).
	CNIBinDir string
	// NodeIP is the Node's address: it must be on an interface of this
	// process's network namespace and not be loopback (InNetNS makes
	// both true). With it, kubelet serves on it (kubectl exec and logs
	// work), Services of hostNetwork pods get endpoints (the apiserver
	// reaches webhooks through them) and pods without hostNetwork get a
	// bridge network of PodCIDR; in InNetNS's namespace kube-proxy also
	// routes the Services, so those pods reach the API through the
	// kubernetes Service as on any cluster. Empty: loopback only, the Node
	// has no address and only hostNetwork pods run.
	NodeIP string
	// PodCIDR is the pods' range with NodeIP (default DefaultPodCIDR).
	PodCIDR string
	// Out receives one line per step (nil: discarded).
	Out io.Writer
}

// Validate checks the configuration and fills in the defaults.
func (c *Config) Validate() error {
	var errs []error
	if c.Dir == "" {
		errs = append(errs, errors.New("Dir is required"))
	} else if !filepath.IsAbs(c.Dir) {
		abs, err := filepath.Abs(c.Dir)
		if err != nil {
			errs = append(errs, err)
		}
		c.Dir = abs
	}
	if c.BinDir == "" {
		errs = append(errs, errors.New("BinDir is required"))
	} else {
		// The daemons run in Dir: relative paths would not resolve there.
		if abs, err := filepath.Abs(c.BinDir); err == nil {
			c.BinDir = abs
		}
		for _, b := range Binaries {
			if _, err := os.Stat(filepath.Join(c.BinDir, b)); err != nil {
				errs = append(errs, fmt.Errorf("binary %s (make cluster-tools builds it): %w", b, err))
			}
		}
	}
	for n, i := range c.Images {
		if abs, err := filepath.Abs(i); err == nil {
			c.Images[n] = abs
		}
		if _, err := os.Stat(i); err != nil {
			errs = append(errs, fmt.Errorf("image archive (make images cluster-images builds it): %w", err))
		}
	}
	if c.SandboxImage == "" {
		c.SandboxImage = DefaultSandboxImage
	}
	if c.NodeName == "" {
		h, err := os.Hostname()
		if err != nil {
			errs = append(errs, fmt.Errorf("NodeName: %w", err))
		}
		c.NodeName = lowerDNS(h)
	}
	if c.Nodes == 0 {
		c.Nodes = 1
	}
	if c.Nodes < 1 || c.Nodes > MaxNodes {
		errs = append(errs, fmt.Errorf("Nodes %d: want 1 to %d", c.Nodes, MaxNodes))
	}
	if c.Nodes > 1 && (c.NodeIP == "" || c.NodeIP != NetNSNodeIP() || !ownNetNS()) {
		errs = append(errs, fmt.Errorf("Nodes %d: a cluster of nodes needs NodeIP to be the address of the network namespace InNetNS made (%q here)", c.Nodes, NetNSNodeIP()))
	}
	if c.NodePoolBytes < 0 || (c.NodePoolBytes > 0 && !c.NodePools) {
		errs = append(errs, fmt.Errorf("NodePoolBytes %d: a positive size, with NodePools", c.NodePoolBytes))
	}
	if c.SharedPoolReflinkBytes < 0 || (c.SharedPoolReflinkBytes > 0 && c.NodePools) {
		errs = append(errs, fmt.Errorf("SharedPoolReflinkBytes %d: a positive size, without NodePools", c.SharedPoolReflinkBytes))
	}
	if c.NodePools && c.Nodes < 2 {
		errs = append(errs, errors.New("NodePools: only on a cluster of nodes (Nodes 2 or more)"))
	}
	if c.APIPort == 0 {
		c.APIPort = DefaultAPIPort
	}
	if c.APIPort < 1 || c.APIPort > 65535 {
		errs = append(errs, fmt.Errorf("APIPort %d out of range", c.APIPort))
	}
	if c.CNIBinDir == "" {
		c.CNIBinDir = "/usr/lib/cni"
	}
	plugins := []string{"loopback"}
	if c.NodeIP != "" {
		plugins = append(plugins, "bridge", "host-local")
		if ip := net.ParseIP(c.NodeIP); ip == nil || ip.To4() == nil || ip.IsLoopback() || ip.IsUnspecified() {
			errs = append(errs, fmt.Errorf("NodeIP %q: want an IPv4 address that is not loopback", c.NodeIP))
		}
		if c.PodCIDR == "" {
			c.PodCIDR = DefaultPodCIDR
		}
		if _, _, err := net.ParseCIDR(c.PodCIDR); err != nil {
			errs = append(errs, fmt.Errorf("PodCIDR: %w", err))
		}
	}
	for _, p := range plugins {
		if _, err := os.Stat(filepath.Join(c.CNIBinDir, p)); err != nil {
			errs = append(errs, fmt.Errorf("CNI %s plugin (Debian: containernetworking-plugins): %w", p, err))
		}
	}
	if c.Out == nil {
		c.Out = io.Discard
	}
	return errors.Join(errs...)
}

// lowerDNS makes a host name a valid Node name.
func lowerDNS(s string) string {
	out := make([]byte, 0, len(s))
	for _, r := range []byte(s) {
		switch {
		case r >= 'A' && r <= 'Z':
			out = append(out, r+'a'-'A')
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '.':
			out = append(out, r)
		default:
			out = append(out, '-')
		}
	}
	if len(out) == 0 {
		return "node"
	}
	return string(out)
}
