package cluster

import (
	"fmt"
	"os"
	"testing"

	"github.com/loopvol/loopvol/internal/cluster"
)

// TestMain runs the tests in a network namespace of their own, with a
// Node address that exists only there (cluster.InNetNS): kubectl exec and
// logs, Services with endpoints (the webhook's) and pods on a bridge
// network then work as on a real node, and nothing is reachable from
// outside. Without root the tests skip themselves, in the host's network.
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
