package e2e

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/loopvol/loopvol/pkg/heartbeat"
	"github.com/loopvol/loopvol/test/internal/attacherproc"
	"github.com/loopvol/loopvol/test/internal/driverproc"
)

// TestNodePluginHeartbeat: the real driver in node mode with
// --heartbeat-namespace and a kubeconfig of the test's API server creates
// its heartbeat Lease (holder its node ID, the fencing period, an
// incarnation) and keeps renewing it; its metrics say when it last renewed
// and that it is not self-fenced.
func TestNodePluginHeartbeat(t *testing.T) {
	driverproc.RequireRoot(t)
	env := cluster.Env(t)
	ns := env.Namespace(t)
	dir := t.TempDir()
	kubelet, poolDir := filepath.Join(dir, "kubelet"), filepath.Join(dir, "pool")
	for _, d := range []string{kubelet, poolDir} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	node := "e2e-hb-node-" + shortID()
	addr := attacherproc.FreeAddress(t)
	driverproc.Start(t, dir, "--mode=node", "--node-id="+node, "--zone=e2e", "--pool=e2e="+poolDir, "--kubelet-dir="+kubelet,
		"--http-endpoint="+addr, "--heartbeat-namespace="+ns, "--kubeconfig="+env.Kubeconfig(t),
		"--heartbeat-interval=200ms", "--fencing-period=3s", "--self-fence-after=1s")
	name := heartbeat.LeaseName(driverName, node)
	leases := env.Client.CoordinationV1().Leases(ns)
	ctx := context.Background()

	var first *coordinationv1.Lease
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, shortWait, true, func(ctx context.Context) (bool, error) {
		l, err := leases.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		first = l
		return true, nil
	})
	if err != nil {
		t.Fatalf("the heartbeat Lease %s/%s did not appear: %v", ns, name, err)
	}
	if h := first.Spec.HolderIdentity; h == nil || *h != node {
		t.Errorf("holder %v, want %s", h, node)
	}
	if d := first.Spec.LeaseDurationSeconds; d == nil || *d != 3 {
		t.Errorf("leaseDurationSeconds %v, want 3 (the fencing period)", d)
	}
	if inc := first.Annotations[heartbeat.IncarnationAnnotation]; inc == "" {
		t.Error("the Lease has no incarnation")
	} else if _, err := time.Parse(time.RFC3339Nano, inc); err != nil {
		t.Errorf("incarnation %q: %v", inc, err)
	}

	renewed := func(l *coordinationv1.Lease) time.Time { return l.Spec.RenewTime.Time }
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, shortWait, true, func(ctx context.Context) (bool, error) {
		l, err := leases.Get(ctx, name, metav1.GetOptions{})
		return err == nil && renewed(l).After(renewed(first)), nil
	})
	if err != nil {
		t.Fatalf("the heartbeat Lease was not renewed: %v", err)
	}

	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	metrics := string(body)
	if !strings.Contains(metrics, "loopvol_node_self_fenced 0") {
		t.Error("/metrics lacks loopvol_node_self_fenced 0")
	}
	found := false
	for line := range strings.Lines(metrics) {
		if v, ok := strings.CutPrefix(line, "loopvol_node_heartbeat_last_renewed_timestamp_seconds "); ok {
			found = strings.TrimSpace(v) != "0"
		}
	}
	if !found {
		t.Error("/metrics lacks a non-zero loopvol_node_heartbeat_last_renewed_timestamp_seconds")
	}
}
