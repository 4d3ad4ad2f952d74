package cluster

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
)

// DefaultNodeIP is the Node's address in the network namespace InNetNS
// makes: a private address that exists only there, on its loopback
// device, and is routed nowhere else.
const DefaultNodeIP = "10.200.0.1"

// DefaultPodCIDR is the range of the pods' bridge network (Config.PodCIDR).
const DefaultPodCIDR = "10.201.0.0/24"

// serviceCIDR is the Services' range; kubernetesServiceIP is its first
// address, the kubernetes Service's ClusterIP (the apiserver's certificate
// names it).
const (
	serviceCIDR         = "10.0.0.0/24"
	kubernetesServiceIP = "10.0.0.1"
)

// netnsEnv marks the process InNetNS started in its namespace;
// hostNetNSEnv names the namespace it was started from (ownNetNS).
const (
	netnsEnv     = "LOOPVOL_CLUSTER_NETNS"
	hostNetNSEnv = "LOOPVOL_CLUSTER_HOST_NETNS"
)

// NetNSNodeIP is the node address of the namespace InNetNS runs this
// process in, or "" outside one: the Config.NodeIP to use there.
func NetNSNodeIP() string { return os.Getenv(netnsEnv) }

// InNetNS runs the current program again, with the same arguments, in a
// network namespace of its own that holds nodeIP on its loopback device,
// and returns the program's exit code (child false): the caller exits with
// it. Called in that program (child true), it returns at once. A whole
// cluster run from there (and the tests that talk to it) get a Node
// address that is not loopback, which `kubectl exec`/`logs`, Services with
// endpoints and the pods' bridge network need, while nothing of it can be
// reached from, or reach, the host's network: the namespace goes when its
// last process exits. SIGINT and SIGTERM are passed on, so that the child
// tears its cluster down.
//
// By hand rather than `unshare --net` so that the child needs no wrapper:
// test binaries and hack/demo call it first thing in main or TestMain.
// InNetNSForwarding also makes ports of the host's namespace reach it.
func InNetNS(nodeIP string) (code int, child bool, err error) {
	return inNetNS(nodeIP, os.Args[1:], nil)
}

// inNetNS is InNetNS running the program with args, and with forwards, the
// listeners of InNetNSForwarding, passed on to it.
func inNetNS(nodeIP string, args []string, forwards []*net.TCPListener) (code int, child bool, err error) {
	if os.Getenv(netnsEnv) == nodeIP {
		return 0, true, serveForwarded()
	}
	if os.Getenv(netnsEnv) != "" {
		return 0, false, fmt.Errorf("already in a network namespace for node address %s, not %s", os.Getenv(netnsEnv), nodeIP)
	}
	self, err := os.Executable()
	if err != nil {
		return 0, false, err
	}
	host, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		return 0, false, err
	}
	// The namespace's loopback device is down and has no other address:
	// bring it up with nodeIP before the program runs (ip from iproute2,
	// in the new namespace, the program's parent for a moment).
	script := `set -e; ip link set lo up; ip addr add "$1/32" dev lo; shift; exec "$@"`
	files, forwardEntry, err := forwardFiles(forwards)
	if err != nil {
		return 0, false, err
	}
	cmd := exec.Command("/bin/sh", append([]string{"-c", script, "sh", nodeIP, self}, args...)...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), netnsEnv+"="+nodeIP, hostNetNSEnv+"="+host, forwardEntry)
	cmd.ExtraFiles = files
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sig)
	err = cmd.Start()
	// The child has its own copies now: the listeners are its alone, and
	// close when it exits.
	closeFiles(files)
	closeListeners(forwards)
	if err != nil {
		return 0, false, fmt.Errorf("a network namespace for the cluster (root, iproute2): %w", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	for {
		select {
		case s := <-sig:
			_ = cmd.Process.Signal(s)
		case err := <-done:
			var exit *exec.ExitError
			if errors.As(err, &exit) {
				if exit.ExitCode() < 0 { // killed by a signal
					return 1, false, nil
				}
				return exit.ExitCode(), false, nil
			}
			if err != nil {
				return 0, false, err
			}
			return 0, false, nil
		}
	}
}

// ownNetNS reports whether this process runs in a network namespace other
// than the one InNetNS was called in (its parent's, which InNetNS names
// in hostNetNSEnv): a check of its own, so that nothing that changes a
// namespace's routing (kube-proxy) runs in the host's because of a stray
// environment variable. (PID 1's namespace cannot be read here.)
func ownNetNS() bool {
	self, err := os.Readlink("/proc/self/ns/net")
	host := os.Getenv(hostNetNSEnv)
	return err == nil && host != "" && self != host
}
