package multinode

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/loopvol/loopvol/internal/harness/cluster"
	"github.com/loopvol/loopvol/internal/harness/testenv"
)

// fencingOverlay writes, under dir, the kustomization a user of a shared
// pool with fencing applies: overlays/local (the stand-in for
// overlays/shared on this cluster: one pool every node sees) with
// components/fencing, the fencing controller tainting a node it fenced
// out-of-service (so that kube-controller-manager moves its Pods at once),
// and the node plugin told where the API server is, as overlays/local
// tells the other containers that talk to it. It returns the directory.
func fencingOverlay(t *testing.T, root, dir string) string {
	t.Helper()
	out := filepath.Join(dir, "fencing-overlay")
	if err := os.MkdirAll(out, 0o755); err != nil {
		t.Fatal(err)
	}
	rel := func(to string) string {
		r, err := filepath.Rel(out, filepath.Join(root, "deploy", "kubernetes", to))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	k := fmt.Sprintf(`apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - %s
components:
  - %s
patches:
  - target: {kind: StatefulSet, name: loopvol-controller}
    patch: |-
      - op: test
        path: /spec/template/spec/containers/1/name
        value: sidecar
      - op: add
        path: /spec/template/spec/containers/1/args/-
        value: --fencing-taint-out-of-service
  - patch: |-
      apiVersion: apps/v1
      kind: DaemonSet
      metadata: {name: loopvol-node, namespace: loopvol}
      spec:
        template:
          spec:
            containers:
              - name: driver
                env:
                  - {name: KUBERNETES_SERVICE_HOST, value: 127.0.0.1}
                  - {name: KUBERNETES_SERVICE_PORT, value: "6443"}
`, rel("overlays/local"), rel("components/fencing"))
	if err := os.WriteFile(filepath.Join(out, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		t.Fatal(err)
	}
	return out
}

// upFencing is up with fencingOverlay: a cluster of two nodes sharing one
// pool, loopvol deployed with fencing on; more sets the cluster up further.
func upFencing(t *testing.T, more ...func(*cluster.Config)) *cluster.Cluster {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return upDir(t, false, root, fencingOverlay(t, root, t.TempDir()), more...)
}

// TestNodeFailureFenced is TestNodeFailure's scenario with loopvol's
// fencing deployed (components/fencing, the sidecar tainting a fenced node
// out-of-service) and no operator: for a node frozen whole and for one cut
// off with its processes running, the StatefulSet's Pod runs on the other
// node within fencedMoveWithin of the fault with every write the old Pod
// acknowledged before it, the file system checks clean, none of the failed
// node's writes after the fence reaches the volume, and the failed node,
// back, lets go of its side.
func TestNodeFailureFenced(t *testing.T) {
	c := upFencing(t)
	for _, f := range nodeFaults {
		t.Run(f.name, func(t *testing.T) { nodeFailure(t, c, f, false, true) })
	}
}

// TestNodeFailureFencedEarlyTaint is TestNodeFailureFenced with the
// operator's out-of-service taint 10 s after the fault (the baseline's
// OperatorTaint) on a shared pool with reflink (xfs): kube-controller-
// manager force-detaches at once, and loopvol fences in that
// ControllerUnpublishVolume, before the heartbeat is stale or the node
// NotReady, so the Pod moves within seconds and the failed node is kept
// out all the same. A benchmark beside the baseline (`make
// bench-node-failure`): the fencing run of `make test` has no operator.
func TestNodeFailureFencedEarlyTaint(t *testing.T) {
	if os.Getenv(baselineEnv) == "" {
		t.Skipf("a benchmark beside the baseline: `make bench-node-failure` runs it (%s=1)", baselineEnv)
	}
	c := upFencing(t, func(cfg *cluster.Config) { cfg.SharedPoolReflinkBytes = 2 << 30 })
	for _, f := range nodeFaults {
		t.Run(f.name, func(t *testing.T) { nodeFailure(t, c, f, true, true) })
	}
}
