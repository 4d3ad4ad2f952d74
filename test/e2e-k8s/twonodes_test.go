package e2ek8s

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/loopvol/loopvol/internal/harness/cluster"
	"github.com/loopvol/loopvol/internal/harness/cluster/clustertest"
	"github.com/loopvol/loopvol/internal/harness/testenv"
)

// nodesEnv=2 runs TestExternalStorageTwoNodes (make test-e2e-k8s-two-nodes)
// instead of TestExternalStorage.
const nodesEnv = "E2E_K8S_NODES"

// The specs the suite skips on one node, by what they need (docs/e2e-k8s.md
// "On two nodes"):
//   - acrossNodes: a volume used by Pods on two nodes in turn ("only
//     supports singleNodeVolume" when the driver claims singleNodeVolume,
//     "Number of available nodes is less than 2" on one node): multiVolume's
//     "retain data across pod recreation on different node".
//   - twoTopologies: "Not enough topologies in cluster": topology's
//     "should fail to schedule a pod which has topologies that conflict
//     with AllowedTopologies".
const (
	acrossNodes   = `External.Storage.*on different node`
	twoTopologies = `External.Storage.*\] topology `
)

// TestExternalStorageTwoNodes runs the storage e2e suite's specs that need
// two nodes or two topologies, on real two-node clusters of
// test/multinode's two kinds: a pool both nodes share (the stand-in for
// overlays/shared on NFS: a volume may follow its Pod to the other node, so
// test-driver.yaml's singleNodeVolume becomes false), and a pool per node,
// each its own zone (overlays/distributed: two topologies).
func TestExternalStorageTwoNodes(t *testing.T) {
	if os.Getenv(nodesEnv) != "2" {
		t.Skipf("%s=2 runs it (make test-e2e-k8s-two-nodes)", nodesEnv)
	}
	testenv.RequireLoopDevices(t)
	if cluster.NetNSNodeIP() == "" {
		t.Skip("a cluster of nodes needs the test binary in a network namespace of its own (TestMain)")
	}
	root, bin := suiteDirs(t, "make test-e2e-k8s-two-nodes")
	_, skip, err := selection()
	if err != nil {
		t.Fatal(err)
	}
	// Narrowed by E2E_K8S_FOCUS, as the one-node run.
	narrow := func(focus string) string {
		if f := os.Getenv(focusEnv); f != "" {
			return `(` + focus + `).*(` + f + `)`
		}
		return focus
	}
	// Serial and Disruptive specs are not among them; Slow ones are (every
	// multiVolume spec is [Slow]), so the slow tags are not skipped here.
	skip = strings.TrimPrefix(strings.TrimPrefix(skip, slowTags), "|")
	for _, tc := range []struct {
		name, overlay string
		nodePools     bool
		focus         string
		// singleNode is test-driver.yaml's singleNodeVolume for the run.
		singleNode bool
	}{
		{name: "SharedPool", overlay: "local", focus: acrossNodes},
		{name: "Distributed", overlay: "distributed", nodePools: true, focus: twoTopologies, singleNode: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			c := clustertest.Up(t, "loopvol-e2e-k8s-2-", root, bin, "make test-e2e-k8s-two-nodes", images, func(cfg *cluster.Config) {
				cfg.Nodes, cfg.NodePools, cfg.NodeName = 2, tc.nodePools, "node"
				if tc.nodePools {
					cfg.NodePoolBytes = 2 << 30
				}
			})
			dir, err := c.Overlay(filepath.Join(root, "deploy", "kubernetes", "overlays", tc.overlay))
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Deploy(ctx, dir); err != nil {
				t.Fatal(err)
			}
			driverFile := driverFileFor(t, root, tc.singleNode)
			runSuite(ctx, t, c, root, bin, driverFile, []pass{{name: strings.ToLower(tc.name) + "_", focus: narrow(tc.focus), skip: skip, labels: "!Disruptive", procs: procs(t)}})
		})
	}
}

// driverFileFor is test-driver.yaml with singleNodeVolume set to
// singleNode, in a file of the test's own (the suite reads the file; its
// other paths are relative to -repo-root).
func driverFileFor(t *testing.T, root string, singleNode bool) string {
	t.Helper()
	src := filepath.Join(root, "test", "e2e-k8s", "test-driver.yaml")
	if singleNode {
		return src
	}
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	const claim = "    singleNodeVolume: true\n"
	if strings.Count(string(b), claim) != 1 {
		t.Fatalf("%s: want exactly one line %q", src, strings.TrimSpace(claim))
	}
	out := strings.Replace(string(b), claim, "    singleNodeVolume: false\n", 1)
	f := filepath.Join(t.TempDir(), "test-driver-shared.yaml")
	if err := os.WriteFile(f, []byte(out), 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}
