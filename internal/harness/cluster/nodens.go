package cluster

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// nsenterPath is util-linux's nsenter, which runs a node's daemons in the
// node's namespaces: a Go process cannot enter a mount namespace once it
// has threads, so the daemon's own exec has to.
const nsenterPath = "/usr/bin/nsenter"

// nodeBridge joins the nodes' veths in the control plane's network
// namespace (the one InNetNS made), which routes between them.
const nodeBridge = "lvnodes0"

// nodeNS is the process that holds a node's network, mount and UTS
// namespaces for as long as the node lives: `sleep infinity`, after a script that
// set the mount namespace up.
type nodeNS struct {
	cmd *exec.Cmd
}

// enter is the nsenter command line that runs bin in the node's
// namespaces.
func (ns *nodeNS) enter(bin string) []string {
	return []string{"--target=" + strconv.Itoa(ns.cmd.Process.Pid), "--net", "--mount", "--uts", "--", bin}
}

// nodeNSScript sets a node's mount namespace up: a slave of this machine's
// (what is mounted on the host later, a pool for one, shows in the node,
// and nothing the node mounts shows on the host), a sysfs of the node's
// network namespace mounted first, and so read-write (holdSysfs says why),
// the node's own kubelet root at the path every node's kubelet uses (the
// node plugin's DaemonSet names one hostPath for all nodes, as on a real
// cluster), shared so that the node plugin's mounts reach kubelet, the
// node's own /var/lib/kubelet/device-plugins and /run/containerd (which
// kubelet and runc use whatever their configuration says) and, with pools
// of its own, the node's pools at the cluster's pool path.
//
// The node's host name is its name, as on a real node: what a hostNetwork
// pod calls os.Hostname() (a leader-election identity, say) tells the
// nodes apart.
//
// $1 is the node's state directory, $2 the cluster's, $3 "pools" or "",
// $4 the node's name.
const nodeNSScript = `set -e
hostname "$4"
mount --make-rslave /
mount -t sysfs -o nosuid,nodev,noexec sysfs "$1/sysfs"
mount --bind "$1/kubelet" "$2/kubelet"
mount --make-rshared "$2/kubelet"
mount --bind "$1/device-plugins" /var/lib/kubelet/device-plugins
mount --bind "$1/run-containerd" /run/containerd
if [ "$3" = pools ]; then mount --bind "$1/pools" "$2/pools"; fi
ip link set lo up
echo ready
exec sleep infinity
`

// startNodeNS starts n's namespace holder and joins its network namespace
// to the nodes' bridge: the node's address on eth0, its default route
// through the control plane's namespace.
func (c *Cluster) startNodeNS(n *node) error {
	for _, d := range []string{"sysfs", "kubelet", "device-plugins", "run-containerd", "pools"} {
		if err := os.MkdirAll(filepath.Join(n.StateDir, d), 0o755); err != nil {
			return err
		}
	}
	pools := ""
	if c.cfg.NodePools {
		pools = "pools"
		if c.cfg.NodePoolBytes > 0 {
			if err := c.nodeDisk(n); err != nil {
				return err
			}
		}
	}
	log, err := os.OpenFile(filepath.Join(c.LogDir, "node-"+n.Name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer log.Close()
	cmd := exec.Command("/bin/sh", "-c", nodeNSScript, "sh", n.StateDir, c.cfg.Dir, pools, n.Name)
	cmd.Stderr = log
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWNET | syscall.CLONE_NEWNS | syscall.CLONE_NEWUTS,
		// Its own group, so that a terminal's ^C reaches Down first.
		Setpgid: true,
		// Gone with this process, even when it is killed: nothing else
		// would end it.
		Pdeathsig: syscall.SIGKILL,
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("node %s: namespaces (root, util-linux): %w", n.Name, err)
	}
	n.ns = &nodeNS{cmd: cmd}
	n.PID = cmd.Process.Pid
	n.NetNS = fmt.Sprintf("/proc/%d/ns/net", n.PID)
	n.MountNS = fmt.Sprintf("/proc/%d/ns/mnt", n.PID)
	ready := make(chan error, 1)
	go func() {
		line, err := bufio.NewReader(out).ReadString('\n')
		if err == nil && line != "ready\n" {
			err = fmt.Errorf("said %q", line)
		}
		ready <- err
	}()
	select {
	case err := <-ready:
		if err != nil {
			return fmt.Errorf("node %s: setting its namespaces up (%s): %w", n.Name, log.Name(), err)
		}
	case <-time.After(30 * time.Second):
		return fmt.Errorf("node %s: its namespaces not set up within 30 s (%s)", n.Name, log.Name())
	}
	return c.cable(n)
}

// nodeDisk makes n's pools a file system of their own (NodePoolBytes):
// an ext4 image under the node's state directory, loop-mounted on the
// host at <StateDir>/pools, so that the node's mount namespace, made
// after, has it. Down's unmountAll and detachLoops undo it (both under
// Dir).
func (c *Cluster) nodeDisk(n *node) error {
	img := filepath.Join(n.StateDir, "pool-disk.img")
	if err := sparseFile(img, c.cfg.NodePoolBytes); err != nil {
		return err
	}
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-m", "0", img).CombinedOutput(); err != nil {
		return fmt.Errorf("node %s: mkfs.ext4 %s: %w: %s", n.Name, img, err, strings.TrimSpace(string(out)))
	}
	if out, err := exec.Command("mount", "-o", "loop", img, filepath.Join(n.StateDir, "pools")).CombinedOutput(); err != nil {
		return fmt.Errorf("node %s: mount %s: %w: %s", n.Name, img, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// sharedPoolDisk makes <Dir>/pools an xfs with reflink
// (SharedPoolReflinkBytes): an image in Dir, loop-mounted on the host
// before any node's mount namespace is made, so that every node has it.
// Down's unmountAll and detachLoops undo it (both under Dir).
func (c *Cluster) sharedPoolDisk() error {
	img := filepath.Join(c.cfg.Dir, "shared-pool.img")
	if err := sparseFile(img, c.cfg.SharedPoolReflinkBytes); err != nil {
		return err
	}
	if out, err := exec.Command("mkfs.xfs", "-q", "-f", "-m", "reflink=1", img).CombinedOutput(); err != nil {
		return fmt.Errorf("shared pool: mkfs.xfs %s (xfsprogs): %w: %s", img, err, strings.TrimSpace(string(out)))
	}
	if out, err := exec.Command("mount", "-o", "loop", img, filepath.Join(c.cfg.Dir, "pools")).CombinedOutput(); err != nil {
		return fmt.Errorf("shared pool: mount %s: %w: %s", img, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// sparseFile makes path an empty file of size bytes (a disk image).
func sparseFile(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// cable connects n's network namespace to the nodes' bridge.
func (c *Cluster) cable(n *node) error {
	pid := strconv.Itoa(n.PID)
	if err := ip("link", "add", n.Link, "type", "veth", "peer", "name", "eth0", "netns", pid); err != nil {
		return err
	}
	if err := ip("link", "set", n.Link, "master", nodeBridge, "up"); err != nil {
		return err
	}
	script := `set -e
ip addr add "$1/24" dev eth0
ip link set eth0 up
ip route add default via "$2"
echo 1 > /proc/sys/net/ipv4/ip_forward`
	if out, err := exec.Command(nsenterPath, "--target="+pid, "--net", "--", "/bin/sh", "-c", script, "sh", n.IP, c.cfg.NodeIP).CombinedOutput(); err != nil {
		return fmt.Errorf("node %s: its address: %w: %s", n.Name, err, strings.TrimSpace(string(out)))
	}
	// The control plane routes each node's pods to the node.
	return ip("route", "replace", n.PodCIDR, "via", n.IP)
}

// nodeBridgeUp makes the nodes' bridge in this process's network namespace
// (never the host's: Up checks ownNetNS), routes the nodes' /24 onto it
// from the control plane's address, and forwards between the nodes.
func (c *Cluster) nodeBridgeUp() error {
	_ = ip("link", "del", nodeBridge) // a killed run's
	if err := ip("link", "add", nodeBridge, "type", "bridge"); err != nil {
		return err
	}
	if err := ip("link", "set", nodeBridge, "up"); err != nil {
		return err
	}
	if err := ip("route", "add", nodesNetwork(c.cfg.NodeIP), "dev", nodeBridge, "src", c.cfg.NodeIP); err != nil {
		return err
	}
	return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1\n"), 0o644)
}

// nodeBridgeDown removes the bridge (the veths went with their
// namespaces).
func (c *Cluster) nodeBridgeDown() error {
	if err := ip("link", "del", nodeBridge); err != nil && !strings.Contains(err.Error(), "Cannot find device") {
		return err
	}
	return nil
}

// stopNodeNS ends n's namespace holder; the namespaces go once the node's
// last process has, and with the mount namespace every mount made in it.
func (n *node) stopNodeNS() error {
	if n.ns == nil {
		return nil
	}
	_ = n.ns.cmd.Process.Kill()
	err := n.ns.cmd.Wait()
	n.ns = nil
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		return fmt.Errorf("node %s: namespace holder: %w", n.Name, err)
	}
	return nil
}

// ip runs iproute2's ip in this process's network namespace.
func ip(args ...string) error {
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}
