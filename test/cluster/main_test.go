package cluster

import (
	"testing"

	"github.com/loopvol/loopvol/internal/harness/cluster/clustertest"
)

// TestMain runs the tests in a network namespace of their own
// (clustertest.Main).
func TestMain(m *testing.M) { clustertest.Main(m) }
