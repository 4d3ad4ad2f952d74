// Package clustertest is what the test packages that run a real cluster
// (test/cluster, test/e2e-k8s) share: a TestMain that moves the test binary
// into a network namespace of its own, and a cluster brought up for one
// test and always torn down.
package clustertest

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/loopvol/loopvol/internal/harness/cluster"
)

// Main is the body of a TestMain: it runs the tests in a network namespace
// of their own with a Node address that exists only there
// (cluster.InNetNS), so that kubectl exec and logs, Services with
// endpoints and pods on a bridge network work as on a real node while
// nothing is reachable from outside. Without root the tests run (and skip
// themselves) in the host's network. It does not return.
func Main(m *testing.M) {
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

// Up brings a cluster up under a new temporary directory named after
// prefix, with the OCI archives <root>/_output/images/<image>.tar imported,
// the binaries of bin, and the Node address of the namespace Main made. It
// tears the cluster down when the test ends, and on SIGINT or SIGTERM (a
// cancelled CI job), when t.Cleanup would not run; the state directory is
// kept when the test failed or the teardown left something behind. build
// names the make target that builds what Up needs, for the error. Each of
// opts changes the configuration before Up (a cluster of nodes, say).
func Up(t *testing.T, prefix, root, bin, build string, images []string, opts ...func(*cluster.Config)) *cluster.Cluster {
	t.Helper()
	var archives []string
	for _, i := range images {
		archives = append(archives, filepath.Join(root, "_output", "images", i+".tar"))
	}
	// Not t.TempDir: its removal would come after ours and find nothing
	// to do, but a failed teardown must not make it descend into mounts.
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	cfg := cluster.Config{Dir: dir, BinDir: bin, Images: archives, NodeIP: cluster.NetNSNodeIP(), Out: Writer{t}}
	for _, o := range opts {
		o(&cfg)
	}
	c, err := cluster.Up(context.Background(), cfg)
	if err != nil {
		t.Fatalf("cluster up (%s builds the binaries and images): %v", build, err)
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		if _, ok := <-sig; ok {
			fmt.Fprintln(os.Stderr, "interrupted: tearing the cluster down")
			_ = c.Down(context.Background())
			os.Exit(1)
		}
	}()
	t.Cleanup(func() {
		signal.Stop(sig)
		if err := c.Down(context.Background()); err != nil {
			t.Errorf("teardown left something behind: %v (state in %s)", err, dir)
			return
		}
		if t.Failed() {
			t.Logf("logs kept in %s", c.LogDir)
			return
		}
		os.RemoveAll(dir)
	})
	return c
}

// Writer writes each line it gets to the test's log.
type Writer struct{ T *testing.T }

func (w Writer) Write(p []byte) (int, error) {
	w.T.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
