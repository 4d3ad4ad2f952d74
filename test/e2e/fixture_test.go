package e2e

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	"github.com/loopvol/loopvol/internal/harness/testenv"
	"github.com/loopvol/loopvol/test/internal/attacherproc"
	"github.com/loopvol/loopvol/test/internal/driverproc"
)

// The names a cluster switching between external-attacher and loopvol's
// attacher depends on, spelled out here rather than imported from
// pkg/attach: the tests check the contract, not the code's idea of it.
const (
	driverName       = "loopvol.csi.io"
	finalizer        = "external-attacher/loopvol-csi-io"
	nodeIDAnnotation = "csi.alpha.kubernetes.io/node-id"
	leaseName        = "external-attacher-leader-loopvol-csi-io"
	// pvProtection is the finalizer kube-apiserver's
	// StorageObjectInUseProtection admission adds to every new PV; its
	// controller (in kube-controller-manager, which does not run here)
	// would remove it. The tests do that part themselves.
	pvProtection = "kubernetes.io/pv-protection"
	// testLabel marks every object a test creates, with the test's ID.
	testLabel = "e2e.loopvol.csi.io/test"

	// nodeA is the node ID of the rig's --mode=all driver.
	nodeA = "node-a"

	// Per-method series of csi_plugin_operations_seconds (driver) and
	// csi_sidecar_operations_seconds (attacher).
	methodPublish   = "/csi.v1.Controller/ControllerPublishVolume"
	methodUnpublish = "/csi.v1.Controller/ControllerUnpublishVolume"

	volumeSize = 16 << 20 // the smallest ext4 volume the driver makes
)

// Timeouts of the waits: generous, because two cores run the API server,
// etcd, the driver, the attacher and the test at once; a healthy run takes a
// small fraction of each.
const (
	shortWait = 60 * time.Second
	longWait  = 3 * time.Minute
)

// rig is one test's world: a driver (--mode=all, node ID node-a) on its own
// pool, node names of its own, a fast API client, and cleanup of every
// object it made.
type rig struct {
	t      *testing.T
	ctx    context.Context
	env    *testenv.Env
	client kubernetes.Interface
	// id is short and unique; it prefixes the test's object names and is
	// the value of testLabel on them.
	id         string
	dir        string
	pool       string
	kubeconfig string // the administrator's
	// attacherKubeconfigs are users with the attacher's RBAC (its Lease
	// Role in the namespace of the key), made on first use.
	attacherKubeconfigs map[string]string

	driver        *driverproc.Driver
	driverArgs    []string
	driverMetrics string // URL of the driver's /metrics
	ctrl          csi.ControllerClient
}

// newRig starts a driver (--mode=all --node-id=node-a; extra driver flags
// override the defaults) and returns the rig. Before that it checks that no
// VolumeAttachment of the driver is left from an earlier test: the new
// attacher would act on it.
func newRig(t *testing.T, driverArgs ...string) *rig {
	t.Helper()
	return newRigWith(t, nil, driverArgs...)
}

// newRigWith is newRig with beforeDriver, if not nil, run on the rig just
// before its driver starts (a filesystem mounted on its pool directory).
func newRigWith(t *testing.T, beforeDriver func(r *rig), driverArgs ...string) *rig {
	t.Helper()
	driverproc.RequireRoot(t)
	env := cluster.Env(t)
	// Client-go logs through the test's logger; -v=2 keeps its reflector
	// chatter out of the output.
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.Verbosity(2)))
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logger))
	t.Cleanup(cancel)

	// The shared config has client-go's default 5 QPS: creating 400
	// objects would take 80 s.
	cfg := rest.CopyConfig(env.Config)
	cfg.QPS, cfg.Burst = 1000, 2000
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{t: t, ctx: ctx, env: env, client: client, id: shortID(), dir: t.TempDir()}

	vas, err := client.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("list VolumeAttachments: %v", err)
	}
	var left []string
	for _, va := range vas.Items {
		if va.Spec.Attacher == driverName {
			left = append(left, fmt.Sprintf("%s (test %q)", va.Name, va.Labels[testLabel]))
		}
	}
	if len(left) > 0 {
		t.Fatalf("VolumeAttachments of %s left over from an earlier test; this test's attacher would act on them: %v", driverName, left)
	}

	// Registered first, so that it runs last: after the attachers and
	// drivers have stopped, nothing re-adds a finalizer.
	t.Cleanup(r.deleteObjects)

	r.kubeconfig = env.Kubeconfig(t)
	r.pool = filepath.Join(r.dir, "pool")
	for _, d := range []string{r.pool, filepath.Join(r.dir, "kubelet"), filepath.Join(r.dir, "driver")} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	r.driverArgs = append([]string{"--mode=all", "--node-id=" + nodeA, "--zone=e2e", "--pool=e2e=" + r.pool,
		"--kubelet-dir=" + filepath.Join(r.dir, "kubelet"), "--max-volumes-per-node=0"}, driverArgs...)
	if beforeDriver != nil {
		beforeDriver(r)
	}
	r.startDriver()
	return r
}

// startDriver starts the rig's driver in r.dir/driver, with its socket at
// r.dir/driver/csi.sock (the same path after a restart) and /metrics on a
// fresh port. A log of an earlier run there is kept as driver.log.<n>.
func (r *rig) startDriver() {
	r.t.Helper()
	dir := filepath.Join(r.dir, "driver")
	logPath := filepath.Join(dir, "driver.log")
	if _, err := os.Stat(logPath); err == nil {
		for n := 1; ; n++ {
			old := fmt.Sprintf("%s.%d", logPath, n)
			if _, err := os.Stat(old); os.IsNotExist(err) {
				if err := os.Rename(logPath, old); err != nil {
					r.t.Fatal(err)
				}
				r.t.Cleanup(func() {
					if r.t.Failed() {
						data, _ := os.ReadFile(old)
						r.t.Logf("earlier driver log %s (last 4 KiB):\n%s", old, tail(string(data), 4096))
					}
				})
				break
			}
		}
	}
	addr := attacherproc.FreeAddress(r.t)
	r.driver = driverproc.Start(r.t, dir, append(slices.Clone(r.driverArgs), "--http-endpoint="+addr)...)
	r.driverMetrics = "http://" + addr + "/metrics"
	r.ctrl = csi.NewControllerClient(r.driver.Conn)
}

// startNodePlugin starts a --mode=node driver for nodeID on the rig's pool:
// its node record makes nodeID known to the controller, as a second node on
// a shared pool.
func (r *rig) startNodePlugin(nodeID string) *driverproc.Driver {
	r.t.Helper()
	dir := filepath.Join(r.dir, "node-"+nodeID)
	kubelet := filepath.Join(dir, "kubelet")
	if err := os.MkdirAll(kubelet, 0o750); err != nil {
		r.t.Fatal(err)
	}
	return driverproc.Start(r.t, dir, "--mode=node", "--node-id="+nodeID, "--zone=e2e", "--pool=e2e="+r.pool, "--kubelet-dir="+kubelet)
}

// attacher is a running attacher process and its /metrics and /healthz.
type attacher struct {
	*attacherproc.Attacher
	metrics string
	healthz string
}

// startAttacher starts an attacher for the rig's driver, with diagnostics on
// a fresh port, -v=4, and a 2 s reconcile; args add to or override these.
// It runs as a user that holds only the attacher's shipped RBAC
// (deploy/kubernetes/base/rbac-attacher.yaml), and the test fails if its
// log shows a request the API server refused as forbidden. Starting one
// under a name used before appends to that one's log.
func (r *rig) startAttacher(name string, args ...string) *attacher {
	r.t.Helper()
	ns := metav1.NamespaceDefault
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--leader-election-namespace="); ok {
			ns = v
		}
	}
	if r.attacherKubeconfigs == nil {
		r.attacherKubeconfigs = map[string]string{}
	}
	kc, ok := r.attacherKubeconfigs[ns]
	if !ok {
		kc = r.restrictedKubeconfig("loopvol-attacher-"+r.id+"-"+ns, ns, "rbac-attacher.yaml")
		r.attacherKubeconfigs[ns] = kc
	}
	return r.startSidecar(name, kc, args...)
}

// startSidecar starts cmd/attacher with kubeconfig, diagnostics on a fresh
// port, -v=4 and a 2 s reconcile; args add to or override these. The test
// fails if the log shows a request refused as forbidden (but for a
// restarted kube-apiserver's warm-up: see refusedLine): the kubeconfig
// holds the RBAC the deployment ships, and that must be enough.
func (r *rig) startSidecar(name, kubeconfig string, args ...string) *attacher {
	r.t.Helper()
	addr := attacherproc.FreeAddress(r.t)
	all := append([]string{
		"--kubeconfig=" + kubeconfig,
		"--csi-address=" + r.driver.Endpoint,
		"--http-endpoint=" + addr,
		"--reconcile-sync=2s",
		"--v=4",
	}, args...)
	a := attacherproc.Start(r.t, r.dir, name, all...)
	r.t.Cleanup(func() {
		_ = a.Stop() // before the stop attacherproc.Start registered: cleanups run last-in first-out
		line, warm := refusedLine(a.Log(), r.env.WarmUps())
		if warm > 0 {
			r.t.Logf("%s: left out %d refusals logged during a restarted kube-apiserver's warm-up", name, warm)
		}
		if line != "" {
			r.t.Errorf("%s: the API server refused a request as forbidden (the shipped RBAC is short):\n%s", name, line)
		}
	})
	return &attacher{Attacher: a, metrics: "http://" + addr + "/metrics", healthz: "http://" + addr + "/healthz"}
}

// warmUpLogSlack is how long after a warm-up window a refusal may still be
// logged for a request the window holds: the line is written when the
// answer arrives, which on two loaded cores can be well after the request.
const warmUpLogSlack = 2 * time.Second

// refusedLine returns the first line of a klog log that says a request was
// forbidden, or "", and how many such lines it left out. Lines stamped
// within a warm-up of a kube-apiserver that KillAPIServer restarted
// (testenv.Env.WarmUps), or warmUpLogSlack after it, are left out: until
// its RBAC caches sync such a server refuses what the shipped roles allow.
// The slack cannot hide a short role: the audit log's check
// (TestZZRBACCoversEveryCall) judges each refusal by when the server
// received the request, exactly.
func refusedLine(log string, warmUps []testenv.Window) (line string, warm int) {
	for l := range strings.Lines(log) {
		if !strings.Contains(l, "forbidden") {
			continue
		}
		at, ok := klogTime(l)
		if ok && slices.ContainsFunc(warmUps, func(w testenv.Window) bool {
			return testenv.Window{Start: w.Start, End: w.End.Add(warmUpLogSlack)}.Contains(at)
		}) {
			warm++
			continue
		}
		return l, warm
	}
	return "", warm
}

// klogTime reads the time of a klog header line ("E1205 12:27:09.806453 …",
// local time, no year: this year's is assumed).
func klogTime(line string) (time.Time, bool) {
	const layout = "0102 15:04:05.000000"
	if len(line) < 1+len(layout) || !strings.ContainsRune("IWEF", rune(line[0])) {
		return time.Time{}, false
	}
	t, err := time.ParseInLocation(layout, line[1:1+len(layout)], time.Local)
	if err != nil {
		return time.Time{}, false
	}
	return t.AddDate(time.Now().Year(), 0, 0), true
}

// deleteObjects removes every object of the test, finalizers first, so the
// next test starts from a clean cluster even when this one failed half-way.
func (r *rig) deleteObjects() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sel := metav1.ListOptions{LabelSelector: testLabel + "=" + r.id}
	noFinalizers := []byte(`{"metadata":{"finalizers":null}}`)
	report := func(what string, err error) {
		if err != nil && !apierrors.IsNotFound(err) {
			r.t.Errorf("cleanup: %s: %v", what, err)
		}
	}
	vas, err := r.client.StorageV1().VolumeAttachments().List(ctx, sel)
	report("list VolumeAttachments", err)
	if vas != nil {
		for _, va := range vas.Items {
			_, err := r.client.StorageV1().VolumeAttachments().Patch(ctx, va.Name, types.MergePatchType, noFinalizers, metav1.PatchOptions{})
			report("VolumeAttachment "+va.Name, err)
			report("VolumeAttachment "+va.Name, r.client.StorageV1().VolumeAttachments().Delete(ctx, va.Name, metav1.DeleteOptions{}))
		}
	}
	pvs, err := r.client.CoreV1().PersistentVolumes().List(ctx, sel)
	report("list PersistentVolumes", err)
	if pvs != nil {
		for _, pv := range pvs.Items {
			_, err := r.client.CoreV1().PersistentVolumes().Patch(ctx, pv.Name, types.MergePatchType, noFinalizers, metav1.PatchOptions{})
			report("PersistentVolume "+pv.Name, err)
			report("PersistentVolume "+pv.Name, r.client.CoreV1().PersistentVolumes().Delete(ctx, pv.Name, metav1.DeleteOptions{}))
		}
	}
	nodes, err := r.client.StorageV1().CSINodes().List(ctx, sel)
	report("list CSINodes", err)
	if nodes != nil {
		for _, n := range nodes.Items {
			report("CSINode "+n.Name, r.client.StorageV1().CSINodes().Delete(ctx, n.Name, metav1.DeleteOptions{}))
		}
	}
}

func shortID() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func (r *rig) labels() map[string]string { return map[string]string{testLabel: r.id} }

func (r *rig) listOptions() metav1.ListOptions {
	return metav1.ListOptions{LabelSelector: testLabel + "=" + r.id}
}

// nodeName is the Kubernetes node name of this test's node suffix.
func (r *rig) nodeName(suffix string) string { return "e2e-" + r.id + "-" + suffix }

// createCSINode creates the CSINode of node, naming nodeID for the driver,
// as kubelet does when the driver registers.
func (r *rig) createCSINode(node, nodeID string) {
	r.t.Helper()
	_, err := r.client.StorageV1().CSINodes().Create(r.ctx, &storagev1.CSINode{
		ObjectMeta: metav1.ObjectMeta{Name: node, Labels: r.labels()},
		Spec: storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{{
			Name:   driverName,
			NodeID: nodeID,
		}}},
	}, metav1.CreateOptions{})
	if err != nil {
		r.t.Fatalf("create CSINode %s: %v", node, err)
	}
}

// volume is a driver volume with its PersistentVolume.
type volume struct {
	handle string
	pv     string
}

// createVolumes makes n volumes on the driver (CreateVolume over its socket:
// ext4, single-node writer, 16 MiB) and a PersistentVolume for each, as the
// provisioner would. pvFinalizers are set at creation (for objects that
// look as if an attacher had handled them before).
func (r *rig) createVolumes(prefix string, n int, pvFinalizers ...string) []volume {
	r.t.Helper()
	return r.createVolumesOn(r.ctrl, prefix, n, pvFinalizers...)
}

// createVolumesOn is createVolumes on the driver behind ctrl.
func (r *rig) createVolumesOn(ctrl csi.ControllerClient, prefix string, n int, pvFinalizers ...string) []volume {
	r.t.Helper()
	vols := make([]volume, n)
	err := parallel(r.ctx, n, 8, func(ctx context.Context, i int) error {
		name := fmt.Sprintf("%s-%s-%03d", r.id, prefix, i)
		resp, err := ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{
			Name:               name,
			CapacityRange:      &csi.CapacityRange{RequiredBytes: volumeSize},
			VolumeCapabilities: []*csi.VolumeCapability{mountCapability()},
		})
		if err != nil {
			return fmt.Errorf("CreateVolume %s: %w", name, err)
		}
		v := volume{handle: resp.GetVolume().GetVolumeId(), pv: "e2e-" + name}
		_, err = r.client.CoreV1().PersistentVolumes().Create(ctx, &corev1.PersistentVolume{
			ObjectMeta: metav1.ObjectMeta{Name: v.pv, Labels: r.labels(), Finalizers: pvFinalizers},
			Spec: corev1.PersistentVolumeSpec{
				Capacity:                      corev1.ResourceList{corev1.ResourceStorage: *resource.NewQuantity(volumeSize, resource.BinarySI)},
				AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
				VolumeMode:                    ptr.To(corev1.PersistentVolumeFilesystem),
				PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
					Driver:       driverName,
					VolumeHandle: v.handle,
					FSType:       "ext4",
				}},
			},
		}, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("create PersistentVolume %s: %w", v.pv, err)
		}
		vols[i] = v
		return nil
	})
	if err != nil {
		r.t.Fatal(err)
	}
	return vols
}

// mountCapability is what the attacher sends for the tests' PVs.
func mountCapability() *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4"}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
}

// vaName is the name the attach/detach controller gives the
// VolumeAttachment of handle on node.
func vaName(handle, node string) string {
	return fmt.Sprintf("csi-%x", sha256.Sum256([]byte(handle+driverName+node)))
}

// newVA is the VolumeAttachment the attach/detach controller creates for v
// on node.
func (r *rig) newVA(v volume, node string) *storagev1.VolumeAttachment {
	return &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: vaName(v.handle, node), Labels: r.labels()},
		Spec: storagev1.VolumeAttachmentSpec{
			Attacher: driverName,
			NodeName: node,
			Source:   storagev1.VolumeAttachmentSource{PersistentVolumeName: ptr.To(v.pv)},
		},
	}
}

// createVAs creates the VolumeAttachments of vols on node, all at once, and
// returns their names.
func (r *rig) createVAs(vols []volume, node string) []string {
	r.t.Helper()
	names := make([]string, len(vols))
	err := parallel(r.ctx, len(vols), 32, func(ctx context.Context, i int) error {
		va, err := r.client.StorageV1().VolumeAttachments().Create(ctx, r.newVA(vols[i], node), metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("create VolumeAttachment of %s on %s: %w", vols[i].pv, node, err)
		}
		names[i] = va.Name
		return nil
	})
	if err != nil {
		r.t.Fatal(err)
	}
	return names
}

// deleteVAs deletes VolumeAttachments, as the attach/detach controller does
// when their pods are gone.
func (r *rig) deleteVAs(names []string) {
	r.t.Helper()
	err := parallel(r.ctx, len(names), 32, func(ctx context.Context, i int) error {
		err := r.client.StorageV1().VolumeAttachments().Delete(ctx, names[i], metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete VolumeAttachment %s: %w", names[i], err)
		}
		return nil
	})
	if err != nil {
		r.t.Fatal(err)
	}
}

// deletePVs deletes the PersistentVolumes of vols.
func (r *rig) deletePVs(vols []volume) {
	r.t.Helper()
	err := parallel(r.ctx, len(vols), 32, func(ctx context.Context, i int) error {
		err := r.client.CoreV1().PersistentVolumes().Delete(ctx, vols[i].pv, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete PersistentVolume %s: %w", vols[i].pv, err)
		}
		return nil
	})
	if err != nil {
		r.t.Fatal(err)
	}
}

// patchVAStatus writes a merge patch to a VolumeAttachment's status, as a
// person with kubectl --subresource=status would.
func (r *rig) patchVAStatus(name, patch string) {
	r.t.Helper()
	if _, err := r.client.StorageV1().VolumeAttachments().Patch(r.ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}, "status"); err != nil {
		r.t.Fatalf("patch the status of VolumeAttachment %s with %s: %v", name, patch, err)
	}
}

func (r *rig) getVA(name string) *storagev1.VolumeAttachment {
	r.t.Helper()
	va, err := r.client.StorageV1().VolumeAttachments().Get(r.ctx, name, metav1.GetOptions{})
	if err != nil {
		r.t.Fatalf("get VolumeAttachment %s: %v", name, err)
	}
	return va
}

func (r *rig) getPV(name string) *corev1.PersistentVolume {
	r.t.Helper()
	pv, err := r.client.CoreV1().PersistentVolumes().Get(r.ctx, name, metav1.GetOptions{})
	if err != nil {
		r.t.Fatalf("get PersistentVolume %s: %v", name, err)
	}
	return pv
}

// vaCheck judges one VolumeAttachment (nil: it does not exist) and returns
// "" when it is as wanted, else what is wrong with it.
type vaCheck func(va *storagev1.VolumeAttachment) string

// attachedTo wants a live VolumeAttachment marked attached without an
// error, with the finalizer and the node-ID annotation nodeID.
func attachedTo(nodeID string) vaCheck {
	return func(va *storagev1.VolumeAttachment) string {
		switch {
		case va == nil:
			return "does not exist"
		case !va.Status.Attached || va.Status.AttachError != nil:
			return "not attached"
		case !slices.Contains(va.Finalizers, finalizer):
			return "attached without the finalizer " + finalizer
		case va.Annotations[nodeIDAnnotation] != nodeID:
			return fmt.Sprintf("attached with annotation %s=%q, want %q", nodeIDAnnotation, va.Annotations[nodeIDAnnotation], nodeID)
		}
		return ""
	}
}

// gone wants the VolumeAttachment deleted (its finalizer removed).
func gone(va *storagev1.VolumeAttachment) string {
	if va == nil {
		return ""
	}
	return "still exists"
}

// attachFailedWith wants a live VolumeAttachment that is not attached and
// carries an attachError with a message, a time and errorCode code.
func attachFailedWith(code int32) vaCheck {
	return func(va *storagev1.VolumeAttachment) string {
		if va == nil {
			return "does not exist"
		}
		switch e := va.Status.AttachError; {
		case va.Status.Attached:
			return "attached"
		case e == nil:
			return "no attachError"
		case e.ErrorCode == nil || *e.ErrorCode != code:
			return fmt.Sprintf("attachError.errorCode %s, want %d", codeString(e.ErrorCode), code)
		case e.Message == "" || e.Time.IsZero():
			return "attachError without message or time"
		}
		return ""
	}
}

func codeString(c *int32) string {
	if c == nil {
		return "<nil>"
	}
	return fmt.Sprint(*c)
}

// describeVA is a VolumeAttachment's state for a failure message.
func describeVA(va *storagev1.VolumeAttachment) string {
	if va == nil {
		return "<none>"
	}
	s := fmt.Sprintf("{name: %s, node: %s, pv: %s, attached: %t, finalizers: %v, %s: %q",
		va.Name, va.Spec.NodeName, ptr.Deref(va.Spec.Source.PersistentVolumeName, ""), va.Status.Attached,
		va.Finalizers, nodeIDAnnotation, va.Annotations[nodeIDAnnotation])
	if va.DeletionTimestamp != nil {
		s += ", deleting since " + va.DeletionTimestamp.Format(time.RFC3339)
	}
	if e := va.Status.AttachError; e != nil {
		s += fmt.Sprintf(", attachError: {code: %s, message: %q}", codeString(e.ErrorCode), e.Message)
	}
	if e := va.Status.DetachError; e != nil {
		s += fmt.Sprintf(", detachError: {code: %s, message: %q}", codeString(e.ErrorCode), e.Message)
	}
	return s + "}"
}

// waitVAs waits until check passes for every named VolumeAttachment, and
// fails the test after timeout with how many did not and the state of a few
// of them. It returns how long it waited.
func (r *rig) waitVAs(what string, timeout time.Duration, names []string, check vaCheck) time.Duration {
	r.t.Helper()
	start := time.Now()
	var bad []string
	err := wait.PollUntilContextTimeout(r.ctx, 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		list, err := r.client.StorageV1().VolumeAttachments().List(ctx, r.listOptions())
		if err != nil {
			bad = []string{"listing failed: " + err.Error()}
			return false, nil // the API server may be busy; try again
		}
		byName := make(map[string]*storagev1.VolumeAttachment, len(list.Items))
		for i := range list.Items {
			byName[list.Items[i].Name] = &list.Items[i]
		}
		bad = bad[:0]
		for _, name := range names {
			va := byName[name]
			if problem := check(va); problem != "" {
				if va == nil {
					bad = append(bad, name+": "+problem)
				} else {
					bad = append(bad, problem+": "+describeVA(va))
				}
			}
		}
		return len(bad) == 0, nil
	})
	if err != nil {
		sort.Strings(bad)
		r.t.Fatalf("%s: after %s, %d of %d VolumeAttachments are not as wanted; the first of them:\n\t%s",
			what, timeout, len(bad), len(names), strings.Join(bad[:min(len(bad), 5)], "\n\t"))
	}
	return time.Since(start)
}

// waitPVsReleased waits until every PV of vols, deleted, has lost the
// attacher's finalizer, then removes kube-apiserver's pv-protection
// finalizer (the job of kube-controller-manager, which does not run here)
// and waits until they are gone.
func (r *rig) waitPVsReleased(what string, vols []volume) {
	r.t.Helper()
	var bad []string
	err := wait.PollUntilContextTimeout(r.ctx, 200*time.Millisecond, shortWait, true, func(ctx context.Context) (bool, error) {
		list, err := r.client.CoreV1().PersistentVolumes().List(ctx, r.listOptions())
		if err != nil {
			bad = []string{"listing failed: " + err.Error()}
			return false, nil
		}
		byName := make(map[string]*corev1.PersistentVolume, len(list.Items))
		for i := range list.Items {
			byName[list.Items[i].Name] = &list.Items[i]
		}
		bad = bad[:0]
		for _, v := range vols {
			pv := byName[v.pv]
			switch {
			case pv == nil:
			case pv.DeletionTimestamp == nil:
				bad = append(bad, fmt.Sprintf("%s: not being deleted (finalizers %v)", pv.Name, pv.Finalizers))
			case slices.Contains(pv.Finalizers, finalizer):
				bad = append(bad, fmt.Sprintf("%s: deleted but still has finalizers %v", pv.Name, pv.Finalizers))
			}
		}
		return len(bad) == 0, nil
	})
	if err != nil {
		r.t.Fatalf("%s: after %s, %d of %d PersistentVolumes keep the finalizer %s:\n\t%s",
			what, shortWait, len(bad), len(vols), finalizer, strings.Join(bad[:min(len(bad), 5)], "\n\t"))
	}
	// The pv-protection controller's part.
	err = parallel(r.ctx, len(vols), 32, func(ctx context.Context, i int) error {
		pv, err := r.client.CoreV1().PersistentVolumes().Get(ctx, vols[i].pv, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		if i := slices.Index(pv.Finalizers, pvProtection); i >= 0 {
			patch := fmt.Sprintf(`[{"op":"test","path":"/metadata/finalizers/%d","value":%q},{"op":"remove","path":"/metadata/finalizers/%d"}]`, i, pvProtection, i)
			_, err = r.client.CoreV1().PersistentVolumes().Patch(ctx, pv.Name, types.JSONPatchType, []byte(patch), metav1.PatchOptions{})
			if err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("remove %s from PersistentVolume %s: %w", pvProtection, pv.Name, err)
			}
		}
		return nil
	})
	if err != nil {
		r.t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(r.ctx, 200*time.Millisecond, shortWait, true, func(ctx context.Context) (bool, error) {
		list, err := r.client.CoreV1().PersistentVolumes().List(ctx, r.listOptions())
		if err != nil {
			return false, nil
		}
		bad = bad[:0]
		for _, pv := range list.Items {
			if slices.ContainsFunc(vols, func(v volume) bool { return v.pv == pv.Name }) {
				bad = append(bad, fmt.Sprintf("%s (finalizers %v)", pv.Name, pv.Finalizers))
			}
		}
		return len(bad) == 0, nil
	})
	if err != nil {
		r.t.Fatalf("%s: PersistentVolumes still exist after their finalizers went: %v", what, bad[:min(len(bad), 5)])
	}
}

// published returns the driver's attachment records: for each volume, the
// node IDs ListVolumes says it is published on (all pages).
func (r *rig) published() map[string][]string {
	r.t.Helper()
	out := map[string][]string{}
	token := ""
	for {
		ctx, cancel := context.WithTimeout(r.ctx, 30*time.Second)
		resp, err := r.ctrl.ListVolumes(ctx, &csi.ListVolumesRequest{StartingToken: token})
		cancel()
		if err != nil {
			r.t.Fatalf("ListVolumes on the driver: %v", err)
		}
		for _, e := range resp.GetEntries() {
			nodes := slices.Clone(e.GetStatus().GetPublishedNodeIds())
			sort.Strings(nodes)
			out[e.GetVolume().GetVolumeId()] = nodes
		}
		if token = resp.GetNextToken(); token == "" {
			return out
		}
	}
}

// checkPublished compares the driver's records of vols with want (volume
// handle → node IDs; absent means published nowhere).
func (r *rig) checkPublished(what string, vols []volume, want map[string][]string) {
	r.t.Helper()
	got := r.published()
	var diffs []string
	for _, v := range vols {
		w := slices.Clone(want[v.handle])
		sort.Strings(w)
		if g := got[v.handle]; !slices.Equal(g, w) {
			diffs = append(diffs, fmt.Sprintf("%s (PV %s): driver has it published on %v, want %v", v.handle, v.pv, g, w))
		}
	}
	if len(diffs) > 0 {
		r.t.Fatalf("%s: the driver's attachment records of %d of %d volumes disagree:\n\t%s",
			what, len(diffs), len(vols), strings.Join(diffs[:min(len(diffs), 5)], "\n\t"))
	}
}

// allOn maps every volume of vols to the one node nodeID.
func allOn(vols []volume, nodeID string) map[string][]string {
	m := make(map[string][]string, len(vols))
	for _, v := range vols {
		m[v.handle] = []string{nodeID}
	}
	return m
}

// parallel runs f(0..n-1) with at most limit at once and returns the first
// error.
func parallel(ctx context.Context, n, limit int, f func(ctx context.Context, i int) error) error {
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(limit)
	for i := range n {
		g.Go(func() error { return f(ctx, i) })
	}
	return g.Wait()
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
