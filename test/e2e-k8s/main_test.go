// Package e2ek8s runs the upstream Kubernetes storage e2e suite
// (External.Storage of k8s.io/kubernetes v1.37.2's e2e.test, built by
// hack/tools/build.sh) against loopvol on a real one-node cluster
// (internal/cluster) with external-snapshotter v8.7.0, and reports what
// passed, failed and was skipped, and why (docs/e2e-k8s.md).
package e2ek8s

import (
	"fmt"
	"os"
	"testing"

	"github.com/loopvol/loopvol/internal/cluster"
)

// TestMain runs the tests in a network namespace of their own, with a
// Node address that exists only there (cluster.InNetNS): the suite execs
// into its pods (kubelet must serve on an address that is not loopback)
// and its pods need a pod network, and nothing is reachable from outside.
// Without root the tests skip themselves, in the host's network.
func TestMain(m *testing.M) {
	if os.Geteuid() != 0 {
		os.Exit(m.Run())
	}
	code, child, err := cluster.InNetNS(cluster.DefaultNodeIP)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if !child {
		os.Exit(code)
	}
	os.Exit(m.Run())
}
