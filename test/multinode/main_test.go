package multinode

import (
	"testing"

	"github.com/loopvol/loopvol/internal/harness/cluster/clustertest"
)

// TestMain runs the tests in a network namespace of their own, which
// becomes the control plane's (clustertest.Main).
func TestMain(m *testing.M) { clustertest.Main(m) }
