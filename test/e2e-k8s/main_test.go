// Package e2ek8s runs the upstream Kubernetes storage e2e suite
// (External.Storage of k8s.io/kubernetes v1.37.2's e2e.test, built by
// hack/tools/build.sh) against loopvol on a real one-node cluster
// (internal/harness/cluster) with external-snapshotter v8.7.0, and reports what
// passed, failed and was skipped, and why (docs/e2e-k8s.md).
package e2ek8s

import (
	"testing"

	"github.com/loopvol/loopvol/internal/harness/cluster/clustertest"
)

// TestMain runs the tests in a network namespace of their own
// (clustertest.Main).
func TestMain(m *testing.M) { clustertest.Main(m) }
