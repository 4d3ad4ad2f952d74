package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/loopvol/loopvol/pkg/loop/looptest"
	"github.com/loopvol/loopvol/test/internal/driverproc"
)

// The names a cluster switching between external-provisioner's capacity
// controller and loopvol's depends on, written out as upstream writes them.
const (
	zoneKey           = "topology.loopvol.csi.io/zone"
	capDriverLabel    = "csi.storage.k8s.io/drivername"
	capManagedByLabel = "csi.storage.k8s.io/managed-by"
	capManagedBy      = "external-provisioner"
	capacityLease     = "loopvol-capacity-leader-loopvol-csi-io"
	methodGetCapacity = "/csi.v1.Controller/GetCapacity"
	capacityQueue     = "csistoragecapacity"

	capVolumeSize = 64 << 20
)

// capRig is a rig whose driver also serves two pools of zones of their own,
// each on a tmpfs of its own: nothing else writes there, so the driver's
// capacity of each zone is exact and stays put between the test's steps.
// Nodes of the test carry the zone label and a CSINode that lists the
// driver with the zone as its topology key, as kubelet would write them.
type capRig struct {
	*rig
	ns         string
	za, zb     string            // the zones of the two tmpfs pools
	pools      map[string]string // zone → pool directory
	kubeconfig string            // a user with exactly the capacity RBAC
}

// newCapRig mounts the pools (512 MiB in za, 256 MiB in zb), starts the
// rig's driver with them and makes a namespace for the objects.
func newCapRig(t *testing.T) *capRig {
	t.Helper()
	driverproc.RequireRoot(t)
	dir := t.TempDir()
	id := shortID()
	c := &capRig{za: "cap-a-" + id, zb: "cap-b-" + id, pools: map[string]string{}}
	config := "pools:\n"
	for _, p := range []struct {
		name, zone string
		size       string
	}{{"cap-a", c.za, "512m"}, {"cap-b", c.zb, "256m"}} {
		// Mounted before the rig starts, so the unmount runs after the
		// driver stopped.
		path := looptest.Tmpfs(t, p.size)
		c.pools[p.zone] = path
		config += fmt.Sprintf("- name: %s\n  zone: %s\n  path: %s\n", p.name, p.zone, path)
	}
	cfg := filepath.Join(dir, "pools.yaml")
	if err := os.WriteFile(cfg, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	c.rig = newRig(t, "--config="+cfg)
	c.ns = c.env.Namespace(t)
	t.Cleanup(c.deleteClusterObjects)
	return c
}

// startCapacity starts the sidecar with --controllers=capacity as a user
// with exactly the RBAC of rbac-capacity.yaml (ClusterRole cluster-wide,
// Role in the test's namespace), $NAMESPACE set to it and env added. The
// poll is an hour unless args say otherwise, so whatever the test sees
// happen promptly was driven by events.
func (c *capRig) startCapacity(name string, env map[string]string, args ...string) *attacher {
	c.t.Helper()
	if c.kubeconfig == "" {
		c.kubeconfig = c.restrictedKubeconfig("loopvol-capacity-"+c.id, c.ns, "rbac-capacity.yaml")
	}
	// The child inherits the test's environment (the tests never run in
	// parallel); t.Setenv restores it when the test ends.
	c.t.Setenv("NAMESPACE", c.ns)
	for k, v := range env {
		c.t.Setenv(k, v)
	}
	all := append([]string{"--controllers=capacity", "--capacity-poll-interval=1h", "--leader-election-namespace=" + c.ns}, args...)
	return c.startSidecar(name, c.kubeconfig, all...)
}

// createNode creates Node r.nodeName(suffix) with the zone label (none for
// "") and its CSINode listing the driver with the zone as topology key.
func (c *capRig) createNode(suffix, zone string) string {
	c.t.Helper()
	name := c.nodeName(suffix)
	labels := c.labels()
	if zone != "" {
		labels[zoneKey] = zone
	}
	if _, err := c.client.CoreV1().Nodes().Create(c.ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{}); err != nil {
		c.t.Fatalf("create Node %s: %v", name, err)
	}
	_, err := c.client.StorageV1().CSINodes().Create(c.ctx, &storagev1.CSINode{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: c.labels()},
		Spec: storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{{
			Name: driverName, NodeID: name, TopologyKeys: []string{zoneKey},
		}}},
	}, metav1.CreateOptions{})
	if err != nil {
		c.t.Fatalf("create CSINode %s: %v", name, err)
	}
	return name
}

// setZone sets (or with "" removes) a Node's zone label, as a cluster
// administrator would.
func (c *capRig) setZone(node, zone string) {
	c.t.Helper()
	value := "null"
	if zone != "" {
		value = fmt.Sprintf("%q", zone)
	}
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%s}}}`, zoneKey, value)
	if _, err := c.client.CoreV1().Nodes().Patch(c.ctx, node, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		c.t.Fatalf("set the zone of Node %s to %q: %v", node, zone, err)
	}
}

// createClass creates StorageClass e2e-<id>-<suffix> of the driver.
func (c *capRig) createClass(suffix string, mode storagev1.VolumeBindingMode) string {
	c.t.Helper()
	name := c.nodeName(suffix) // the same unique prefix
	_, err := c.client.StorageV1().StorageClasses().Create(c.ctx, &storagev1.StorageClass{
		ObjectMeta:        metav1.ObjectMeta{Name: name, Labels: c.labels()},
		Provisioner:       driverName,
		VolumeBindingMode: &mode,
	}, metav1.CreateOptions{})
	if err != nil {
		c.t.Fatalf("create StorageClass %s: %v", name, err)
	}
	return name
}

func (c *capRig) deleteClass(name string) {
	c.t.Helper()
	if err := c.client.StorageV1().StorageClasses().Delete(c.ctx, name, metav1.DeleteOptions{}); err != nil {
		c.t.Fatalf("delete StorageClass %s: %v", name, err)
	}
}

// deleteClusterObjects deletes the test's StorageClasses and Nodes (the
// rig deletes its CSINodes and PersistentVolumes; namespaced objects stay
// in the test's namespace, which nothing else watches).
func (c *capRig) deleteClusterObjects() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sel := c.listOptions()
	if err := c.client.StorageV1().StorageClasses().DeleteCollection(ctx, metav1.DeleteOptions{}, sel); err != nil {
		c.t.Errorf("cleanup: StorageClasses: %v", err)
	}
	if err := c.client.CoreV1().Nodes().DeleteCollection(ctx, metav1.DeleteOptions{}, sel); err != nil {
		c.t.Errorf("cleanup: Nodes: %v", err)
	}
}

// capKey names one CSIStorageCapacity: a class and a zone.
type capKey struct{ class, zone string }

func (k capKey) String() string { return k.class + "@" + k.zone }

// zoneOf is the zone an object's nodeTopology selects ("?" when it is not
// one zone label).
func zoneOf(o *storagev1.CSIStorageCapacity) string {
	if o.NodeTopology == nil || len(o.NodeTopology.MatchExpressions) > 0 || len(o.NodeTopology.MatchLabels) != 1 {
		return "?"
	}
	if z, ok := o.NodeTopology.MatchLabels[zoneKey]; ok {
		return z
	}
	return "?"
}

// capacityObjects returns every CSIStorageCapacity in the test's namespace.
func (c *capRig) capacityObjects(ctx context.Context) ([]storagev1.CSIStorageCapacity, error) {
	list, err := c.client.StorageV1().CSIStorageCapacities(c.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	return list.Items, nil
}

// driverCapacity asks the driver what GetCapacity says for class in zone,
// as the controller should (the class's parameters, the zone's segment).
func (c *capRig) driverCapacity(ctx context.Context, class, zone string) (int64, error) {
	sc, err := c.client.StorageV1().StorageClasses().Get(ctx, class, metav1.GetOptions{})
	if err != nil {
		return 0, err
	}
	rsp, err := c.ctrl.GetCapacity(ctx, &csi.GetCapacityRequest{
		Parameters:         sc.Parameters,
		AccessibleTopology: &csi.Topology{Segments: map[string]string{zoneKey: zone}},
	})
	if err != nil {
		return 0, err
	}
	return rsp.GetAvailableCapacity(), nil
}

// poolFree is statfs's available bytes of a zone's pool minus the bytes its
// images were promised and the filesystem has not allocated: the driver's
// capacity, computed independently of it.
func (c *capRig) poolFree(zone string) int64 {
	c.t.Helper()
	path := c.pools[zone]
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		c.t.Fatal(err)
	}
	free := int64(st.Bavail) * st.Bsize
	images, _ := filepath.Glob(filepath.Join(path, "volumes", "*.img"))
	for _, img := range images {
		var s unix.Stat_t
		if err := unix.Stat(img, &s); err == nil {
			free -= max(0, s.Size-s.Blocks*512)
		}
	}
	return max(0, free)
}

// published is the outcome of waitPublished: the object of each key.
type published map[capKey]*storagev1.CSIStorageCapacity

// waitPublished waits until the namespace holds exactly one object per key
// of want and no other, each labelled as upstream labels them (managed-by
// managedBy), of its class and zone, with the driver's capacity of that
// class and zone now as capacity and maximumVolumeSize (one pool per zone:
// the largest volume is all of it). want maps a key to a figure it must
// also equal (statfs minus promised), or -1.
func (c *capRig) waitPublished(what, managedBy string, want map[capKey]int64) published {
	c.t.Helper()
	var (
		got     published
		problem string
	)
	err := wait.PollUntilContextTimeout(c.ctx, 100*time.Millisecond, shortWait, true, func(ctx context.Context) (bool, error) {
		objs, err := c.capacityObjects(ctx)
		if err != nil {
			problem = "list: " + err.Error()
			return false, nil
		}
		got, problem = published{}, ""
		var extra []string
		for i := range objs {
			o := &objs[i]
			k := capKey{class: o.StorageClassName, zone: zoneOf(o)}
			if _, wanted := want[k]; !wanted {
				extra = append(extra, o.Name+" ("+k.String()+")")
				continue
			}
			if prev := got[k]; prev != nil {
				problem = fmt.Sprintf("%s has two objects, %s and %s", k, prev.Name, o.Name)
				return false, nil
			}
			got[k] = o
		}
		if len(extra) > 0 {
			problem = "objects that should not exist: " + strings.Join(extra, ", ")
			return false, nil
		}
		for k, figure := range want {
			o := got[k]
			if o == nil {
				problem = "no object for " + k.String()
				return false, nil
			}
			if o.Labels[capDriverLabel] != driverName || o.Labels[capManagedByLabel] != managedBy {
				problem = fmt.Sprintf("%s: labels %v", o.Name, o.Labels)
				return false, nil
			}
			driver, err := c.driverCapacity(ctx, k.class, k.zone)
			if err != nil {
				problem = "GetCapacity: " + err.Error()
				return false, nil
			}
			if o.Capacity == nil || o.Capacity.Value() != driver || o.MaximumVolumeSize == nil || o.MaximumVolumeSize.Value() != driver {
				problem = fmt.Sprintf("%s (%s): capacity %s, maximumVolumeSize %s, the driver says %d", o.Name, k, qString(o.Capacity), qString(o.MaximumVolumeSize), driver)
				return false, nil
			}
			if figure >= 0 && driver != figure {
				problem = fmt.Sprintf("%s: the driver says %d, statfs minus promised %d", k, driver, figure)
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		c.t.Fatalf("%s: not so after %s: %s", what, shortWait, problem)
	}
	return got
}

func qString(q *resource.Quantity) string {
	if q == nil {
		return "<none>"
	}
	return fmt.Sprintf("%d", q.Value())
}

// figures returns the statfs-minus-promised figure of the zone of each
// key, for waitPublished (-1 for a zone without a pool of the test).
func (c *capRig) figures(keys ...capKey) map[capKey]int64 {
	c.t.Helper()
	out := map[capKey]int64{}
	for _, k := range keys {
		out[k] = -1
		if _, ok := c.pools[k.zone]; ok {
			out[k] = c.poolFree(k.zone)
		}
	}
	return out
}

// createVolume creates a volume in zone on the driver and its
// PersistentVolume with the node affinity the provisioner gives it.
func (c *capRig) createVolume(name, class, zone string, size int64) volume {
	c.t.Helper()
	rsp, err := c.ctrl.CreateVolume(c.ctx, &csi.CreateVolumeRequest{
		Name:                      c.id + "-" + name,
		CapacityRange:             &csi.CapacityRange{RequiredBytes: size},
		VolumeCapabilities:        []*csi.VolumeCapability{mountCapability()},
		AccessibilityRequirements: &csi.TopologyRequirement{Requisite: []*csi.Topology{{Segments: map[string]string{zoneKey: zone}}}},
	})
	if err != nil {
		c.t.Fatalf("CreateVolume %s in %s: %v", name, zone, err)
	}
	v := volume{handle: rsp.GetVolume().GetVolumeId(), pv: "e2e-" + c.id + "-" + name}
	_, err = c.client.CoreV1().PersistentVolumes().Create(c.ctx, &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: v.pv, Labels: c.labels()},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: *resource.NewQuantity(size, resource.BinarySI)},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
			StorageClassName:              class,
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: driverName, VolumeHandle: v.handle, FSType: "ext4",
			}},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: zoneKey, Operator: corev1.NodeSelectorOpIn, Values: []string{zone}}},
			}}}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		c.t.Fatalf("create PersistentVolume %s: %v", v.pv, err)
	}
	return v
}

// deleteVolume deletes the volume on the driver and then its PV (with the
// pv-protection finalizer, whose controller does not run here), as the
// provisioner does.
func (c *capRig) deleteVolume(v volume) {
	c.t.Helper()
	if _, err := c.ctrl.DeleteVolume(c.ctx, &csi.DeleteVolumeRequest{VolumeId: v.handle}); err != nil {
		c.t.Fatalf("DeleteVolume %s: %v", v.handle, err)
	}
	_, err := c.client.CoreV1().PersistentVolumes().Patch(c.ctx, v.pv, types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
	if err == nil {
		err = c.client.CoreV1().PersistentVolumes().Delete(c.ctx, v.pv, metav1.DeleteOptions{})
	}
	if err != nil && !apierrors.IsNotFound(err) {
		c.t.Fatalf("delete PersistentVolume %s: %v", v.pv, err)
	}
}

// waitIdle waits until the sidecar has asked the driver at least calls
// times for capacity and its queue is empty with nothing in progress: it
// has done all it was going to do for now.
func (c *capRig) waitIdle(a *attacher, what string, calls float64) metricSet {
	c.t.Helper()
	var m metricSet
	c.waitMetric(a, what, func(s metricSet) bool {
		m = s
		q := map[string]string{"name": capacityQueue}
		return s.sidecarCalls(methodGetCapacity, "OK") >= calls &&
			s.value("workqueue_depth", q) == 0 && s.value("workqueue_unfinished_work_seconds", q) == 0
	})
	return m
}

// TestCapacityFollowsClassesAndVolumes: a class of the driver gets one
// object per zone with the pool's real capacity (the driver's GetCapacity,
// and statfs minus what is promised); an Immediate class gets none; a
// volume created in a zone (its PersistentVolume added) shows at once in
// that zone's object and in no other, its deletion too; a deleted class
// takes its objects along. The poll is an hour: all of it is event-driven.
func TestCapacityFollowsClassesAndVolumes(t *testing.T) {
	c := newCapRig(t)
	c.createNode("1", c.za)
	c.createNode("2", c.zb)
	c.createNode("3", c.za)
	c.createNode("4", "") // no zone label yet: no segment
	s := c.startCapacity("capacity", nil, "--capacity-ownerref-level=-1")

	fast := c.createClass("fast", storagev1.VolumeBindingWaitForFirstConsumer)
	c.createClass("now", storagev1.VolumeBindingImmediate)
	fa, fb := capKey{fast, c.za}, capKey{fast, c.zb}
	start := time.Now()
	before := c.waitPublished("a new class", capManagedBy, c.figures(fa, fb))
	t.Logf("objects of a new class published %s after it was created", time.Since(start).Round(time.Millisecond))
	if a, b := before[fa].Capacity.Value(), before[fb].Capacity.Value(); a <= b || b <= 0 {
		t.Errorf("zone %s (512 MiB pool) reports %d, zone %s (256 MiB pool) %d: each zone must have its own figure", c.za, a, c.zb, b)
	}
	m := c.scrape(s.metrics)
	expectCount(t, "csistoragecapacities_desired_goal", m.value("csistoragecapacities_desired_goal", nil), 2)
	expectCount(t, "csistoragecapacities_desired_current", m.value("csistoragecapacities_desired_current", nil), 2)
	expectCount(t, "csistoragecapacities_obsolete", m.value("csistoragecapacities_obsolete", nil), 0)

	// A volume in za: za's object shows the smaller figure at once; zb's
	// object is not even written.
	start = time.Now()
	v := c.createVolume("v1", fast, c.za, capVolumeSize)
	after := c.waitPublished("a volume created in "+c.za, capManagedBy, c.figures(fa, fb))
	t.Logf("a volume's PersistentVolume showed in its zone's object %s after it was created", time.Since(start).Round(time.Millisecond))
	if drop := before[fa].Capacity.Value() - after[fa].Capacity.Value(); drop < capVolumeSize {
		t.Errorf("za's capacity dropped by %d after a %d-byte volume", drop, capVolumeSize)
	}
	if after[fb].ResourceVersion != before[fb].ResourceVersion {
		t.Errorf("zb's object was written (resourceVersion %s → %s) for a volume in za", before[fb].ResourceVersion, after[fb].ResourceVersion)
	}

	// The volume deleted, then its PV: back to the figure before.
	start = time.Now()
	c.deleteVolume(v)
	back := c.waitPublished("the volume deleted", capManagedBy, c.figures(fa, fb))
	t.Logf("a deleted volume showed %s after it was deleted", time.Since(start).Round(time.Millisecond))
	if back[fa].Capacity.Value() != before[fa].Capacity.Value() {
		t.Errorf("za's capacity %d after the volume went, %d before it came", back[fa].Capacity.Value(), before[fa].Capacity.Value())
	}
	if back[fa].Name != before[fa].Name {
		t.Errorf("za's object was replaced (%s → %s) instead of updated", before[fa].Name, back[fa].Name)
	}

	m = c.scrape(s.metrics)
	if m.sidecarCalls(methodGetCapacity, "OK") == 0 {
		t.Error("no GetCapacity in csi_sidecar_operations_seconds: the calls do not go through the timed connection")
	}

	// The class deleted: its objects go.
	c.deleteClass(fast)
	c.waitPublished("the class deleted", capManagedBy, nil)
	if objs, err := c.capacityObjects(c.ctx); err != nil || len(objs) != 0 {
		t.Errorf("objects left after the class went: %v %v", objs, err)
	}
}

// TestCapacityRepairsAndFollowsTopology: an object deleted or edited by
// hand is restored; a Node moving between zones, losing or gaining its
// zone label, or losing its CSINode adds and removes segments at once.
func TestCapacityRepairsAndFollowsTopology(t *testing.T) {
	c := newCapRig(t)
	n1 := c.createNode("1", c.za)
	n2 := c.createNode("2", c.zb)
	n3 := c.createNode("3", "")
	c.startCapacity("capacity", nil, "--capacity-ownerref-level=-1")
	fast := c.createClass("fast", storagev1.VolumeBindingWaitForFirstConsumer)
	fa, fb := capKey{fast, c.za}, capKey{fast, c.zb}
	objs := c.waitPublished("a new class", capManagedBy, c.figures(fa, fb))

	// Deleted by hand: made again.
	if err := c.client.StorageV1().CSIStorageCapacities(c.ns).Delete(c.ctx, objs[fa].Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	again := c.waitPublished("za's object deleted by hand", capManagedBy, c.figures(fa, fb))
	if again[fa].Name == objs[fa].Name {
		t.Errorf("za's object %s still exists after it was deleted", objs[fa].Name)
	}

	// Edited by hand: restored, in place.
	for _, p := range []string{`{"capacity":"1"}`, `{"maximumVolumeSize":null}`} {
		if _, err := c.client.StorageV1().CSIStorageCapacities(c.ns).Patch(c.ctx, objs[fb].Name, types.MergePatchType, []byte(p), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		fixed := c.waitPublished("zb's object edited by hand with "+p, capManagedBy, c.figures(fa, fb))
		if fixed[fb].Name != objs[fb].Name {
			t.Errorf("zb's object replaced (%s → %s) instead of repaired", objs[fb].Name, fixed[fb].Name)
		}
	}

	// n2, zb's only node, moves to za: zb goes.
	c.setZone(n2, c.za)
	c.waitPublished(n2+" moved to "+c.za, capManagedBy, c.figures(fa))
	// n2 moves to a zone without a pool: a segment with no capacity.
	zc := "cap-c-" + c.id
	fc := capKey{fast, zc}
	c.setZone(n2, zc)
	zero := c.waitPublished(n2+" moved to "+zc, capManagedBy, c.figures(fa, fc))
	if zero[fc].Capacity.Value() != 0 {
		t.Errorf("a zone without a pool reports %s", zero[fc].Capacity)
	}
	// n3 gets zb's label: zb is back.
	c.setZone(n3, c.zb)
	c.waitPublished(n3+" labelled "+c.zb, capManagedBy, c.figures(fa, fb, fc))
	// n2's CSINode goes (the driver left the node): zc goes.
	if err := c.client.StorageV1().CSINodes().Delete(c.ctx, n2, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	c.waitPublished("the CSINode of "+n2+" deleted", capManagedBy, c.figures(fa, fb))
	// n1 loses its label: za goes, only zb is left.
	c.setZone(n1, "")
	c.waitPublished(n1+" lost its zone label", capManagedBy, c.figures(fb))
}

// TestCapacityAdoptsUpstreamObjectsAndRestarts: objects external-provisioner
// made (its labels, a stale figure, a duplicate) are adopted, not
// duplicated: fixed in place, the duplicate deleted, and given the owner
// found from $POD_NAME (--capacity-ownerref-level=1: the Pod's
// StatefulSet). The controller runs under its own Lease. Restarted, it
// adopts its own objects and writes nothing.
func TestCapacityAdoptsUpstreamObjectsAndRestarts(t *testing.T) {
	c := newCapRig(t)
	c.createNode("1", c.za)
	c.createNode("2", c.zb)
	fast := c.createClass("fast", storagev1.VolumeBindingWaitForFirstConsumer)
	fa, fb := capKey{fast, c.za}, capKey{fast, c.zb}

	// What external-provisioner left: za with a stale figure, zb twice.
	upstream := func(zone string, capacity int64) string {
		o, err := c.client.StorageV1().CSIStorageCapacities(c.ns).Create(c.ctx, &storagev1.CSIStorageCapacity{
			ObjectMeta: metav1.ObjectMeta{
				GenerateName: "csisc-",
				Labels:       map[string]string{capDriverLabel: driverName, capManagedByLabel: capManagedBy},
			},
			StorageClassName: fast,
			NodeTopology:     &metav1.LabelSelector{MatchLabels: map[string]string{zoneKey: zone}},
			Capacity:         resource.NewQuantity(capacity, resource.BinarySI),
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return o.Name
	}
	upA := upstream(c.za, 1)
	upB := []string{upstream(c.zb, 2), upstream(c.zb, 3)}

	// The sidecar's Pod, controlled by a StatefulSet.
	labels := map[string]string{"app": "loopvol-controller"}
	sts, err := c.client.AppsV1().StatefulSets(c.ns).Create(c.ctx, &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: "loopvol-controller"},
		Spec: appsv1.StatefulSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "sidecar", Image: "loopvol/attacher"}}},
			},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod, err := c.client.CoreV1().Pods(c.ns).Create(c.ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "loopvol-controller-0", Labels: labels, OwnerReferences: []metav1.OwnerReference{{
			APIVersion: "apps/v1", Kind: "StatefulSet", Name: sts.Name, UID: sts.UID, Controller: ptr.To(true),
		}}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "sidecar", Image: "loopvol/attacher"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"POD_NAME": pod.Name}
	args := []string{"--capacity-ownerref-level=1", "--leader-election"}

	s := c.startCapacity("capacity", env, args...)
	objs := c.waitPublished("upstream's objects adopted", capManagedBy, c.figures(fa, fb))
	if objs[fa].Name != upA {
		t.Errorf("za: object %s, want upstream's %s fixed in place", objs[fa].Name, upA)
	}
	if !slices.Contains(upB, objs[fb].Name) {
		t.Errorf("zb: object %s, want one of upstream's %v kept", objs[fb].Name, upB)
	}
	for k, o := range objs {
		owner := metav1.GetControllerOf(o)
		if owner == nil || owner.UID != sts.UID || owner.Kind != "StatefulSet" || owner.Name != sts.Name {
			t.Errorf("%s: controlling owner %+v, want StatefulSet %s", k, owner, sts.Name)
		}
	}
	c.waitCapacityLease()
	rvs := map[capKey]string{}
	for k, o := range objs {
		rvs[k] = o.ResourceVersion
	}
	c.waitIdle(s, "first run idle", 2)
	if err := s.Stop(); err != nil {
		t.Fatalf("stop the sidecar: %v", err)
	}

	// Restarted: it asks the driver about both objects, finds them right
	// and writes nothing.
	s = c.startCapacity("capacity", env, args...)
	m := c.waitIdle(s, "restarted sidecar idle after checking both objects", 2)
	expectCount(t, "csistoragecapacities_desired_current after the restart", m.value("csistoragecapacities_desired_current", nil), 2)
	now := c.waitPublished("after the restart", capManagedBy, c.figures(fa, fb))
	for k, o := range now {
		if o.Name != objs[k].Name || o.ResourceVersion != rvs[k] {
			t.Errorf("%s: %s at resourceVersion %s after the restart, was %s at %s: a restart must write nothing",
				k, o.Name, o.ResourceVersion, objs[k].Name, rvs[k])
		}
	}
}

// waitCapacityLease waits until the capacity controller's Lease in the
// test's namespace has a holder.
func (c *capRig) waitCapacityLease() {
	c.t.Helper()
	err := wait.PollUntilContextTimeout(c.ctx, 100*time.Millisecond, shortWait, true, func(ctx context.Context) (bool, error) {
		lease, err := c.client.CoordinationV1().Leases(c.ns).Get(ctx, capacityLease, metav1.GetOptions{})
		return err == nil && ptr.Deref(lease.Spec.HolderIdentity, "") != "", nil
	})
	if err != nil {
		leases, _ := c.client.CoordinationV1().Leases(c.ns).List(c.ctx, metav1.ListOptions{})
		var names []string
		if leases != nil {
			for _, l := range leases.Items {
				names = append(names, l.Name)
			}
		}
		sort.Strings(names)
		c.t.Fatalf("no holder of Lease %s/%s within %s; Leases there: %v", c.ns, capacityLease, shortWait, names)
	}
}

// TestCapacityNodeDeployment: with --node-deployment the sidecar publishes
// only its node's own segment (the driver's NodeGetInfo topology, zone e2e
// of the rig's pool), with managed-by external-provisioner-<node>, and
// leaves the central controller's objects alone.
func TestCapacityNodeDeployment(t *testing.T) {
	c := newCapRig(t)
	node := c.createNode("1", c.za) // a central segment, not this sidecar's
	fast := c.createClass("fast", storagev1.VolumeBindingWaitForFirstConsumer)
	central := c.startCapacity("central", nil, "--capacity-ownerref-level=-1")
	c.waitPublished("the central controller's object", capManagedBy, c.figures(capKey{fast, c.za}))
	c.startCapacity("node", map[string]string{"NODE_NAME": node}, "--capacity-ownerref-level=-1", "--node-deployment")

	// Both sets side by side: the central one of za, the node's of e2e.
	managed := capManagedBy + "-" + node
	var problem string
	err := wait.PollUntilContextTimeout(c.ctx, 100*time.Millisecond, shortWait, true, func(ctx context.Context) (bool, error) {
		objs, err := c.capacityObjects(ctx)
		if err != nil {
			problem = err.Error()
			return false, nil
		}
		byManager := map[string][]string{}
		for i := range objs {
			o := &objs[i]
			byManager[o.Labels[capManagedByLabel]] = append(byManager[o.Labels[capManagedByLabel]], zoneOf(o))
			if o.Labels[capManagedByLabel] == managed && (o.Capacity == nil || o.Capacity.Value() <= 0) {
				problem = fmt.Sprintf("%s: capacity %s", o.Name, qString(o.Capacity))
				return false, nil
			}
		}
		problem = fmt.Sprint(byManager)
		return slices.Equal(byManager[capManagedBy], []string{c.za}) && slices.Equal(byManager[managed], []string{"e2e"}) && len(byManager) == 2, nil
	})
	if err != nil {
		t.Fatalf("zones by managed-by label after %s: %s; want %s: [%s], %s: [e2e]", shortWait, problem, capManagedBy, c.za, managed)
	}
	if err := central.Stop(); err != nil {
		t.Errorf("stop the central sidecar: %v", err)
	}
}
