package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/loopvol/loopvol/test/internal/attacherproc"
	"github.com/loopvol/loopvol/test/internal/driverproc"
)

// localNode is a second "node" of a --node-deployment test: a driver
// (--mode=all) with a pool of its own, as a DaemonSet pod on another node
// would run it.
type localNode struct {
	name    string // the Kubernetes node name
	nodeID  string
	driver  *driverproc.Driver
	metrics string
	ctrl    csi.ControllerClient
}

// startLocalNode starts a driver for nodeID on a pool of its own, in a zone
// of its own (named after the node, as a local pool's zone is).
func (r *rig) startLocalNode(suffix, nodeID string) *localNode {
	r.t.Helper()
	dir := filepath.Join(r.dir, "local-"+suffix)
	for _, d := range []string{filepath.Join(dir, "pool"), filepath.Join(dir, "kubelet")} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			r.t.Fatal(err)
		}
	}
	n := &localNode{name: r.nodeName(suffix), nodeID: nodeID}
	addr := attacherproc.FreeAddress(r.t)
	n.driver = driverproc.Start(r.t, dir, "--mode=all", "--node-id="+nodeID, "--zone="+n.name,
		"--pool="+suffix+"="+filepath.Join(dir, "pool"), "--kubelet-dir="+filepath.Join(dir, "kubelet"),
		"--max-volumes-per-node=0", "--http-endpoint="+addr)
	n.metrics = "http://" + addr + "/metrics"
	n.ctrl = csi.NewControllerClient(n.driver.Conn)
	r.createCSINode(n.name, nodeID)
	return n
}

// TestNodeDeployment: two nodes, each with its own driver and pool and its
// own sidecar with --node-deployment --controllers=attach,capacity and
// leader election (a DaemonSet). Each sidecar attaches and detaches exactly
// the VolumeAttachments of its node, through its own driver, holds a Lease of
// its own node, and publishes one CSIStorageCapacity object for its node's
// segment with its own managed-by value; nothing is handled twice or by the
// wrong node.
func TestNodeDeployment(t *testing.T) {
	r := newRig(t)
	ns := r.env.Namespace(t)
	t.Setenv("NAMESPACE", ns) // the capacity controller's objects
	nodes := []*localNode{r.startLocalNode("a", "local-a"), r.startLocalNode("b", "local-b")}
	class := r.createWFFCClass("nodes")
	kubeconfig := r.restrictedKubeconfig("loopvol-nodedeploy-"+r.id, ns, "rbac-attacher.yaml", "rbac-capacity.yaml")
	const n = 20
	var sidecars []*attacher
	var vols [][]volume
	var names [][]string
	for _, node := range nodes {
		sidecars = append(sidecars, r.startSidecar("sidecar-"+node.nodeID, kubeconfig,
			"--csi-address="+node.driver.Endpoint, "--node-deployment", "--node-name="+node.name,
			"--controllers=attach,capacity", "--capacity-ownerref-level=-1",
			"--leader-election", "--leader-election-namespace="+ns))
		v := r.createVolumesOn(node.ctrl, node.nodeID, n)
		vols = append(vols, v)
		names = append(names, r.createVAs(v, node.name))
	}
	for i, node := range nodes {
		r.waitVAs("VolumeAttachments of "+node.name+" attached", longWait, names[i], attachedTo(node.nodeID))
	}
	for i, node := range nodes {
		dm, sm := r.scrape(node.metrics), r.scrape(sidecars[i].metrics)
		expectCount(t, node.name+": driver ControllerPublishVolume calls (any code)", dm.driverCalls(methodPublish, ""), n)
		expectCount(t, node.name+": sidecar attaches", sm.attaches(), n)
		expectCount(t, node.name+": sidecar attach errors", sm.attachErrors(), 0)
	}

	// One Lease per node, each held: the replicas of one node would share
	// it, those of two nodes never do.
	leases := map[string]string{}
	err := wait.PollUntilContextTimeout(r.ctx, 200*time.Millisecond, shortWait, true, func(ctx context.Context) (bool, error) {
		for _, node := range nodes {
			name := leaseName + "-" + node.name
			l, err := r.client.CoordinationV1().Leases(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" {
				return false, nil
			}
			leases[name] = *l.Spec.HolderIdentity
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("per-node Leases %s-<node> not both held: %v", leaseName, leases)
	}

	// One capacity object per node: its segment, its managed-by value,
	// the figure of its own pool.
	var problem string
	err = wait.PollUntilContextTimeout(r.ctx, 200*time.Millisecond, shortWait, true, func(ctx context.Context) (bool, error) {
		list, err := r.client.StorageV1().CSIStorageCapacities(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			problem = err.Error()
			return false, nil
		}
		byManager := map[string][]string{}
		for _, o := range list.Items {
			if o.StorageClassName != class || o.Capacity == nil || o.Capacity.Value() <= 0 {
				continue
			}
			byManager[o.Labels["csi.storage.k8s.io/managed-by"]] = append(byManager[o.Labels["csi.storage.k8s.io/managed-by"]],
				o.NodeTopology.MatchLabels["topology.loopvol.csi.io/zone"])
		}
		problem = fmt.Sprint(byManager)
		for _, node := range nodes {
			if got := byManager["external-provisioner-"+node.name]; len(got) != 1 || got[0] != node.name {
				return false, nil
			}
		}
		return len(byManager) == len(nodes), nil
	})
	if err != nil {
		t.Fatalf("CSIStorageCapacity objects by managed-by label: %s; want one per node, of its own zone", problem)
	}

	for i := range nodes {
		r.deleteVAs(names[i])
	}
	for i, node := range nodes {
		r.waitVAs("VolumeAttachments of "+node.name+" detached", longWait, names[i], gone)
		dm, sm := r.scrape(node.metrics), r.scrape(sidecars[i].metrics)
		expectCount(t, node.name+": driver ControllerUnpublishVolume OK calls", dm.driverCalls(methodUnpublish, "OK"), n)
		expectCount(t, node.name+": sidecar detaches", sm.detaches(), n)
		expectCount(t, node.name+": driver ControllerPublishVolume calls in all", dm.driverCalls(methodPublish, ""), n)
	}
	for i := range nodes {
		r.deletePVs(vols[i])
		r.waitPVsReleased("PersistentVolumes of "+nodes[i].name+" released", vols[i])
	}
}

// createWFFCClass creates a WaitForFirstConsumer StorageClass of the driver
// with no parameters (every pool of a segment), deleted when the test ends.
func (r *rig) createWFFCClass(suffix string) string {
	r.t.Helper()
	mode := storagev1.VolumeBindingWaitForFirstConsumer
	sc, err := r.client.StorageV1().StorageClasses().Create(r.ctx, &storagev1.StorageClass{
		ObjectMeta:        metav1.ObjectMeta{Name: "e2e-" + r.id + "-" + suffix, Labels: r.labels()},
		Provisioner:       driverName,
		VolumeBindingMode: &mode,
	}, metav1.CreateOptions{})
	if err != nil {
		r.t.Fatalf("create StorageClass: %v", err)
	}
	r.t.Cleanup(func() {
		ignoreNotFound(r.t, r.client.StorageV1().StorageClasses().Delete(context.WithoutCancel(r.ctx), sc.Name, metav1.DeleteOptions{}))
	})
	return sc.Name
}
