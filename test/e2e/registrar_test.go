package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"k8s.io/utils/ptr"
)

// The registrar's contract, spelled out as kubelet and node-driver-registrar
// spell it.
const (
	// regSocketName is where kubelet's plugin watcher finds the driver.
	regSocketName = driverName + "-reg.sock"
	// kubeletRegistrationPath is the driver socket as kubelet would see it;
	// the registrar only hands it on.
	kubeletRegistrationPath = "/var/lib/kubelet/plugins/loopvol.csi.io/csi.sock"
	registrarTopologyKey    = "topology.loopvol.csi.io/zone"
)

// registrarRig is a rig with a plugin registration directory.
type registrarRig struct {
	*rig
	regDir string
	socket string
}

func newRegistrarRig(t *testing.T, driverArgs ...string) *registrarRig {
	r := newRig(t, driverArgs...)
	rr := &registrarRig{rig: r, regDir: filepath.Join(r.dir, "plugins_registry")}
	rr.socket = filepath.Join(rr.regDir, regSocketName)
	if err := os.MkdirAll(rr.regDir, 0o750); err != nil {
		t.Fatal(err)
	}
	return rr
}

// startRegistrar starts the sidecar with --controllers=registrar and the
// registration flags; args add to them.
func (r *registrarRig) startRegistrar(kubeconfig string, args ...string) *attacher {
	r.t.Helper()
	return r.startSidecar("registrar", kubeconfig, append([]string{
		"--controllers=registrar",
		"--kubelet-registration-path=" + kubeletRegistrationPath,
		"--plugin-registration-path=" + r.regDir,
	}, args...)...)
}

// kubeletCall runs f with a registration client on a fresh connection, as
// kubelet's plugin watcher dials the socket for each registration.
func (r *registrarRig) kubeletCall(f func(ctx context.Context, c registerapi.RegistrationClient) error) error {
	conn, err := grpc.NewClient("unix://"+r.socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(r.ctx, 10*time.Second)
	defer cancel()
	return f(ctx, registerapi.NewRegistrationClient(conn))
}

func (r *registrarRig) getInfo() (*registerapi.PluginInfo, error) {
	var info *registerapi.PluginInfo
	err := r.kubeletCall(func(ctx context.Context, c registerapi.RegistrationClient) (err error) {
		info, err = c.GetInfo(ctx, &registerapi.InfoRequest{})
		return err
	})
	return info, err
}

// notify sends kubelet's verdict.
func (r *registrarRig) notify(registered bool, msg string) {
	r.t.Helper()
	err := r.kubeletCall(func(ctx context.Context, c registerapi.RegistrationClient) error {
		_, err := c.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: registered, Error: msg})
		return err
	})
	if err != nil {
		r.t.Fatalf("NotifyRegistrationStatus(%t): %v", registered, err)
	}
}

// waitServed waits until GetInfo over the socket answers, and returns how
// long that took.
func (r *registrarRig) waitServed(what string) time.Duration {
	r.t.Helper()
	start := time.Now()
	var last error
	err := wait.PollUntilContextTimeout(r.ctx, 10*time.Millisecond, shortWait, true, func(context.Context) (bool, error) {
		_, last = r.getInfo()
		return last == nil, nil
	})
	if err != nil {
		r.t.Fatalf("%s: GetInfo over %s still fails after %s: %v", what, r.socket, shortWait, last)
	}
	return time.Since(start)
}

// pinned gives the socket a second name, so its inode number cannot be
// handed to the next socket, and returns it: a new inode at the path then
// means a new socket.
func (r *registrarRig) pinned() uint64 {
	r.t.Helper()
	pin := filepath.Join(r.dir, fmt.Sprintf("pin-%d", time.Now().UnixNano()))
	if err := os.Link(r.socket, pin); err != nil {
		r.t.Fatalf("pin the registration socket: %v", err)
	}
	return inodeOf(pin)
}

func inodeOf(path string) uint64 {
	st, err := os.Lstat(path)
	if err != nil {
		return 0
	}
	return st.Sys().(*syscall.Stat_t).Ino
}

// waitNewSocket waits until the path holds a socket other than old.
func (r *registrarRig) waitNewSocket(what string, old uint64) time.Duration {
	r.t.Helper()
	start := time.Now()
	err := wait.PollUntilContextTimeout(r.ctx, 5*time.Millisecond, shortWait, true, func(context.Context) (bool, error) {
		ino := inodeOf(r.socket)
		return ino != 0 && ino != old, nil
	})
	if err != nil {
		r.t.Fatalf("%s: no new socket at %s after %s", what, r.socket, shortWait)
	}
	return time.Since(start)
}

// healthz returns the code and body of the sidecar's /healthz.
func healthz(ctx context.Context, a *attacher) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.healthz, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// waitHealthzSays waits until /healthz answers code with a body containing
// text.
func (r *registrarRig) waitHealthzSays(a *attacher, code int, text, what string) {
	r.t.Helper()
	var lastCode int
	var lastBody string
	err := wait.PollUntilContextTimeout(r.ctx, 50*time.Millisecond, shortWait, true, func(ctx context.Context) (bool, error) {
		c, b, err := healthz(ctx, a)
		if err != nil {
			return false, nil
		}
		lastCode, lastBody = c, b
		return c == code && strings.Contains(b, text), nil
	})
	if err != nil {
		r.t.Fatalf("%s: /healthz answered %d %q, want %d with %q", what, lastCode, lastBody, code, text)
	}
}

// TestRegistrarKubeletRegistration plays kubelet's plugin watcher against
// the sidecar in kubelet mode: a stale socket is replaced, GetInfo names
// the driver and its socket, a refused registration is retried by a new
// socket (the process stays up), a deleted socket comes back, /healthz
// follows kubelet's verdicts, and the socket goes with the process. The
// sidecar runs as a user without any permission: in kubelet mode it must
// not send a single request to the API server (one would be refused, and
// startSidecar fails the test on a "forbidden" log line).
func TestRegistrarKubeletRegistration(t *testing.T) {
	r := newRegistrarRig(t)
	stale, err := net.ListenUnix("unix", &net.UnixAddr{Name: r.socket, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	stale.SetUnlinkOnClose(false)
	stale.Close()

	noRBAC := r.restrictedKubeconfig("loopvol-registrar-"+r.id, metav1.NamespaceDefault)
	a := r.startRegistrar(noRBAC)
	start := time.Now() // after the build and the start of the process
	r.waitServed("the stale socket replaced")
	t.Logf("Registration socket served %s after the sidecar process started (its connection to the driver included)", time.Since(start).Round(time.Millisecond))
	if st, err := os.Lstat(r.socket); err != nil || st.Mode().Type() != fs.ModeSocket || st.Mode().Perm() != 0o600 {
		t.Fatalf("registration socket %v, %v; want an owner-only socket", st, err)
	}

	info, err := r.getInfo()
	if err != nil {
		t.Fatal(err)
	}
	if info.GetType() != "CSIPlugin" || info.GetName() != driverName || info.GetEndpoint() != kubeletRegistrationPath ||
		!slices.Equal(info.GetSupportedVersions(), []string{"1.0.0"}) {
		t.Fatalf("GetInfo = %v; want CSIPlugin %s at %s, versions [1.0.0]", info, driverName, kubeletRegistrationPath)
	}
	r.waitHealthzSays(a, http.StatusServiceUnavailable, "kubelet has not confirmed the registration", "before kubelet's verdict")

	// Refused: reported, retried with a new socket, no exit.
	first := r.pinned()
	r.notify(false, "e2e: kubelet refused the plugin")
	r.waitHealthzSays(a, http.StatusServiceUnavailable, "e2e: kubelet refused the plugin", "after a refused registration")
	took := r.waitNewSocket("the socket made again to retry", first)
	t.Logf("Socket made again %s after the refused registration (the first retry waits --retry-interval-start)", took.Round(time.Millisecond))
	r.waitServed("the retry's socket")
	if !a.Running() {
		t.Fatalf("the sidecar exited after a refused registration: %v", a.Err())
	}

	start = time.Now()
	r.notify(true, "")
	r.waitHealthzSays(a, http.StatusOK, "ok", "after kubelet registered the driver")
	t.Logf("/healthz ok %s after kubelet's confirmation", time.Since(start).Round(time.Millisecond))

	// Deleted: made again at once; kubelet must register it again.
	second := r.pinned()
	if err := os.Remove(r.socket); err != nil {
		t.Fatal(err)
	}
	took = r.waitNewSocket("the deleted socket made again", second)
	t.Logf("Deleted socket made again after %s", took.Round(time.Millisecond))
	r.waitServed("the socket made again after its deletion")
	r.waitHealthzSays(a, http.StatusServiceUnavailable, "kubelet has not confirmed the registration", "on the new socket")
	r.notify(true, "")
	r.waitHealthzSays(a, http.StatusOK, "ok", "after the new registration")

	if err := a.Stop(); err != nil {
		t.Fatalf("the sidecar did not stop cleanly: %v", err)
	}
	if _, err := os.Lstat(r.socket); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the registration socket is left after the sidecar stopped: %v", err)
	}
}

// TestRegistrarDirectMode runs the sidecar in direct mode (no kubelet) with
// only the shipped rbac-registrar.yaml: it creates the node's CSINode owned
// by the Node with the driver's node ID, topology key and volume limit,
// repairs hand edits, follows a new limit and a new node ID of the
// restarted driver on the CSIDriver's nodeAllocatableUpdatePeriodSeconds,
// re-reads NodeGetInfo at once when an attach to the node fails with
// RESOURCE_EXHAUSTED, and never changes another driver's entry.
func TestRegistrarDirectMode(t *testing.T) {
	r := newRegistrarRig(t, "--max-volumes-per-node=3")
	node := r.nodeName("a")
	nodeObj := r.createNode(node)
	r.createCSIDriver(10)
	kubeconfig := r.restrictedKubeconfig("loopvol-registrar-"+r.id, metav1.NamespaceDefault, "rbac-registrar.yaml")
	a := r.startRegistrar(kubeconfig, "--csinode-mode=direct", "--node-name="+node)
	start := time.Now()
	r.waitEntry(node, "the entry created", nodeA, 3)
	t.Logf("CSINode entry written %s after the sidecar started", time.Since(start).Round(time.Millisecond))
	csiNode := r.getCSINode(node)
	wantOwner := []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node, UID: nodeObj.UID}}
	if diff := cmp.Diff(wantOwner, csiNode.OwnerReferences); diff != "" {
		t.Errorf("CSINode owner references (-want +got):\n%s", diff)
	}
	r.waitHealthzSays(a, http.StatusOK, "ok", "once the entry is in place (no kubelet to confirm in direct mode)")

	// Another driver registers on the node (kubelet would write its entry).
	other := storagev1.CSINodeDriver{Name: "other.csi.io", NodeID: "other-node-7", TopologyKeys: []string{"other.io/rack"},
		Allocatable: &storagev1.VolumeNodeResources{Count: ptr.To[int32](42)}}
	r.patchCSINode(node, fmt.Sprintf(`[{"op":"add","path":"/spec/drivers/-","value":%s}]`, mustJSON(t, other)))
	checkOther := func(when string) {
		t.Helper()
		n := r.getCSINode(node)
		i := slices.IndexFunc(n.Spec.Drivers, func(d storagev1.CSINodeDriver) bool { return d.Name == other.Name })
		if i < 0 {
			t.Fatalf("%s: the other driver's entry is gone: %+v", when, n.Spec.Drivers)
		}
		if diff := cmp.Diff(other, n.Spec.Drivers[i]); diff != "" {
			t.Fatalf("%s: the other driver's entry changed (-was +is):\n%s", when, diff)
		}
	}

	// Hand edits of the driver's entry are repaired: a count (the only
	// field of an entry the API lets change), then the whole entry.
	idx := slices.IndexFunc(r.getCSINode(node).Spec.Drivers, func(d storagev1.CSINodeDriver) bool { return d.Name == driverName })
	r.patchCSINode(node, fmt.Sprintf(`[{"op":"replace","path":"/spec/drivers/%d/allocatable/count","value":1}]`, idx))
	r.waitEntry(node, "the edited count repaired", nodeA, 3)
	idx = slices.IndexFunc(r.getCSINode(node).Spec.Drivers, func(d storagev1.CSINodeDriver) bool { return d.Name == driverName })
	r.patchCSINode(node, fmt.Sprintf(`[{"op":"remove","path":"/spec/drivers/%d"}]`, idx))
	r.waitEntry(node, "the removed entry added again", nodeA, 3)
	checkOther("after the repairs")

	// The driver comes back with another limit: picked up on the 10 s period.
	r.restartDriver("--max-volumes-per-node=5")
	start = time.Now()
	r.waitEntry(node, "count 5 on the 10 s period", nodeA, 5)
	t.Logf("New limit in the CSINode %s after the restarted driver answered", time.Since(start).Round(time.Millisecond))
	checkOther("after the periodic update")

	// And with another node ID, which the API server lets no update
	// change: the entry is removed and added anew.
	r.restartDriver("--node-id=node-b")
	r.waitEntry(node, "the new node ID on the period", "node-b", 5)
	checkOther("after the new node ID")

	// An hour's period, and the driver's limit changes again: only the
	// RESOURCE_EXHAUSTED attach can make the registrar read it before the
	// hour is up.
	if _, err := r.client.StorageV1().CSIDrivers().Patch(r.ctx, driverName, types.MergePatchType,
		[]byte(`{"spec":{"nodeAllocatableUpdatePeriodSeconds":3600}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	r.waitLog(a, `to="1h0m0s"`, "the sidecar saw the hour's period")
	r.restartDriver("--max-volumes-per-node=7")
	r.waitHealthzSays(a, http.StatusOK, "ok", "the sidecar reconnected to the restarted driver")
	if e := r.entry(node); e == nil || e.Allocatable == nil || ptr.Deref(e.Allocatable.Count, 0) != 5 {
		t.Fatalf("the entry changed with nothing to make it: %+v", e)
	}
	va := r.newVA(volume{handle: "e2e-" + r.id + "-exhausted", pv: "e2e-" + r.id + "-exhausted"}, node)
	if _, err := r.client.StorageV1().VolumeAttachments().Create(r.ctx, va, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	r.patchVAStatus(va.Name, fmt.Sprintf(`{"status":{"attached":false,"attachError":{"message":"e2e: node has no free slot","time":%q,"errorCode":8}}}`,
		time.Now().UTC().Format(time.RFC3339)))
	r.waitEntry(node, "count 7 right after the RESOURCE_EXHAUSTED attach", "node-b", 7)
	t.Logf("New limit in the CSINode %s after the attach failed with RESOURCE_EXHAUSTED (the period is 1h)", time.Since(start).Round(time.Millisecond))
	checkOther("at the end")
	if !a.Running() {
		t.Fatalf("the sidecar exited: %v", a.Err())
	}
}

// createNode creates a Node (kubelet's job), deleted when the test ends.
func (r *registrarRig) createNode(name string) *corev1.Node {
	r.t.Helper()
	n, err := r.client.CoreV1().Nodes().Create(r.ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: r.labels()}}, metav1.CreateOptions{})
	if err != nil {
		r.t.Fatalf("create Node %s: %v", name, err)
	}
	r.t.Cleanup(func() {
		ctx := context.WithoutCancel(r.ctx)
		ignoreNotFound(r.t, r.client.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{}))
		// The registrar made the CSINode, without the test's label.
		ignoreNotFound(r.t, r.client.StorageV1().CSINodes().Delete(ctx, name, metav1.DeleteOptions{}))
	})
	return n
}

// createCSIDriver creates the driver's CSIDriver with the period, deleted
// when the test ends.
func (r *registrarRig) createCSIDriver(periodSeconds int64) {
	r.t.Helper()
	d := &storagev1.CSIDriver{
		ObjectMeta: metav1.ObjectMeta{Name: driverName, Labels: r.labels()},
		Spec:       storagev1.CSIDriverSpec{NodeAllocatableUpdatePeriodSeconds: ptr.To(periodSeconds)},
	}
	if _, err := r.client.StorageV1().CSIDrivers().Create(r.ctx, d, metav1.CreateOptions{}); err != nil {
		if apierrors.IsAlreadyExists(err) {
			r.t.Fatalf("CSIDriver %s exists already, left by an earlier test or another deployment", driverName)
		}
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() {
		ignoreNotFound(r.t, r.client.StorageV1().CSIDrivers().Delete(context.WithoutCancel(r.ctx), driverName, metav1.DeleteOptions{}))
	})
}

func (r *registrarRig) getCSINode(name string) *storagev1.CSINode {
	r.t.Helper()
	n, err := r.client.StorageV1().CSINodes().Get(r.ctx, name, metav1.GetOptions{})
	if err != nil {
		r.t.Fatalf("get CSINode %s: %v", name, err)
	}
	return n
}

func (r *registrarRig) patchCSINode(name, patch string) {
	r.t.Helper()
	if _, err := r.client.StorageV1().CSINodes().Patch(r.ctx, name, types.JSONPatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		r.t.Fatalf("patch CSINode %s with %s: %v", name, patch, err)
	}
}

// entry is the driver's entry in the node's CSINode, nil when there is none.
func (r *registrarRig) entry(node string) *storagev1.CSINodeDriver {
	n, err := r.client.StorageV1().CSINodes().Get(r.ctx, node, metav1.GetOptions{})
	if err != nil {
		return nil
	}
	for i := range n.Spec.Drivers {
		if n.Spec.Drivers[i].Name == driverName {
			return &n.Spec.Drivers[i]
		}
	}
	return nil
}

// waitEntry waits until the driver's entry is what kubelet would write for
// the rig's driver with node ID nodeID and limit count (and its zone key).
func (r *registrarRig) waitEntry(node, what, nodeID string, count int32) {
	r.t.Helper()
	want := storagev1.CSINodeDriver{Name: driverName, NodeID: nodeID, TopologyKeys: []string{registrarTopologyKey},
		Allocatable: &storagev1.VolumeNodeResources{Count: ptr.To(count)}}
	var last *storagev1.CSINodeDriver
	err := wait.PollUntilContextTimeout(r.ctx, 50*time.Millisecond, shortWait, true, func(context.Context) (bool, error) {
		last = r.entry(node)
		return last != nil && cmp.Equal(want, *last), nil
	})
	if err != nil {
		r.t.Fatalf("%s: after %s the CSINode entry is %+v, want %+v", what, shortWait, last, want)
	}
}

// restartDriver stops the rig's driver and starts it again on the same
// socket with more flags (later flags win).
func (r *registrarRig) restartDriver(args ...string) {
	r.t.Helper()
	r.driver.Stop()
	r.driverArgs = append(r.driverArgs, args...)
	r.startDriver()
}

// waitLog waits until the sidecar's log contains text.
func (r *registrarRig) waitLog(a *attacher, text, what string) {
	r.t.Helper()
	err := wait.PollUntilContextTimeout(r.ctx, 50*time.Millisecond, shortWait, true, func(context.Context) (bool, error) {
		return strings.Contains(a.Log(), text), nil
	})
	if err != nil {
		r.t.Fatalf("%s: the log of %s has no %q after %s", what, a.Name, text, shortWait)
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
