package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	"github.com/loopvol/loopvol/pkg/attach"
	"github.com/loopvol/loopvol/pkg/capacity"
	"github.com/loopvol/loopvol/pkg/resize"
	"github.com/loopvol/loopvol/pkg/statusapi"
	"github.com/loopvol/loopvol/pkg/volspec"
)

const (
	testDriver = "loopvol.csi.io"
	testNS     = "loopvol"
	gib        = int64(1) << 30
)

// testNow is the clock of every test: ages in the golden files stay put.
var testNow = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

// fakeNodes is a NodeStatusSource of canned answers by node name.
type fakeNodes struct {
	status map[string]*statusapi.NodeStatus
	err    map[string]error
}

func (f *fakeNodes) NodeStatus(_ context.Context, pod *corev1.Pod) (*statusapi.NodeStatus, error) {
	if err := f.err[pod.Spec.NodeName]; err != nil {
		return nil, err
	}
	if st, ok := f.status[pod.Spec.NodeName]; ok {
		return st, nil
	}
	return nil, fmt.Errorf("%s in %s/%s: no answer", statusCommand, pod.Namespace, pod.Name)
}

// fixture is a cluster with loopvol installed: three nodes in two zones,
// claims bound, pending and waiting for space, their Pods, attachments,
// Events and snapshots, and what each node plugin says.
type fixture struct {
	objects []runtime.Object
	// snapshots are VolumeSnapshotContents; noSnapshotCRD makes their
	// list fail as on a cluster without the CRDs.
	snapshots     []*unstructured.Unstructured
	noSnapshotCRD bool
	nodes         *fakeNodes
	// denied are "serviceaccount verb resource" that SubjectAccessReviews deny.
	denied map[string]bool
	// forbidSecrets refuses every read of a Secret, as RBAC does to a
	// user who may not read them.
	forbidSecrets bool
}

// Volume handles and PV names of the fixture's claims.
const (
	webHandle  = "default.3f9a1c2e8b7d4f60a1b2c3d4e5f60718"
	logsHandle = "default.9c0d1e2f3a4b5c6d7e8f901a2b3c4d5e"
	dbHandle   = "shared.0a1b2c3d4e5f60718293a4b5c6d7e8f9"
	webPV      = "pvc-6b1e2f3a-4c5d-4e6f-8a9b-0c1d2e3f4a5b"
	logsPV     = "pvc-7c2f3a4b-5d6e-4f70-9b0c-1d2e3f4a5b6c"
	dbPV       = "pvc-8d3a4b5c-6e7f-4081-ac1d-2e3f4a5b6c7d"
	stagingWeb = "/var/lib/kubelet/plugins/kubernetes.io/csi/loopvol.csi.io/5e4d/globalmount"
	targetWeb  = "/var/lib/kubelet/pods/1a2b3c4d-0000-4000-8000-000000000001/volumes/kubernetes.io~csi/" + webPV + "/mount"
)

func newFixture(t *testing.T) *fixture {
	t.Helper()
	f := &fixture{nodes: &fakeNodes{status: map[string]*statusapi.NodeStatus{}, err: map[string]error{}}, denied: map[string]bool{}}
	f.add(csiDriver())
	for _, n := range []struct{ name, zone, pod string }{
		{"worker-1", "zone-a", "loopvol-node-4xk2p"},
		{"worker-2", "zone-a", "loopvol-node-9fj3d"},
		{"worker-3", "zone-b", "loopvol-node-q7m8c"},
	} {
		f.add(node(n.name, n.zone), csiNode(n.name, 64), pluginPod(n.pod, n.name))
	}
	f.nodes.status["worker-1"] = &statusapi.NodeStatus{
		NodeID: "worker-1", Zone: "zone-a", Version: "v0.1.0", Started: testNow.Add(-3 * time.Hour),
		KubeletDir: "/var/lib/kubelet", MaxVolumes: 64,
		Pools: []statusapi.PoolStatus{
			{Name: "default", Path: "/var/lib/loopvol/pools/default", TotalBytes: 200 * gib, FreeBytes: 170 * gib,
				PromisedBytes: 60 * gib, AvailableBytes: 140 * gib, Volumes: 2, Health: statusapi.HealthOK},
			{Name: "shared", Path: "/var/lib/loopvol/pools/shared", Shared: true, TotalBytes: 1024 * gib, FreeBytes: 900 * gib,
				PromisedBytes: 100 * gib, AvailableBytes: 924 * gib, Volumes: 1, Health: statusapi.HealthOK},
		},
		Volumes: []statusapi.VolumeStatus{{
			VolumeID: webHandle, Pool: "default", Image: "/var/lib/loopvol/pools/default/volumes/3f9a1c2e8b7d4f60a1b2c3d4e5f60718.img",
			SizeBytes: 10 * gib, AllocatedBytes: 10 * gib,
			Staged: testNow.Add(-2 * time.Hour), FsType: "ext4", Attached: true, Device: "/dev/loop3",
			StagingPath: stagingWeb, TargetPaths: []string{targetWeb}, MountOptions: []string{"noatime"}, Health: statusapi.HealthOK,
		}},
	}
	f.nodes.status["worker-2"] = &statusapi.NodeStatus{
		NodeID: "worker-2", Zone: "zone-a", Version: "v0.1.0", Started: testNow.Add(-3 * time.Hour),
		KubeletDir: "/var/lib/kubelet", MaxVolumes: 64,
		Pools: []statusapi.PoolStatus{
			{Name: "default", Path: "/var/lib/loopvol/pools/default", TotalBytes: 200 * gib, FreeBytes: 20 * gib,
				PromisedBytes: 190 * gib, AvailableBytes: 10 * gib, Volumes: 9, OrphanImages: 1, OrphanBytes: 2 * gib,
				Health: "PoolNearlyFull", Message: "pool default has 10% of its filesystem free"},
			{Name: "shared", Path: "/var/lib/loopvol/pools/shared", Shared: true, TotalBytes: 1024 * gib, FreeBytes: 900 * gib,
				PromisedBytes: 100 * gib, AvailableBytes: 924 * gib, Volumes: 1, Health: statusapi.HealthOK},
		},
		Volumes: []statusapi.VolumeStatus{},
	}
	f.nodes.status["worker-3"] = &statusapi.NodeStatus{
		NodeID: "worker-3", Zone: "zone-b", Version: "v0.1.0", Started: testNow.Add(-26 * time.Hour),
		KubeletDir: "/var/lib/kubelet", MaxVolumes: 64,
		Pools: []statusapi.PoolStatus{
			{Name: "default", Path: "/var/lib/loopvol/pools/default", TotalBytes: 500 * gib, FreeBytes: 480 * gib,
				PromisedBytes: 20 * gib, AvailableBytes: 480 * gib, Volumes: 1, Health: statusapi.HealthOK},
		},
		Volumes: []statusapi.VolumeStatus{{
			VolumeID: dbHandle, Pool: "shared", Image: "/var/lib/loopvol/pools/shared/volumes/0a1b2c3d4e5f60718293a4b5c6d7e8f9.img",
			SizeBytes: 20 * gib, AllocatedBytes: 3 * gib,
			Staged: testNow.Add(-20 * time.Hour), FsType: "xfs", Attached: true, Device: "/dev/loop0",
			StagingPath: "/var/lib/kubelet/plugins/kubernetes.io/csi/loopvol.csi.io/77ab/globalmount",
			Health:      "VolumeFilesystemErrors", Conditions: []statusapi.Condition{{Reason: "VolumeFilesystemErrors", Message: "xfs reported 2 errors"}},
		}},
	}

	f.add(storageClass("loopvol", storagev1.VolumeBindingWaitForFirstConsumer))
	for _, zone := range []string{"zone-a", "zone-b"} {
		f.add(storageCapacity("csisc-"+zone, "loopvol", zone))
	}
	holder := "loopvol-controller-0"
	f.add(lease(attach.LeaseName(testDriver), holder, testNow.Add(-4*time.Second)),
		lease(capacity.LeaseName(testDriver), holder, testNow.Add(-2*time.Second)),
		lease(resize.LeaseName(testDriver), "loopvol-controller-1", testNow.Add(-7*time.Second)))
	f.add(webhookConfig(t, true), webhookEndpoints(1))
	for _, p := range []string{"loopvol-pvc-access-modes", "loopvol-storageclass-listed", "loopvol-volumeattachment-status"} {
		f.add(policy(p), policyBinding(p))
	}
	for _, sa := range []string{"loopvol-controller", "loopvol-node"} {
		f.add(&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa, Namespace: testNS}})
	}
	f.add(controllerPod(), webhookService(), webhookSecret(servingCert(t, webhookHost, testNow.Add(90*24*time.Hour), true)))

	// default/data-web-0: bound, attached to worker-1, staged and published there.
	f.add(claim("default", "data-web-0", "loopvol", "10Gi", webPV), pv(webPV, "default", "data-web-0", webHandle, "10Gi"),
		va("csi-5e4d3c2b1a", webPV, "worker-1", true, ""),
		pod("default", "web-0", "worker-1", corev1.PodRunning, "data-web-0"))
	// default/logs-web-0: bound, its attachment failing.
	f.add(claim("default", "logs-web-0", "loopvol", "5Gi", logsPV), pv(logsPV, "default", "logs-web-0", logsHandle, "5Gi"),
		va("csi-9a8b7c6d5e", logsPV, "worker-2", false, "rpc error: code = ResourceExhausted desc = node worker-2 has 64 volumes attached, its limit"),
		pod("default", "logs-0", "worker-2", corev1.PodPending, "logs-web-0"),
		event("default", "logs-0", "Pod", "Warning", "FailedAttachVolume", "AttachVolume.Attach failed for volume \""+logsPV+"\" : rpc error: code = ResourceExhausted desc = node worker-2 has 64 volumes attached, its limit", 3))
	// shop/db-0: bound on the shared pool, attached to worker-3.
	f.add(claim("shop", "db-0", "loopvol", "20Gi", dbPV), pv(dbPV, "shop", "db-0", dbHandle, "20Gi"),
		va("csi-1f2e3d4c5b", dbPV, "worker-3", true, ""),
		pod("shop", "db-0", "worker-3", corev1.PodRunning, "db-0"))
	// default/scratch: Pending, WaitForFirstConsumer and no Pod uses it.
	f.add(claim("default", "scratch", "loopvol", "1Gi", ""),
		event("default", "scratch", "PersistentVolumeClaim", "Normal", "WaitForFirstConsumer", "waiting for first consumer to be created before binding", 1))
	// default/big: Pending, its Pod scheduled, and no pool has the space.
	big := claim("default", "big", "loopvol", "2Ti", "")
	big.Annotations = map[string]string{"volume.kubernetes.io/selected-node": "worker-2"}
	f.add(big, pod("default", "importer", "", corev1.PodPending, "big"),
		event("default", "big", "PersistentVolumeClaim", "Normal", "Provisioning", "External provisioner is provisioning volume for claim \"default/big\"", 4),
		event("default", "big", "PersistentVolumeClaim", "Warning", "ProvisioningFailed",
			"failed to provision volume with StorageClass \"loopvol\": rpc error: code = ResourceExhausted desc = no pool has 2199023255552 bytes available", 4))
	f.snapshots = append(f.snapshots, snapshotContent("snapcontent-0c9d8e7f", webHandle))
	return f
}

func (f *fixture) add(objs ...runtime.Object) { f.objects = append(f.objects, objs...) }

// remove drops the objects of a kind and name.
func (f *fixture) remove(kind, name string) {
	out := f.objects[:0]
	for _, o := range f.objects {
		m, _ := o.(metav1.Object)
		if m != nil && m.GetName() == name && strings.HasSuffix(fmt.Sprintf("%T", o), "."+kind) {
			continue
		}
		out = append(out, o)
	}
	f.objects = out
}

// run runs the plugin with args against the fixture and returns stdout,
// stderr and the exit code.
func (f *fixture) run(t *testing.T, namespace string, color bool, args ...string) (string, string, int) {
	t.Helper()
	kube := fake.NewClientset(f.objects...)
	kube.PrependReactor("create", "subjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		sar := a.(k8stesting.CreateAction).GetObject().(*authorizationv1.SubjectAccessReview).DeepCopy()
		ra := sar.Spec.ResourceAttributes
		res := ra.Resource
		if ra.Subresource != "" {
			res += "/" + ra.Subresource
		}
		sa := strings.TrimPrefix(sar.Spec.User, "system:serviceaccount:"+testNS+":")
		sar.Status.Allowed = !f.denied[sa+" "+ra.Verb+" "+res]
		return true, sar, nil
	})
	if f.forbidSecrets {
		kube.PrependReactor("get", "secrets", func(a k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, apierrors.NewForbidden(corev1.Resource("secrets"), a.(k8stesting.GetAction).GetName(), errors.New("RBAC: access denied"))
		})
	}
	scheme := runtime.NewScheme()
	var snaps []runtime.Object
	for _, s := range f.snapshots {
		snaps = append(snaps, s)
	}
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(scheme,
		map[schema.GroupVersionResource]string{snapshotContents: "VolumeSnapshotContentList"}, snaps...)
	if f.noSnapshotCRD {
		dyn.PrependReactor("list", "volumesnapshotcontents", func(k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, apierrors.NewNotFound(snapshotContents.GroupResource(), "")
		})
	}
	newEnv := func(opts *options, out io.Writer) (*env, error) {
		ns := namespace
		if opts.kube.Namespace != nil && *opts.kube.Namespace != "" {
			ns = *opts.kube.Namespace
		}
		return &env{kube: kube, dyn: dyn, nodes: f.nodes, out: out, color: color, now: func() time.Time { return testNow }, namespace: ns, opts: opts}, nil
	}
	var stdout, stderr bytes.Buffer
	code := mainWithCode(context.Background(), args, &stdout, &stderr, newEnv)
	return stdout.String(), stderr.String(), code
}

func csiDriver() *storagev1.CSIDriver {
	return &storagev1.CSIDriver{
		ObjectMeta: metav1.ObjectMeta{Name: testDriver},
		Spec: storagev1.CSIDriverSpec{
			AttachRequired:                     ptr.To(true),
			StorageCapacity:                    ptr.To(true),
			PodInfoOnMount:                     ptr.To(true),
			FSGroupPolicy:                      ptr.To(storagev1.FileFSGroupPolicy),
			VolumeLifecycleModes:               []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecyclePersistent},
			RequiresRepublish:                  ptr.To(false),
			SELinuxMount:                       ptr.To(true),
			NodeAllocatableUpdatePeriodSeconds: ptr.To[int64](60),
			PreventPodSchedulingIfMissing:      ptr.To(true),
		},
	}
}

func node(name, zone string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{volspec.TopologyKey: zone, "kubernetes.io/hostname": name}}}
}

func csiNode(name string, count int32) *storagev1.CSINode {
	return &storagev1.CSINode{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{{
			Name: testDriver, NodeID: name, TopologyKeys: []string{volspec.TopologyKey},
			Allocatable: &storagev1.VolumeNodeResources{Count: ptr.To(count)},
		}}},
	}
}

func pluginPod(name, nodeName string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNS,
			Labels: map[string]string{"app.kubernetes.io/name": "loopvol", "app.kubernetes.io/component": "node"}},
		Spec: corev1.PodSpec{NodeName: nodeName, ServiceAccountName: "loopvol-node", Containers: []corev1.Container{{Name: "driver"},
			{Name: "registrar", Command: []string{"/attacher"}, Args: []string{"--controllers=registrar", "--csinode-mode=kubelet"}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{
			{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
	}
}

func storageClass(name string, mode storagev1.VolumeBindingMode) *storagev1.StorageClass {
	return &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Provisioner: testDriver, VolumeBindingMode: &mode,
		Parameters: map[string]string{"pool": "default"}}
}

func storageCapacity(name, class, zone string) *storagev1.CSIStorageCapacity {
	return &storagev1.CSIStorageCapacity{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNS, Labels: map[string]string{
			capacity.DriverNameLabel: testDriver, capacity.ManagedByLabel: capacity.ManagedByCentral}},
		StorageClassName: class,
		NodeTopology:     &metav1.LabelSelector{MatchLabels: map[string]string{volspec.TopologyKey: zone}},
		Capacity:         resource.NewQuantity(100*gib, resource.BinarySI),
	}
}

func lease(name, holder string, renewed time.Time) *coordinationv1.Lease {
	return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNS},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(holder), LeaseDurationSeconds: ptr.To[int32](15),
			RenewTime: &metav1.MicroTime{Time: renewed}}}
}

// testCA is a CA certificate in PEM, and testCAKey its key, made once.
var testCA, testCAKey = func() ([]byte, *ecdsa.PrivateKey) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		panic(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "loopvol-webhook-ca"},
		NotBefore: testNow.Add(-time.Hour), NotAfter: testNow.Add(365 * 24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		panic(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), key
}()

// webhookHost is the name the API server calls the fixture's webhook by.
const webhookHost = "loopvol-webhook." + testNS + ".svc"

// servingCert is a serving certificate for host, valid until notAfter,
// and its key, in PEM: signed by testCA, or by a CA of its own (a
// certificate the API server would not trust) when byTestCA is false.
func servingCert(t *testing.T, host string, notAfter time.Time, byTestCA bool) (crt, keyPEM []byte) {
	t.Helper()
	signer, issuer := testCAKey, testCA
	if !byTestCA {
		other, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(9), Subject: pkix.Name{CommonName: "another-ca"},
			NotBefore: testNow.Add(-time.Hour), NotAfter: testNow.Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
			KeyUsage: x509.KeyUsageCertSign}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &other.PublicKey, other)
		if err != nil {
			t.Fatal(err)
		}
		signer, issuer = other, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	}
	block, _ := pem.Decode(issuer)
	ca, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: host}, DNSNames: []string{host},
		NotBefore: testNow.Add(-48 * time.Hour), NotAfter: notAfter,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, signer)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

// webhookSecret is the webhook's serving Secret, as the controller Pod
// mounts it.
func webhookSecret(crt, key []byte) *corev1.Secret {
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "loopvol-webhook-tls", Namespace: testNS}, Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{corev1.TLSCertKey: crt, corev1.TLSPrivateKeyKey: key, "ca.crt": testCA}}
}

// webhookService is the Service the webhook configuration calls, and
// controllerPod the Pod behind it, whose sidecar serves the certificate
// of webhookSecret.
func webhookService() *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "loopvol-webhook", Namespace: testNS},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app.kubernetes.io/name": "loopvol", "app.kubernetes.io/component": "controller"}}}
}

func controllerPod() *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "loopvol-controller-0", Namespace: testNS,
		Labels: map[string]string{"app.kubernetes.io/name": "loopvol", "app.kubernetes.io/component": "controller"}},
		Spec: corev1.PodSpec{NodeName: "worker-1", ServiceAccountName: "loopvol-controller",
			Containers: []corev1.Container{{Name: "sidecar", Command: []string{"/attacher"},
				Args:         []string{"--controllers=attach,capacity,resizer,webhook,placement", "--leader-election", "--webhook-cert-dir=/etc/loopvol/webhook-tls"},
				VolumeMounts: []corev1.VolumeMount{{Name: "webhook-tls", MountPath: "/etc/loopvol/webhook-tls", ReadOnly: true}}},
				{Name: "csi-provisioner", Args: []string{"--csi-address=/csi/csi.sock", "--leader-election"}}},
			Volumes: []corev1.Volume{{Name: "webhook-tls", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "loopvol-webhook-tls"}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning}}
}

func webhookConfig(t *testing.T, withCA bool) *admissionregistrationv1.ValidatingWebhookConfiguration {
	t.Helper()
	var ca []byte
	if withCA {
		ca = testCA
	}
	svc := &admissionregistrationv1.ServiceReference{Namespace: testNS, Name: "loopvol-webhook", Path: ptr.To("/validate"), Port: ptr.To[int32](443)}
	return &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: webhookConfiguration},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{
			{Name: "pvc.loopvol.csi.io", ClientConfig: admissionregistrationv1.WebhookClientConfig{Service: svc, CABundle: ca}},
			{Name: "storageclass.loopvol.csi.io", ClientConfig: admissionregistrationv1.WebhookClientConfig{Service: svc, CABundle: ca}},
		},
	}
}

func webhookEndpoints(ready int) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "loopvol-webhook-x8v2k", Namespace: testNS,
		Labels: map[string]string{discoveryv1.LabelServiceName: "loopvol-webhook"}}, AddressType: discoveryv1.AddressTypeIPv4}
	for i := range ready {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{fmt.Sprintf("10.42.0.%d", 10+i)},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}})
	}
	return s
}

func policy(name string) *admissionregistrationv1.ValidatingAdmissionPolicy {
	return &admissionregistrationv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: name}}
}

func policyBinding(name string) *admissionregistrationv1.ValidatingAdmissionPolicyBinding {
	return &admissionregistrationv1.ValidatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{PolicyName: name}}
}

func claim(ns, name, class, size, volume string) *corev1.PersistentVolumeClaim {
	c := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: types.UID("uid-pvc-" + ns + "-" + name)},
		Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: ptr.To(class), VolumeName: volume,
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOncePod},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)}}},
		Status: corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimPending},
	}
	if volume != "" {
		c.Status.Phase = corev1.ClaimBound
		c.Status.Capacity = corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)}
	}
	return c
}

func pv(name, ns, claimName, handle, size string) *corev1.PersistentVolume {
	return &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name)},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:               corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)},
			StorageClassName:       "loopvol",
			ClaimRef:               &corev1.ObjectReference{Namespace: ns, Name: claimName},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: testDriver, VolumeHandle: handle, FSType: "ext4"}},
		},
		Status: corev1.PersistentVolumeStatus{Phase: corev1.VolumeBound},
	}
}

func va(name, pvName, nodeName string, attached bool, attachErr string) *storagev1.VolumeAttachment {
	v := &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name)},
		Spec: storagev1.VolumeAttachmentSpec{Attacher: testDriver, NodeName: nodeName,
			Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: ptr.To(pvName)}},
		Status: storagev1.VolumeAttachmentStatus{Attached: attached},
	}
	if attachErr != "" {
		v.Status.AttachError = &storagev1.VolumeError{Time: metav1.NewTime(testNow.Add(-time.Minute)), Message: attachErr}
	}
	return v
}

func pod(ns, name, nodeName string, phase corev1.PodPhase, claims ...string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: types.UID("uid-pod-" + ns + "-" + name)},
		Spec: corev1.PodSpec{NodeName: nodeName}, Status: corev1.PodStatus{Phase: phase}}
	for i, cl := range claims {
		p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: fmt.Sprintf("vol%d", i),
			VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: cl}}})
	}
	if phase == corev1.PodPending && nodeName != "" {
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "main",
			State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}}}}
	}
	return p
}

// event is an Event about an object of the namespace, last seen minutesAgo.
func event(ns, name, kind, typ, reason, msg string, minutesAgo int) *corev1.Event {
	uid := types.UID("")
	switch kind {
	case "Pod":
		uid = types.UID("uid-pod-" + ns + "-" + name)
	case "PersistentVolumeClaim":
		uid = types.UID("uid-pvc-" + ns + "-" + name)
	}
	return &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: fmt.Sprintf("%s.%s.%d", name, strings.ToLower(reason), minutesAgo), Namespace: ns},
		InvolvedObject: corev1.ObjectReference{Kind: kind, Namespace: ns, Name: name, UID: uid},
		Type:           typ, Reason: reason, Message: msg, Count: 1,
		LastTimestamp: metav1.NewTime(testNow.Add(-time.Duration(minutesAgo) * time.Minute)),
	}
}

func snapshotContent(name, handle string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotContent",
		"metadata": map[string]any{"name": name},
		"spec": map[string]any{"driver": testDriver, "deletionPolicy": "Delete",
			"source": map[string]any{"volumeHandle": handle}},
	}}
}
