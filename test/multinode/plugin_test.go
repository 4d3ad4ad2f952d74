package multinode

import (
	"context"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/loopvol/loopvol/internal/harness/cluster"
	"github.com/loopvol/loopvol/internal/harness/cluster/clustertest"
)

// testKubectlPlugin: kubectl loopvol on two nodes sharing a pool. status
// shows both nodes, each registered, its node plugin answering through
// pods/exec and the pool marked shared (both nodes serve it); a claim used
// on the second node is attached, staged and published there, as volumes
// says; doctor passes.
func testKubectlPlugin(t *testing.T, c *cluster.Cluster) {
	ctx := context.Background()
	ns := namespace(t, c, "plugin")
	node := c.Nodes()[1].Name
	if _, err := c.Client.CoreV1().PersistentVolumeClaims(ns).Create(ctx, cluster.Claim(ns, "data", "loopvol", "32Mi"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	user := onNode(cluster.VolumePod(ns, "user", "data", "echo ready && busybox sleep 1000000 & wait"), node)
	if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, user, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	running(ctx, t, c, ns, "user")
	pv := volumeOf(ctx, t, c, ns, "data")

	p := clustertest.NewPlugin(t, c)
	var status struct {
		Nodes []struct {
			Name        string `json:"name"`
			PluginReady bool   `json:"pluginReady"`
			Registered  bool   `json:"registered"`
			Error       string `json:"error"`
			Pools       []struct {
				Name   string `json:"name"`
				Shared bool   `json:"shared"`
				Health string `json:"health"`
			} `json:"pools"`
		} `json:"nodes"`
	}
	p.JSON(&status, "status")
	if len(status.Nodes) != 2 {
		t.Fatalf("status: nodes %+v, want both", status.Nodes)
	}
	for _, n := range status.Nodes {
		shared := false
		for _, pl := range n.Pools {
			shared = shared || (pl.Name == "default" && pl.Shared && pl.Health == "ok")
		}
		if !n.PluginReady || !n.Registered || n.Error != "" || !shared {
			t.Errorf("status of node %s = %+v, want its plugin ready, registered and answering, pool default shared and ok", n.Name, n)
		}
	}
	p.Table("status")

	var vols struct {
		Volumes []struct {
			PV          string   `json:"pv"`
			Node        string   `json:"node"`
			StagedOn    string   `json:"stagedOn"`
			TargetPaths []string `json:"targetPaths"`
		} `json:"volumes"`
	}
	p.JSON(&vols, "volumes", "-n", ns)
	if len(vols.Volumes) != 1 || vols.Volumes[0].PV != pv.Name || vols.Volumes[0].Node != node || vols.Volumes[0].StagedOn != node || len(vols.Volumes[0].TargetPaths) != 1 {
		t.Errorf("volumes -n %s = %+v, want %s attached to, staged and published once on %s", ns, vols.Volumes, pv.Name, node)
	}
	// describe follows the claim, its volume and its Pod to the second
	// node, which staged it.
	for _, args := range [][]string{{"describe", "pvc", "data", "-n", ns}, {"describe", "pv", pv.Name}, {"describe", "pod", "user", "-n", ns}} {
		out, code := p.Table(args...)
		if code != 0 || !strings.Contains(out, pv.Name) || !strings.Contains(out, node) || strings.Contains(out, "Waiting:") {
			t.Errorf("%s (exit %d): want %s on node %s, waiting for nothing", strings.Join(args, " "), code, pv.Name, node)
		}
	}
	// The webhook has no serving certificate on these clusters (test/cluster's
	// Webhook scenario makes one): doctor fails it for exactly that, and
	// every other check passes.
	checks, code := p.Doctor()
	if wh := checks["webhook"]; code != 1 || wh.Result != "fail" || !strings.Contains(wh.Detail, "loopvol-webhook-tls is missing") {
		t.Errorf("doctor on two nodes without the webhook's Secret: exit %d, webhook %+v; want it failed for the missing Secret", code, wh)
	}
	for _, ch := range checks {
		if ch.Name != "webhook" && ch.Result != "pass" {
			t.Errorf("doctor on two healthy nodes: %s is %s: %s", ch.Name, ch.Result, ch.Detail)
		}
	}
	p.Table("doctor")
}
