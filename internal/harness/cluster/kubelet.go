package cluster

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/loopvol/loopvol/internal/harness/proc"
)

// kubeletStopGrace is how long StopKubelet waits after SIGTERM before it
// kills kubelet: systemd's default stop timeout is longer, but a kubelet
// that outlives a few seconds of SIGTERM is stuck.
const kubeletStopGrace = 20 * time.Second

// errKubeletStopped: StartKubelet's counterpart was never called.
var errKubeletStopped = errors.New("kubelet is stopped")

// StopKubelet stops the first node's kubelet as `systemctl stop kubelet`
// does on a node: SIGTERM, and the pods' containers go on running under
// containerd. The storage e2e suite's disruptive specs stop kubelet, change
// pods while it is down, and start it again (test/e2e-k8s). Stopping a
// stopped kubelet does nothing.
func (c *Cluster) StopKubelet() { c.stopKubelet(c.firstNode()) }

func (c *Cluster) stopKubelet(n *node) {
	c.mu.Lock()
	p := n.kubelet
	if p == nil || !p.Running() {
		c.mu.Unlock()
		return
	}
	// Out of procs first, so that poll does not take the stop for a
	// crash.
	c.procs = slices.DeleteFunc(c.procs, func(q *proc.Process) bool { return q == p })
	c.mu.Unlock()
	p.Stop()
	c.say("cluster: %s stopped", c.daemonName(n, "kubelet"))
}

// StartKubelet starts the first node's kubelet again, with the flags Up
// gave it, after StopKubelet; a running kubelet is left alone. It does not
// wait for the node to be Ready: the caller waits for what it needs (the
// suite waits for a heartbeat of the new kubelet).
func (c *Cluster) StartKubelet() error { return c.startKubelet(c.firstNode()) }

func (c *Cluster) startKubelet(n *node) error {
	if c.kubeletRunning(n) {
		return nil
	}
	if n.kubeletArgs == nil {
		return fmt.Errorf("start kubelet: %w before Up started it", errKubeletStopped)
	}
	if err := c.runKubelet(n); err != nil {
		return err
	}
	c.say("cluster: %s started again", c.daemonName(n, "kubelet"))
	return nil
}

// runKubelet starts n's kubelet with its kubeletArgs and kubeletEnv.
func (c *Cluster) runKubelet(n *node) error {
	p, err := c.startOn(n, "kubelet", n.kubeletEnv, n.kubeletArgs...)
	if err != nil {
		return err
	}
	c.mu.Lock()
	n.kubelet = p
	c.mu.Unlock()
	return nil
}

// KubeletRunning tells whether the first node's kubelet runs.
func (c *Cluster) KubeletRunning() bool { return c.kubeletRunning(c.firstNode()) }

// firstNode is the first node, or a node that never ran on a Cluster that
// Up did not make (a test's zero Cluster): its kubelet is stopped, and
// cannot be started.
func (c *Cluster) firstNode() *node {
	if len(c.nodes) == 0 {
		return &node{}
	}
	return c.nodes[0]
}

func (c *Cluster) kubeletRunning(n *node) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return n.kubelet != nil && n.kubelet.Running()
}
