package e2e

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
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
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/loopvol/loopvol/internal/harness/testenv"
	"github.com/loopvol/loopvol/pkg/capacity"
)

// The installation the shipped params object (ConfigMap loopvol/
// loopvol-admission) describes: the names the policies are checked against.
const (
	admNamespace  = "loopvol"
	admParams     = "loopvol-admission"
	admController = "loopvol-controller" // ServiceAccount of the StatefulSet pod
	admNode       = "loopvol-node"       // ServiceAccount of the DaemonSet pod
	admBaseClass  = "loopvol"            // the base's StorageClass, listed in the params

	// The policies, named as in deploy/kubernetes/base/admission; each
	// binding has its policy's name.
	polClassParams = "loopvol-storageclass-parameters"
	polClassListed = "loopvol-storageclass-listed"
	polVAStatus    = "loopvol-volumeattachment-status"
	polCapacity    = "loopvol-csistoragecapacity-writers"
	polPVCModes    = "loopvol-pvc-access-modes"
	polVACParams   = "loopvol-volumeattributesclass-parameters"

	// Identities of kube-controller-manager's controllers (as with
	// --use-service-account-credentials): the API server's bootstrap RBAC
	// already binds their roles to these names.
	admAttachDetach = "system:serviceaccount:kube-system:attachdetach-controller"
	admGC           = "system:serviceaccount:kube-system:generic-garbage-collector"

	admOtherDriver = "other.csi.example.com"
	admZoneKey     = "topology.loopvol.csi.io/zone"
)

// admissionRig is the world of TestAdmission: the policies of
// deploy/kubernetes/base/admission applied to the shared API server, the
// users who make requests under them, and cleanup of everything.
type admissionRig struct {
	t   *testing.T
	ctx context.Context
	env *testenv.Env
	id  string

	// admin is the envtest administrator (group system:masters): an
	// ordinary cluster administrator as far as the policies go.
	admin     kubernetes.Interface
	adminName string
	// warned collects the API server's warnings to admin's requests.
	warned *warnings

	policies []*admissionv1.ValidatingAdmissionPolicy
	bindings []*admissionv1.ValidatingAdmissionPolicyBinding
	params   *corev1.ConfigMap // as shipped

	// controller is the StatefulSet sidecar's ServiceAccount, with a token.
	controller kubernetes.Interface
}

// TestAdmission applies loopvol's ValidatingAdmissionPolicies, as shipped
// in deploy/kubernetes/base/admission, to the real kube-apiserver and
// checks each against the requests it must refuse (with its message), the
// ones it must let through, and the sidecar's own writes, made with real
// ServiceAccount tokens (Pod-bound ones for the node sidecars). Probes that
// wait for a policy to take effect are dry runs, so they leave nothing
// behind.
func TestAdmission(t *testing.T) {
	a := newAdmissionRig(t)
	t.Run("StorageClass parameters", a.testStorageClassParameters)
	t.Run("StorageClass listed", a.testStorageClassListed)
	t.Run("VolumeAttachment status", a.testVolumeAttachmentStatus)
	t.Run("CSIStorageCapacity writers", a.testCapacityWriters)
	t.Run("PVC access modes", a.testPVCAccessModes)
	t.Run("VolumeAttributesClass parameters", a.testVACParameters)
	// Last: it deletes the params object.
	t.Run("params missing", a.testParamsMissing)
}

func newAdmissionRig(t *testing.T) *admissionRig {
	t.Helper()
	env := cluster.Env(t)
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.Verbosity(2)))
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logger))
	t.Cleanup(cancel)

	a := &admissionRig{t: t, ctx: ctx, env: env, id: shortID(), warned: &warnings{}}
	cfg := rest.CopyConfig(env.Config)
	cfg.WarningHandler = a.warned
	a.admin = admClient(t, cfg)
	a.adminName = a.whoAmI(t, a.admin).Username

	a.load()
	a.checkServedVersions()
	a.ensureNamespace()
	a.apply()
	a.grantSidecarRBAC()
	a.ensureServiceAccount(admController)
	a.ensureServiceAccount(admNode)
	a.controller = a.saClient(t, admController, nil)
	if u := a.whoAmI(t, a.controller); u.Username != "system:serviceaccount:"+admNamespace+":"+admController {
		t.Fatalf("the controller's token authenticates as %q", u.Username)
	}
	return a
}

// admClient is a clientset for cfg with room for a test's bursts.
func admClient(t *testing.T, cfg *rest.Config) kubernetes.Interface {
	t.Helper()
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = 200, 400
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// admissionDir is deploy/kubernetes/base/admission.
func admissionDir(t *testing.T) string {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, "deploy", "kubernetes", "base", "admission")
}

// load reads the files kustomization.yaml lists (and checks that it lists
// every YAML file of the directory), decoding each object strictly into its
// typed API struct, so that a misspelt field fails here rather than being
// dropped. It also checks what the policies must say on purpose: an
// explicit failurePolicy, a messageExpression on every validation, a
// binding per policy with explicit validationActions, and an explicit
// parameterNotFoundAction wherever params are used.
func (a *admissionRig) load() {
	t := a.t
	dir := admissionDir(t)
	data, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var kust struct {
		APIVersion string   `json:"apiVersion"`
		Kind       string   `json:"kind"`
		Resources  []string `json:"resources"`
	}
	if err := yaml.UnmarshalStrict(data, &kust); err != nil {
		t.Fatalf("kustomization.yaml: %v", err)
	}
	yamls, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range yamls {
		if name := filepath.Base(f); name != "kustomization.yaml" && !slices.Contains(kust.Resources, name) {
			t.Errorf("%s is not among the resources of kustomization.yaml", name)
		}
	}

	var webhookObjects []string
	for _, file := range kust.Resources {
		data, err := os.ReadFile(filepath.Join(dir, file))
		if err != nil {
			t.Fatal(err)
		}
		for doc := range bytes.SplitSeq(data, []byte("\n---\n")) {
			var head metav1.TypeMeta
			if err := yaml.Unmarshal(doc, &head); err != nil {
				t.Fatalf("%s: %v", file, err)
			}
			switch head.Kind {
			case "ConfigMap":
				var cm corev1.ConfigMap
				if err := yaml.UnmarshalStrict(doc, &cm); err != nil {
					t.Fatalf("%s: %v", file, err)
				}
				if a.params != nil {
					t.Fatalf("%s: a second ConfigMap %s", file, cm.Name)
				}
				a.params = &cm
			case "ValidatingAdmissionPolicy":
				var p admissionv1.ValidatingAdmissionPolicy
				if err := yaml.UnmarshalStrict(doc, &p); err != nil {
					t.Fatalf("%s: %v", file, err)
				}
				a.policies = append(a.policies, &p)
			case "ValidatingAdmissionPolicyBinding":
				var b admissionv1.ValidatingAdmissionPolicyBinding
				if err := yaml.UnmarshalStrict(doc, &b); err != nil {
					t.Fatalf("%s: %v", file, err)
				}
				a.bindings = append(a.bindings, &b)
			case "ValidatingWebhookConfiguration":
				// The webhook's (webhook_test.go tests it).
				var w admissionv1.ValidatingWebhookConfiguration
				if err := yaml.UnmarshalStrict(doc, &w); err != nil {
					t.Fatalf("%s: %v", file, err)
				}
				webhookObjects = append(webhookObjects, head.Kind+" /"+w.Name)
			case "Service":
				var svc corev1.Service
				if err := yaml.UnmarshalStrict(doc, &svc); err != nil {
					t.Fatalf("%s: %v", file, err)
				}
				webhookObjects = append(webhookObjects, head.Kind+" "+svc.Namespace+"/"+svc.Name)
			case "":
			default:
				t.Fatalf("%s: unexpected kind %q (apiVersion %s)", file, head.Kind, head.APIVersion)
			}
			if head.Kind != "" && head.Kind != "ConfigMap" && head.Kind != "Service" && head.APIVersion != "admissionregistration.k8s.io/v1" {
				t.Errorf("%s: %s uses %s; loopvol ships only the GA admissionregistration.k8s.io/v1", file, head.Kind, head.APIVersion)
			}
		}
	}

	// kustomize (as `kubectl apply -k` and the base that includes this
	// directory use it) renders exactly these objects, the cluster-scoped
	// ones without a namespace.
	res, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	var rendered []string
	for _, r := range res.Resources() {
		rendered = append(rendered, r.GetKind()+" "+r.GetNamespace()+"/"+r.GetName())
	}
	files := webhookObjects
	if a.params != nil {
		files = append(files, "ConfigMap "+a.params.Namespace+"/"+a.params.Name)
	}
	for _, p := range a.policies {
		files = append(files, "ValidatingAdmissionPolicy /"+p.Name)
	}
	for _, b := range a.bindings {
		files = append(files, "ValidatingAdmissionPolicyBinding /"+b.Name)
	}
	slices.Sort(rendered)
	slices.Sort(files)
	if !slices.Equal(rendered, files) {
		t.Errorf("kustomize renders %q, the files hold %q", rendered, files)
	}

	if a.params == nil || a.params.Name != admParams || a.params.Namespace != admNamespace {
		t.Fatalf("want the params ConfigMap %s/%s in the kustomization", admNamespace, admParams)
	}
	want := []string{polClassParams, polClassListed, polVAStatus, polCapacity, polPVCModes, polVACParams}
	var got []string
	for _, p := range a.policies {
		got = append(got, p.Name)
		if p.Spec.FailurePolicy == nil {
			t.Errorf("policy %s: failurePolicy is not set (chosen on purpose, not defaulted)", p.Name)
		}
		for i, v := range p.Spec.Validations {
			if v.MessageExpression == "" {
				t.Errorf("policy %s: validation %d has no messageExpression", p.Name, i)
			}
		}
		i := slices.IndexFunc(a.bindings, func(b *admissionv1.ValidatingAdmissionPolicyBinding) bool { return b.Spec.PolicyName == p.Name })
		if i < 0 {
			t.Errorf("policy %s has no binding", p.Name)
			continue
		}
		b := a.bindings[i]
		if b.Name != p.Name {
			t.Errorf("binding %s of policy %s: want the policy's name", b.Name, p.Name)
		}
		if len(b.Spec.ValidationActions) == 0 {
			t.Errorf("binding %s: validationActions is not set", b.Name)
		}
		switch {
		case p.Spec.ParamKind == nil && b.Spec.ParamRef != nil:
			t.Errorf("binding %s has a paramRef, policy %s no paramKind", b.Name, p.Name)
		case p.Spec.ParamKind != nil:
			ref := b.Spec.ParamRef
			if ref == nil || ref.Name != admParams || ref.Namespace != admNamespace {
				t.Errorf("binding %s: want paramRef %s/%s, got %+v", b.Name, admNamespace, admParams, ref)
			} else if ref.ParameterNotFoundAction == nil {
				t.Errorf("binding %s: parameterNotFoundAction is not set", b.Name)
			}
			if k := p.Spec.ParamKind; k.APIVersion != "v1" || k.Kind != "ConfigMap" {
				t.Errorf("policy %s: paramKind %+v, want the ConfigMap", p.Name, k)
			}
		}
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) || len(a.bindings) != len(a.policies) {
		t.Fatalf("policies %v with %d bindings, want %v with one binding each", got, len(a.bindings), want)
	}
}

// checkServedVersions checks what docs/admission.md says: the API server
// serves ValidatingAdmissionPolicy (and its binding) in
// admissionregistration.k8s.io/v1, and not in v1alpha1, which (off by
// default) holds only the alpha MutatingAdmissionPolicy.
func (a *admissionRig) checkServedVersions() {
	disc := a.admin.Discovery()
	v1, err := disc.ServerResourcesForGroupVersion("admissionregistration.k8s.io/v1")
	if err != nil {
		a.t.Fatalf("discovery of admissionregistration.k8s.io/v1: %v", err)
	}
	for _, want := range []string{"validatingadmissionpolicies", "validatingadmissionpolicybindings"} {
		if !slices.ContainsFunc(v1.APIResources, func(r metav1.APIResource) bool { return r.Name == want }) {
			a.t.Errorf("admissionregistration.k8s.io/v1 does not serve %s", want)
		}
	}
	alpha, err := disc.ServerResourcesForGroupVersion("admissionregistration.k8s.io/v1alpha1")
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		a.t.Errorf("discovery of admissionregistration.k8s.io/v1alpha1: %v", err)
	default:
		for _, r := range alpha.APIResources {
			if strings.HasPrefix(r.Name, "validatingadmissionpolic") {
				a.t.Errorf("admissionregistration.k8s.io/v1alpha1 serves %s", r.Name)
			}
		}
	}
}

// ensureNamespace creates loopvol's namespace unless it exists. It is left
// behind: without kube-controller-manager a deleted namespace never goes
// away, and one stuck Terminating would refuse the next test's objects.
func (a *admissionRig) ensureNamespace() {
	_, err := a.admin.CoreV1().Namespaces().Create(a.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: admNamespace}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		a.t.Fatalf("create namespace %s: %v", admNamespace, err)
	}
}

// apply creates the params object, the policies and the bindings, and
// registers their removal. The removal waits until the API server has
// stopped enforcing the policies, so that later tests of the package (which
// patch VolumeAttachment status as an administrator) see none of them.
func (a *admissionRig) apply() {
	t, ctx := a.t, a.ctx
	adm := a.admin.AdmissionregistrationV1()
	if _, err := a.admin.CoreV1().ConfigMaps(admNamespace).Create(ctx, a.params.DeepCopy(), metav1.CreateOptions{}); err != nil {
		t.Fatalf("create ConfigMap %s/%s (left over from another test?): %v", admNamespace, admParams, err)
	}
	t.Cleanup(func() {
		ctx := context.WithoutCancel(ctx)
		a.cleanupErr(a.t, "ConfigMap "+admParams, a.admin.CoreV1().ConfigMaps(admNamespace).Delete(ctx, admParams, metav1.DeleteOptions{}))
	})
	for _, p := range a.policies {
		if _, err := adm.ValidatingAdmissionPolicies().Create(ctx, p.DeepCopy(), metav1.CreateOptions{}); err != nil {
			t.Fatalf("create ValidatingAdmissionPolicy %s: %v", p.Name, err)
		}
		t.Cleanup(func() {
			a.cleanupErr(a.t, "ValidatingAdmissionPolicy "+p.Name,
				adm.ValidatingAdmissionPolicies().Delete(context.WithoutCancel(ctx), p.Name, metav1.DeleteOptions{}))
		})
	}
	// Cleanups run last-in first-out: the bindings go first, then the wait
	// until nothing is enforced, then the test's CSIStorageCapacity objects
	// (an administrator may not delete loopvol's while the policy holds),
	// then the policies and the params.
	t.Cleanup(a.deleteCapacityObjects)
	// A VolumeAttachment of loopvol for waitPoliciesGone to probe.
	probe := &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: a.probeVA(), Labels: a.labels()},
		Spec: storagev1.VolumeAttachmentSpec{
			Attacher: driverName,
			NodeName: "e2e-" + a.id + "-probe",
			Source:   storagev1.VolumeAttachmentSource{PersistentVolumeName: ptr.To("e2e-" + a.id + "-probe")},
		},
	}
	if _, err := a.admin.StorageV1().VolumeAttachments().Create(ctx, probe, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create VolumeAttachment %s: %v", probe.Name, err)
	}
	t.Cleanup(func() {
		a.cleanupErr(a.t, "VolumeAttachment "+probe.Name, a.admin.StorageV1().VolumeAttachments().Delete(context.WithoutCancel(ctx), probe.Name, metav1.DeleteOptions{}))
	})
	t.Cleanup(a.waitPoliciesGone)
	for _, b := range a.bindings {
		if _, err := adm.ValidatingAdmissionPolicyBindings().Create(ctx, b.DeepCopy(), metav1.CreateOptions{}); err != nil {
			t.Fatalf("create ValidatingAdmissionPolicyBinding %s: %v", b.Name, err)
		}
		t.Cleanup(func() {
			a.cleanupErr(a.t, "ValidatingAdmissionPolicyBinding "+b.Name,
				adm.ValidatingAdmissionPolicyBindings().Delete(context.WithoutCancel(ctx), b.Name, metav1.DeleteOptions{}))
		})
	}
}

// deleteCapacityObjects deletes the test's CSIStorageCapacity objects in
// every namespace.
func (a *admissionRig) deleteCapacityObjects() {
	ctx := context.WithoutCancel(a.ctx)
	list, err := a.admin.StorageV1().CSIStorageCapacities(metav1.NamespaceAll).List(ctx, metav1.ListOptions{LabelSelector: testLabel + "=" + a.id})
	if err != nil {
		a.t.Errorf("cleanup: list CSIStorageCapacity objects: %v", err)
		return
	}
	for _, o := range list.Items {
		a.cleanupErr(a.t, "CSIStorageCapacity "+o.Namespace+"/"+o.Name, a.admin.StorageV1().CSIStorageCapacities(o.Namespace).Delete(ctx, o.Name, metav1.DeleteOptions{}))
	}
}

func (a *admissionRig) cleanupErr(t *testing.T, what string, err error) {
	if err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("cleanup: delete %s: %v", what, err)
	}
}

// probeVA names the VolumeAttachment that waitPoliciesGone probes.
func (a *admissionRig) probeVA() string { return "e2e-" + a.id + "-va-probe" }

// waitPoliciesGone waits until requests that the policies refuse (or warn
// about) pass again (dry runs), after the bindings are deleted. Once the
// params are gone the probes of the policies that then step aside pass
// anyway; the API server drops all bindings through one informer, so those
// of the others stand for them.
func (a *admissionRig) waitPoliciesGone() {
	ctx := context.WithoutCancel(a.ctx)
	probes := map[string]func(ctx context.Context) error{
		polVAStatus: func(ctx context.Context) error {
			return a.patchVAStatus(ctx, a.admin, a.probeVA(), `{"status":{"attached":true}}`, true)
		},
		polClassListed: func(ctx context.Context) error {
			a.warned.take()
			if err := a.createClass(ctx, a.admin, "e2e-"+a.id+"-gone", nil, true); err != nil {
				return err
			}
			if w := a.warned.take(); len(w) > 0 {
				return fmt.Errorf("warned: %q", w)
			}
			return nil
		},
		polClassParams: func(ctx context.Context) error {
			return a.createClass(ctx, a.admin, "e2e-"+a.id+"-gone", map[string]string{"fsType": "ext4"}, true)
		},
		polCapacity: func(ctx context.Context) error {
			_, err := a.admin.StorageV1().CSIStorageCapacities(admNamespace).Create(ctx,
				a.capacityObject(admNamespace, capacity.ManagedByCentral, admBaseClass), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			return err
		},
		polPVCModes: func(ctx context.Context) error {
			return a.createPVC(ctx, admNamespace, admBaseClass, corev1.PersistentVolumeFilesystem, corev1.ReadWriteMany)
		},
	}
	for name, probe := range probes {
		err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, shortWait, true, func(ctx context.Context) (bool, error) {
			return probe(ctx) == nil, nil
		})
		if err != nil {
			a.t.Errorf("cleanup: policy %s is still enforced %s after its binding was deleted: %v", name, shortWait, probe(ctx))
		}
	}
}

// whoAmI is the user a client authenticates as (a SelfSubjectReview).
func (a *admissionRig) whoAmI(t *testing.T, c kubernetes.Interface) authenticationv1.UserInfo {
	t.Helper()
	r, err := c.AuthenticationV1().SelfSubjectReviews().Create(a.ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("SelfSubjectReview: %v", err)
	}
	return r.Status.UserInfo
}

// grantSidecarRBAC lets loopvol's two ServiceAccounts make the writes the
// test makes in their name, in every namespace: RBAC is not what is under
// test here, the policies are (rbac_test.go covers the shipped roles).
func (a *admissionRig) grantSidecarRBAC() {
	t, ctx := a.t, a.ctx
	rbac := a.admin.RbacV1()
	name := "e2e-" + a.id + "-admission-sidecar"
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{"storage.k8s.io"}, Resources: []string{"volumeattachments"}, Verbs: []string{"get", "patch"}},
			{APIGroups: []string{"storage.k8s.io"}, Resources: []string{"volumeattachments/status"}, Verbs: []string{"patch", "update"}},
			{APIGroups: []string{"storage.k8s.io"}, Resources: []string{"csistoragecapacities"}, Verbs: []string{"get", "create", "patch", "update", "delete"}},
		},
	}
	if _, err := rbac.ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects: []rbacv1.Subject{
			{Kind: rbacv1.ServiceAccountKind, Name: admController, Namespace: admNamespace},
			{Kind: rbacv1.ServiceAccountKind, Name: admNode, Namespace: admNamespace},
		},
	}
	if _, err := rbac.ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.WithoutCancel(ctx)
		a.cleanupErr(a.t, "ClusterRoleBinding "+name, rbac.ClusterRoleBindings().Delete(ctx, name, metav1.DeleteOptions{}))
		a.cleanupErr(a.t, "ClusterRole "+name, rbac.ClusterRoles().Delete(ctx, name, metav1.DeleteOptions{}))
	})
}

// ensureServiceAccount creates a ServiceAccount in loopvol's namespace
// unless it exists, and deletes it at the end if it made it.
func (a *admissionRig) ensureServiceAccount(name string) {
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: admNamespace}}
	_, err := a.admin.CoreV1().ServiceAccounts(admNamespace).Create(a.ctx, sa, metav1.CreateOptions{})
	switch {
	case apierrors.IsAlreadyExists(err):
	case err != nil:
		a.t.Fatalf("create ServiceAccount %s: %v", name, err)
	default:
		a.t.Cleanup(func() {
			a.cleanupErr(a.t, "ServiceAccount "+name, a.admin.CoreV1().ServiceAccounts(admNamespace).Delete(context.WithoutCancel(a.ctx), name, metav1.DeleteOptions{}))
		})
	}
}

// saClient returns a client that authenticates with a token of the
// ServiceAccount (TokenRequest API), bound to pod if one is given, as
// kubelet's projected tokens are.
func (a *admissionRig) saClient(t *testing.T, sa string, pod *corev1.Pod) kubernetes.Interface {
	t.Helper()
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}
	if pod != nil {
		req.Spec.BoundObjectRef = &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}
	}
	tok, err := a.admin.CoreV1().ServiceAccounts(admNamespace).CreateToken(a.ctx, sa, req, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("TokenRequest for ServiceAccount %s: %v", sa, err)
	}
	cfg := rest.AnonymousClientConfig(a.env.Config)
	cfg.BearerToken = tok.Status.Token
	return admClient(t, cfg)
}

// nodeSidecar is the DaemonSet sidecar of a new node: a Node, a Pod of
// loopvol-node's ServiceAccount on it, and a client with a token bound to
// that Pod. It checks that the token carries the node's name, which the
// policies rely on.
func (a *admissionRig) nodeSidecar(t *testing.T, node string) kubernetes.Interface {
	t.Helper()
	ctx := a.ctx
	if _, err := a.admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, Labels: a.labels()}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create Node %s: %v", node, err)
	}
	t.Cleanup(func() {
		a.cleanupErr(t, "Node "+node, a.admin.CoreV1().Nodes().Delete(context.WithoutCancel(ctx), node, metav1.DeleteOptions{}))
	})
	pod, err := a.admin.CoreV1().Pods(admNamespace).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "e2e-" + a.id + "-node-", Labels: a.labels()},
		Spec: corev1.PodSpec{
			NodeName:           node,
			ServiceAccountName: admNode,
			// Never pulled: no kubelet runs here.
			Containers: []corev1.Container{{Name: "sidecar", Image: "registry.invalid/loopvol/attacher:e2e"}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create the sidecar Pod on %s: %v", node, err)
	}
	t.Cleanup(func() {
		a.cleanupErr(t, "Pod "+pod.Name, a.admin.CoreV1().Pods(admNamespace).Delete(context.WithoutCancel(ctx), pod.Name,
			metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}))
	})
	c := a.saClient(t, admNode, pod)
	u := a.whoAmI(t, c)
	if got := u.Extra["authentication.kubernetes.io/node-name"]; len(got) != 1 || got[0] != node {
		t.Fatalf("a token bound to Pod %s on node %s carries node-name %v (user %s)", pod.Name, node, got, u.Username)
	}
	return c
}

func (a *admissionRig) labels() map[string]string { return map[string]string{testLabel: a.id} }

// setParam changes one key of the params object, as an overlay would.
func (a *admissionRig) setParam(t *testing.T, key, value string) {
	t.Helper()
	patch := fmt.Sprintf(`{"data":{%q:%q}}`, key, value)
	if _, err := a.admin.CoreV1().ConfigMaps(admNamespace).Patch(a.ctx, admParams, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatalf("set %s of ConfigMap %s: %v", key, admParams, err)
	}
}

// verdict is what a request should come to: allowed, or refused by a
// policy with a status reason and a message containing some phrases.
type verdict struct {
	policy string
	reason metav1.StatusReason
	parts  []string
}

var allowed = verdict{}

func deniedBy(policy string, reason metav1.StatusReason, parts ...string) verdict {
	return verdict{policy: policy, reason: reason, parts: parts}
}

// check compares a request's outcome with the verdict.
func (v verdict) check(t *testing.T, what string, err error) {
	t.Helper()
	if v.policy == "" {
		if err != nil {
			t.Errorf("%s: want it allowed, got %v", what, err)
		}
		return
	}
	if err == nil {
		t.Errorf("%s: want it refused by %s, it was allowed", what, v.policy)
		return
	}
	msg := err.Error()
	head := fmt.Sprintf("ValidatingAdmissionPolicy '%s' with binding '%s' denied request: ", v.policy, v.policy)
	if !strings.Contains(msg, head) {
		t.Errorf("%s: want it refused by %s, got %v", what, v.policy, err)
		return
	}
	if got := apierrors.ReasonForError(err); got != v.reason {
		t.Errorf("%s: refused with reason %s, want %s: %v", what, got, v.reason, err)
	}
	for _, p := range v.parts {
		if !strings.Contains(msg, p) {
			t.Errorf("%s: the message lacks %q:\n%s", what, p, msg)
		}
	}
}

// waitEnforced polls a dry-run probe until the verdict holds for it: the
// API server's policy, binding and params informers load asynchronously.
func (a *admissionRig) waitEnforced(t *testing.T, what string, v verdict, probe func(ctx context.Context) error) {
	t.Helper()
	var last error
	err := wait.PollUntilContextTimeout(a.ctx, 100*time.Millisecond, shortWait, true, func(ctx context.Context) (bool, error) {
		last = probe(ctx)
		return last != nil && strings.Contains(last.Error(), "ValidatingAdmissionPolicy '"+v.policy+"'"), nil
	})
	if err != nil {
		t.Fatalf("%s: not refused by %s within %s; last outcome: %v", what, v.policy, shortWait, last)
	}
	v.check(t, what, last)
}

// createClass creates a StorageClass of loopvol.csi.io (a dry run if
// dryRun) and, if it was made, deletes it when the test ends.
func (a *admissionRig) createClass(ctx context.Context, c kubernetes.Interface, name string, params map[string]string, dryRun bool) error {
	return a.createClassOf(ctx, c, name, driverName, params, nil, dryRun)
}

func (a *admissionRig) createClassOf(ctx context.Context, c kubernetes.Interface, name, provisioner string, params, annotations map[string]string, dryRun bool) error {
	sc := &storagev1.StorageClass{
		ObjectMeta:        metav1.ObjectMeta{Name: name, Labels: a.labels(), Annotations: annotations},
		Provisioner:       provisioner,
		Parameters:        params,
		VolumeBindingMode: ptr.To(storagev1.VolumeBindingWaitForFirstConsumer),
	}
	opts := metav1.CreateOptions{}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	_, err := c.StorageV1().StorageClasses().Create(ctx, sc, opts)
	if err == nil && !dryRun {
		a.t.Cleanup(func() {
			a.cleanupErr(a.t, "StorageClass "+name, a.admin.StorageV1().StorageClasses().Delete(context.WithoutCancel(a.ctx), name, metav1.DeleteOptions{}))
		})
	}
	return err
}

func (a *admissionRig) testStorageClassParameters(t *testing.T) {
	name := func(s string) string { return "e2e-" + a.id + "-" + s }
	a.waitEnforced(t, "a class with fsType", deniedBy(polClassParams, metav1.StatusReasonInvalid), func(ctx context.Context) error {
		return a.createClass(ctx, a.admin, name("probe"), map[string]string{"fsType": "ext4"}, true)
	})
	secret := func(kind string) map[string]string {
		return map[string]string{
			"csi.storage.k8s.io/" + kind + "-secret-name":      "loopvol-${pvc.name}",
			"csi.storage.k8s.io/" + kind + "-secret-namespace": "${pvc.namespace}",
		}
	}
	merge := func(ms ...map[string]string) map[string]string {
		out := map[string]string{}
		for _, m := range ms {
			for k, v := range m {
				out[k] = v
			}
		}
		return out
	}
	for i, tc := range []struct {
		name        string
		provisioner string
		params      map[string]string
		want        verdict
	}{
		{name: "no parameters", want: allowed},
		{name: "the base's", params: map[string]string{"pool": "default", "csi.storage.k8s.io/fstype": "ext4"}, want: allowed},
		{name: "xfs, 63-character pool", params: map[string]string{"pool": "p" + strings.Repeat("0", 61) + "z", "csi.storage.k8s.io/fstype": "xfs"}, want: allowed},
		{
			name: "every secret pair",
			params: merge(secret("provisioner"), secret("controller-publish"), secret("node-stage"), secret("node-publish"),
				secret("controller-expand"), secret("node-expand"), map[string]string{
					"csi.storage.k8s.io/secret-name": "loopvol", "csi.storage.k8s.io/secret-namespace": "loopvol",
				}),
			want: allowed,
		},
		{
			name:   "fsType",
			params: map[string]string{"pool": "default", "fsType": "ext4"},
			want: deniedBy(polClassParams, metav1.StatusReasonInvalid, "has parameters loopvol does not know: fsType",
				"(the filesystem is csi.storage.k8s.io/fstype, all lowercase)"),
		},
		{
			name:   "csi.storage.k8s.io/fsType",
			params: map[string]string{"csi.storage.k8s.io/fsType": "xfs"},
			want:   deniedBy(polClassParams, metav1.StatusReasonInvalid, "does not know: csi.storage.k8s.io/fsType (the filesystem is"),
		},
		{
			name:   "two unknown, sorted",
			params: map[string]string{"zone": "a", "csiProvisionerSecretName": "s", "pool": "default"},
			want: deniedBy(polClassParams, metav1.StatusReasonInvalid, "does not know: csiProvisionerSecretName, zone. loopvol takes pool",
				"csi.storage.k8s.io/*-secret-name and -secret-namespace pairs"),
		},
		{
			name:   "a key the provisioner does not know",
			params: map[string]string{"csi.storage.k8s.io/pvc/name": "x"},
			want:   deniedBy(polClassParams, metav1.StatusReasonInvalid, "does not know: csi.storage.k8s.io/pvc/name"),
		},
		{
			name:   "pool with capitals",
			params: map[string]string{"pool": "Fast"},
			want: deniedBy(polClassParams, metav1.StatusReasonInvalid, `parameter pool "Fast" cannot name a loopvol pool`,
				"DNS-1123 labels"),
		},
		{
			name:   "pool of 64 characters",
			params: map[string]string{"pool": strings.Repeat("a", 64)},
			want:   deniedBy(polClassParams, metav1.StatusReasonInvalid, "cannot name a loopvol pool"),
		},
		{name: "empty pool", params: map[string]string{"pool": ""}, want: deniedBy(polClassParams, metav1.StatusReasonInvalid, `parameter pool ""`)},
		{
			name:   "btrfs",
			params: map[string]string{"csi.storage.k8s.io/fstype": "btrfs"},
			want:   deniedBy(polClassParams, metav1.StatusReasonInvalid, `csi.storage.k8s.io/fstype "btrfs" is not a filesystem loopvol makes; it makes ext4 or xfs`),
		},
		{
			name:   "a secret name without its namespace",
			params: map[string]string{"csi.storage.k8s.io/node-stage-secret-name": "s"},
			want: deniedBy(polClassParams, metav1.StatusReasonInvalid,
				"gives only one of csi.storage.k8s.io/node-stage-secret-name and -namespace."),
		},
		{
			name: "two namespaces without names",
			params: map[string]string{
				"csi.storage.k8s.io/controller-expand-secret-namespace": "s", "csi.storage.k8s.io/provisioner-secret-namespace": "s",
			},
			want: deniedBy(polClassParams, metav1.StatusReasonInvalid,
				"csi.storage.k8s.io/provisioner-secret-name and -namespace, csi.storage.k8s.io/controller-expand-secret-name and -namespace."),
		},
		{name: "another driver's class", provisioner: admOtherDriver, params: map[string]string{"fsType": "btrfs", "pool": "Fast"}, want: allowed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prov := cmp.Or(tc.provisioner, driverName)
			sc := name(fmt.Sprintf("class-%d", i))
			err := a.createClassOf(a.ctx, a.admin, sc, prov, tc.params, nil, false)
			tc.want.check(t, "StorageClass "+sc+" with "+fmt.Sprint(tc.params), err)
		})
	}
	a.warned.take()
}

// createVAC creates a VolumeAttributesClass (a dry run if dryRun) and, if
// it was made, deletes it when the test ends.
func (a *admissionRig) createVAC(ctx context.Context, name, driver string, params map[string]string, dryRun bool) error {
	vac := &storagev1.VolumeAttributesClass{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: a.labels()},
		DriverName: driver,
		Parameters: params,
	}
	opts := metav1.CreateOptions{}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	_, err := a.admin.StorageV1().VolumeAttributesClasses().Create(ctx, vac, opts)
	if err == nil && !dryRun {
		a.t.Cleanup(func() {
			a.cleanupErr(a.t, "VolumeAttributesClass "+name, a.admin.StorageV1().VolumeAttributesClasses().Delete(context.WithoutCancel(a.ctx), name, metav1.DeleteOptions{}))
		})
	}
	return err
}

// testVACParameters: the rules of pkg/controller parseMutable, at the API
// server.
func (a *admissionRig) testVACParameters(t *testing.T) {
	name := func(s string) string { return "e2e-" + a.id + "-" + s }
	a.waitEnforced(t, "a class with an unknown key", deniedBy(polVACParams, metav1.StatusReasonInvalid), func(ctx context.Context) error {
		return a.createVAC(ctx, name("vac-probe"), driverName, map[string]string{"XXX_FakeKey": "v"}, true)
	})
	for i, tc := range []struct {
		name   string
		driver string
		params map[string]string
		want   verdict
	}{
		{name: "thin", params: map[string]string{"preallocate": "false"}, want: allowed},
		{name: "thick in a pool", params: map[string]string{"preallocate": "true", "pool": "fast-nvme"}, want: allowed},
		{
			name:   "unknown keys, sorted",
			params: map[string]string{"zzz": "1", "preAllocate": "true"},
			want: deniedBy(polVACParams, metav1.StatusReasonInvalid,
				"VolumeAttributesClass "+name("vac-2")+" of loopvol.csi.io has parameters loopvol does not know: preAllocate, zzz. loopvol takes preallocate"),
		},
		{
			name:   "io limits",
			params: map[string]string{"ioLimitMiBps": "100", "ioLimitIOPS": "1000"},
			want:   deniedBy(polVACParams, metav1.StatusReasonInvalid, "asks for ioLimitIOPS, ioLimitMiBps, which loopvol cannot enforce", "io.max"),
		},
		{
			name:   "preallocate yes",
			params: map[string]string{"preallocate": "yes"},
			want:   deniedBy(polVACParams, metav1.StatusReasonInvalid, `preallocate "yes" is neither "true"`),
		},
		{
			name:   "preallocate True",
			params: map[string]string{"preallocate": "True"},
			want:   deniedBy(polVACParams, metav1.StatusReasonInvalid, `preallocate "True"`),
		},
		{
			name:   "pool with capitals",
			params: map[string]string{"pool": "Fast"},
			want:   deniedBy(polVACParams, metav1.StatusReasonInvalid, `pool "Fast" cannot name a loopvol pool`, "DNS-1123 labels"),
		},
		{name: "another driver's class", driver: admOtherDriver, params: map[string]string{"XXX_FakeKey": "v", "preallocate": "yes"}, want: allowed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vac := name(fmt.Sprintf("vac-%d", i))
			err := a.createVAC(a.ctx, vac, cmp.Or(tc.driver, driverName), tc.params, false)
			tc.want.check(t, "VolumeAttributesClass "+vac+" with "+fmt.Sprint(tc.params), err)
		})
	}
	a.warned.take()
}

func (a *admissionRig) testStorageClassListed(t *testing.T) {
	unlisted := "e2e-" + a.id + "-unlisted"
	wantWarning := "Validation failed for ValidatingAdmissionPolicy '" + polClassListed + "' with binding '" + polClassListed +
		"': StorageClass " + unlisted + " of loopvol.csi.io is not in storageClasses of ConfigMap loopvol/loopvol-admission"
	var got []string
	err := wait.PollUntilContextTimeout(a.ctx, 100*time.Millisecond, shortWait, true, func(ctx context.Context) (bool, error) {
		a.warned.take()
		if err := a.createClass(ctx, a.admin, unlisted, map[string]string{"pool": "default"}, true); err != nil {
			return false, err
		}
		got = a.warned.take()
		return len(got) > 0, nil
	})
	if err != nil {
		t.Fatalf("no warning for an unlisted loopvol class within %s: %v", shortWait, err)
	}
	if err := a.createClass(a.ctx, a.admin, unlisted, map[string]string{"pool": "default"}, false); err != nil {
		t.Fatalf("an unlisted class is refused, want a warning only: %v", err)
	}
	got = a.warned.take()
	if len(got) != 1 || !strings.HasPrefix(got[0], wantWarning) {
		t.Errorf("warnings for an unlisted class:\n%q\nwant one beginning with\n%q", got, wantWarning)
	}

	// Listed (as an overlay would list it): no warning. The params change
	// reaches the API server asynchronously.
	listed := "e2e-" + a.id + "-listed"
	a.setParam(t, "storageClasses", admBaseClass+", "+listed)
	err = wait.PollUntilContextTimeout(a.ctx, 100*time.Millisecond, shortWait, true, func(ctx context.Context) (bool, error) {
		a.warned.take()
		if err := a.createClass(ctx, a.admin, listed, nil, true); err != nil {
			return false, err
		}
		got = a.warned.take()
		return len(got) == 0, nil
	})
	if err != nil {
		t.Errorf("a listed class still warns %s after it was listed: %q", shortWait, got)
	}
	if err := a.createClassOf(a.ctx, a.admin, "e2e-"+a.id+"-other", admOtherDriver, nil, nil, false); err != nil {
		t.Errorf("another driver's class: %v", err)
	}
	if got := a.warned.take(); len(got) > 0 {
		t.Errorf("another driver's class warns: %q", got)
	}
}

// createVA creates a VolumeAttachment as the attach/detach controller of
// kube-controller-manager would, and asks for a status it must not get:
// create drops it.
func (a *admissionRig) createVA(t *testing.T, c kubernetes.Interface, name, attacher, node string) (*storagev1.VolumeAttachment, error) {
	va := &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: a.labels()},
		Spec: storagev1.VolumeAttachmentSpec{
			Attacher: attacher,
			NodeName: node,
			Source:   storagev1.VolumeAttachmentSource{PersistentVolumeName: ptr.To("e2e-" + a.id + "-pv")},
		},
		Status: storagev1.VolumeAttachmentStatus{Attached: true},
	}
	created, err := c.StorageV1().VolumeAttachments().Create(a.ctx, va, metav1.CreateOptions{})
	if err == nil {
		t.Cleanup(func() {
			a.cleanupErr(t, "VolumeAttachment "+name, a.admin.StorageV1().VolumeAttachments().Delete(context.WithoutCancel(a.ctx), name, metav1.DeleteOptions{}))
		})
	}
	return created, err
}

// patchVAStatus merge-patches the status subresource, as the sidecar does.
func (a *admissionRig) patchVAStatus(ctx context.Context, c kubernetes.Interface, name, patch string, dryRun bool) error {
	opts := metav1.PatchOptions{}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	_, err := c.StorageV1().VolumeAttachments().Patch(ctx, name, types.MergePatchType, []byte(patch), opts, "status")
	return err
}

func (a *admissionRig) attached(t *testing.T, name string) bool {
	t.Helper()
	va, err := a.admin.StorageV1().VolumeAttachments().Get(a.ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get VolumeAttachment %s: %v", name, err)
	}
	return va.Status.Attached
}

func (a *admissionRig) testVolumeAttachmentStatus(t *testing.T) {
	ctx := a.ctx
	nodeA, nodeB := "e2e-"+a.id+"-node-a", "e2e-"+a.id+"-node-b"
	sidecarA := a.nodeSidecar(t, nodeA)
	kcm := admClient(t, a.env.UserConfig(t, admAttachDetach))

	// kube-controller-manager's part, untouched by the policy.
	vaA, vaB, vaOther := "e2e-"+a.id+"-attach-a", "e2e-"+a.id+"-attach-b", "e2e-"+a.id+"-attach-other"
	for _, va := range []struct{ name, attacher, node string }{{vaA, driverName, nodeA}, {vaB, driverName, nodeB}, {vaOther, admOtherDriver, nodeA}} {
		created, err := a.createVA(t, kcm, va.name, va.attacher, va.node)
		allowed.check(t, "the attach/detach controller creates VolumeAttachment "+va.name, err)
		if err != nil {
			t.FailNow()
		}
		// The premise of matching only the status subresource.
		if created.Status.Attached {
			t.Fatalf("VolumeAttachment %s was created with attached=true: a create can set the status, which the policy does not match", va.name)
		}
	}

	attach := `{"status":{"attached":true,"attachmentMetadata":{"loopvol.csi.io/node":"x"}}}`
	forged := deniedBy(polVAStatus, metav1.StatusReasonForbidden,
		"only loopvol's sidecar may change the status of VolumeAttachment "+vaA+": it says whether the volume is attached to node "+nodeA,
		a.adminName+" is in neither controllerUsers nor nodeUsers of ConfigMap loopvol/loopvol-admission.")
	a.waitEnforced(t, "the administrator marks a loopvol volume attached", forged, func(ctx context.Context) error {
		return a.patchVAStatus(ctx, a.admin, vaA, attach, true)
	})
	forged.check(t, "the administrator marks a loopvol volume attached", a.patchVAStatus(ctx, a.admin, vaA, attach, false))
	if a.attached(t, vaA) {
		t.Errorf("VolumeAttachment %s is attached after a refused status patch", vaA)
	}

	// The premise again: an update of the object itself keeps the old status.
	va, err := a.admin.StorageV1().VolumeAttachments().Get(ctx, vaA, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	va.Status.Attached = true
	va.Annotations = map[string]string{"e2e.loopvol.csi.io/touched": "yes"}
	_, err = a.admin.StorageV1().VolumeAttachments().Update(ctx, va, metav1.UpdateOptions{})
	allowed.check(t, "the administrator updates VolumeAttachment "+vaA+" itself", err)
	if a.attached(t, vaA) {
		t.Fatalf("an update of VolumeAttachment %s itself set attached=true: the policy does not match that", vaA)
	}

	allowed.check(t, "the administrator marks another driver's volume attached", a.patchVAStatus(ctx, a.admin, vaOther, attach, false))

	// The central sidecar: any node.
	allowed.check(t, "the controller sidecar attaches on "+nodeA, a.patchVAStatus(ctx, a.controller, vaA, attach, false))
	allowed.check(t, "the controller sidecar attaches on "+nodeB, a.patchVAStatus(ctx, a.controller, vaB, attach, false))
	if !a.attached(t, vaA) || !a.attached(t, vaB) {
		t.Errorf("the controller sidecar's status patches did not land")
	}
	detach := `{"status":{"attached":false,"attachmentMetadata":null}}`
	forged.check(t, "the administrator marks a loopvol volume detached", a.patchVAStatus(ctx, a.admin, vaA, detach, false))
	allowed.check(t, "the controller sidecar detaches on "+nodeB, a.patchVAStatus(ctx, a.controller, vaB, detach, false))

	// A node's sidecar (distributed overlay): its own node only.
	allowed.check(t, "the sidecar of "+nodeA+" detaches on its node", a.patchVAStatus(ctx, sidecarA, vaA, detach, false))
	allowed.check(t, "the sidecar of "+nodeA+" attaches on its node", a.patchVAStatus(ctx, sidecarA, vaA, attach, false))
	deniedBy(polVAStatus, metav1.StatusReasonForbidden,
		"VolumeAttachment "+vaB+" is on node "+nodeB+"; the sidecar of node "+nodeA+" changes only the status of its own node's VolumeAttachments.",
	).check(t, "the sidecar of "+nodeA+" attaches on "+nodeB, a.patchVAStatus(ctx, sidecarA, vaB, attach, false))
	deniedBy(polVAStatus, metav1.StatusReasonForbidden,
		"system:serviceaccount:loopvol:loopvol-node is one of nodeUsers",
		"but its credentials are bound to no node (no authentication.kubernetes.io/node-name): it needs a Pod-bound ServiceAccount token.",
	).check(t, "loopvol-node with a token bound to no Pod", a.patchVAStatus(ctx, a.saClient(t, admNode, nil), vaA, detach, false))
	if a.attached(t, vaB) {
		t.Errorf("VolumeAttachment %s is attached after refused status patches", vaB)
	}

	// kube-controller-manager deletes what it created.
	for _, name := range []string{vaA, vaB, vaOther} {
		allowed.check(t, "the attach/detach controller deletes VolumeAttachment "+name, kcm.StorageV1().VolumeAttachments().Delete(ctx, name, metav1.DeleteOptions{}))
	}
}

// capacityObject is a CSIStorageCapacity as the sidecar makes it, in
// namespace ns; managedBy "" leaves out both of loopvol's labels.
func (a *admissionRig) capacityObject(ns, managedBy, class string) *storagev1.CSIStorageCapacity {
	labels := a.labels()
	if managedBy != "" {
		labels[capacity.DriverNameLabel] = driverName
		labels[capacity.ManagedByLabel] = managedBy
	}
	return &storagev1.CSIStorageCapacity{
		ObjectMeta:        metav1.ObjectMeta{GenerateName: capacity.GenerateName, Namespace: ns, Labels: labels},
		StorageClassName:  class,
		NodeTopology:      &metav1.LabelSelector{MatchLabels: map[string]string{admZoneKey: "e2e-" + a.id}},
		Capacity:          resource.NewQuantity(1<<30, resource.BinarySI),
		MaximumVolumeSize: resource.NewQuantity(1<<30, resource.BinarySI),
	}
}

// createCapacity creates obj as c (deleteCapacityObjects removes it at the
// end: it carries the test's label).
func (a *admissionRig) createCapacity(c kubernetes.Interface, obj *storagev1.CSIStorageCapacity) (*storagev1.CSIStorageCapacity, error) {
	return c.StorageV1().CSIStorageCapacities(obj.Namespace).Create(a.ctx, obj, metav1.CreateOptions{})
}

func (a *admissionRig) patchCapacity(c kubernetes.Interface, o *storagev1.CSIStorageCapacity, patch string) error {
	_, err := c.StorageV1().CSIStorageCapacities(o.Namespace).Patch(a.ctx, o.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	return err
}

func (a *admissionRig) deleteCapacity(c kubernetes.Interface, o *storagev1.CSIStorageCapacity) error {
	return c.StorageV1().CSIStorageCapacities(o.Namespace).Delete(a.ctx, o.Name, metav1.DeleteOptions{})
}

// mustCapacity creates obj as c, which must be allowed.
func (a *admissionRig) mustCapacity(t *testing.T, what string, c kubernetes.Interface, obj *storagev1.CSIStorageCapacity) *storagev1.CSIStorageCapacity {
	t.Helper()
	created, err := a.createCapacity(c, obj)
	allowed.check(t, what, err)
	if err != nil {
		t.FailNow()
	}
	return created
}

func (a *admissionRig) testCapacityWriters(t *testing.T) {
	unlisted := "e2e-" + a.id + "-unlisted" // a loopvol class the params do not list
	central := a.capacityObject(admNamespace, capacity.ManagedByCentral, admBaseClass)
	central.OwnerReferences = []metav1.OwnerReference{{
		APIVersion: "apps/v1", Kind: "StatefulSet", Name: "loopvol-controller", UID: types.UID("e2e-" + a.id), Controller: ptr.To(true),
	}}

	refused := func(verb, class string) verdict {
		return deniedBy(polCapacity, metav1.StatusReasonForbidden, "only loopvol's sidecar may "+verb+" CSIStorageCapacity ",
			" of StorageClass "+class+": the scheduler places Pods by it. "+a.adminName+
				" is in none of controllerUsers, nodeUsers and controlPlaneUsers of ConfigMap loopvol/loopvol-admission.")
	}
	a.waitEnforced(t, "the administrator creates a loopvol object", refused("create", admBaseClass), func(ctx context.Context) error {
		_, err := a.admin.StorageV1().CSIStorageCapacities(admNamespace).Create(ctx, central.DeepCopy(), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	})

	// The central sidecar: create, update, delete.
	obj := a.mustCapacity(t, "the controller sidecar creates an object", a.controller, central.DeepCopy())
	allowed.check(t, "the controller sidecar updates its figures", a.patchCapacity(a.controller, obj, `{"capacity":"2Gi","maximumVolumeSize":"1Gi"}`))
	labelled := a.mustCapacity(t, "the controller sidecar creates an object of an unlisted class",
		a.controller, a.capacityObject(admNamespace, capacity.ManagedByCentral, unlisted))

	// Everyone else.
	_, err := a.createCapacity(a.admin, central.DeepCopy())
	refused("create", admBaseClass).check(t, "the administrator creates a labelled object", err)
	_, err = a.createCapacity(a.admin, a.capacityObject(a.env.Namespace(t), "", admBaseClass))
	refused("create", admBaseClass).check(t, "the administrator creates an unlabelled object of a listed class elsewhere", err)
	refused("update", admBaseClass).check(t, "the administrator raises the capacity", a.patchCapacity(a.admin, obj, `{"capacity":"1Ti"}`))
	refused("update", unlisted).check(t, "the administrator takes loopvol's label off",
		a.patchCapacity(a.admin, labelled, `{"metadata":{"labels":{"csi.storage.k8s.io/drivername":null}}}`))
	refused("delete", admBaseClass).check(t, "the administrator deletes the sidecar's object", a.deleteCapacity(a.admin, obj))
	foreign := a.capacityObject(admNamespace, "", unlisted)
	foreign.Labels[capacity.DriverNameLabel] = admOtherDriver
	foreignObj, err := a.createCapacity(a.admin, foreign)
	allowed.check(t, "the administrator creates another driver's object", err)
	if err == nil {
		allowed.check(t, "the administrator updates another driver's object", a.patchCapacity(a.admin, foreignObj, `{"capacity":"3Gi"}`))
		refused("update", unlisted).check(t, "the administrator puts loopvol's label on another driver's object",
			a.patchCapacity(a.admin, foreignObj, `{"metadata":{"labels":{"csi.storage.k8s.io/drivername":"loopvol.csi.io"}}}`))
	}

	// The garbage collector: metadata and deletes only.
	gc := admClient(t, a.env.UserConfig(t, admGC))
	allowed.check(t, "the garbage collector orphans the object", a.patchCapacity(gc, obj, `{"metadata":{"ownerReferences":null}}`))
	deniedBy(polCapacity, metav1.StatusReasonForbidden, admGC+" is one of controlPlaneUsers",
		"never create them or change their class, topology, figures or labels.",
	).check(t, "the garbage collector changes the capacity", a.patchCapacity(gc, obj, `{"capacity":"1Ti"}`))
	allowed.check(t, "the garbage collector deletes an object", a.deleteCapacity(gc, obj))
	allowed.check(t, "the controller sidecar deletes an object", a.deleteCapacity(a.controller, labelled))

	// A node's sidecar (distributed overlay): its own node's objects, by
	// the managed-by value the sidecar computes, also where that value is
	// shortened (node names of 43 to 52 characters keep the name, longer
	// ones only a hash).
	short := "e2e-" + a.id + "-cap"
	nodes := []string{short}
	for _, n := range []int{43, 52, 53, 60} {
		prefix := "e2e-" + a.id + "-cap-"
		nodes = append(nodes, prefix+strings.Repeat("n", n-len(prefix)))
	}
	var own *storagev1.CSIStorageCapacity
	for _, node := range nodes {
		t.Run(fmt.Sprintf("node name of %d characters", len(node)), func(t *testing.T) {
			c := a.nodeSidecar(t, node)
			id := capacity.ManagedByID(node)
			o := a.mustCapacity(t, "the sidecar of "+node+" creates its object ("+id+")", c, a.capacityObject(admNamespace, id, admBaseClass))
			allowed.check(t, "the sidecar of "+node+" updates its object", a.patchCapacity(c, o, `{"capacity":"5Gi"}`))
			allowed.check(t, "the sidecar of "+node+" deletes its object", a.deleteCapacity(c, o))
			if node == short {
				own = a.mustCapacity(t, "the sidecar of "+node+" creates its object", c, a.capacityObject(admNamespace, id, admBaseClass))
			}
		})
	}
	if own == nil {
		t.FailNow()
	}
	sidecar := a.nodeSidecar(t, "e2e-"+a.id+"-cap-other")
	other := "e2e-" + a.id + "-cap-other"
	notMine := deniedBy(polCapacity, metav1.StatusReasonForbidden, " is not node "+other+"'s: the sidecar of a node writes only objects labelled csi.storage.k8s.io/managed-by=external-provisioner-"+other)
	_, err = a.createCapacity(sidecar, a.capacityObject(admNamespace, capacity.ManagedByCentral, admBaseClass))
	notMine.check(t, "a node's sidecar creates a central object", err)
	notMine.check(t, "a node's sidecar updates another node's object", a.patchCapacity(sidecar, own, `{"capacity":"0"}`))
	notMine.check(t, "a node's sidecar deletes another node's object", a.deleteCapacity(sidecar, own))
	mine := a.mustCapacity(t, "the sidecar of "+other+" creates its object", sidecar, a.capacityObject(admNamespace, capacity.ManagedByID(other), admBaseClass))
	notMine.check(t, "a node's sidecar hands its object to another node",
		a.patchCapacity(sidecar, mine, fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, capacity.ManagedByLabel, capacity.ManagedByID(short))))
	_, err = a.createCapacity(a.saClient(t, admNode, nil), a.capacityObject(admNamespace, capacity.ManagedByID(other), admBaseClass))
	deniedBy(polCapacity, metav1.StatusReasonForbidden, "is one of nodeUsers, which write only their own node's objects, but its credentials are bound to no node").
		check(t, "loopvol-node with a token bound to no Pod creates an object", err)
}

// createPVC creates a claim as a dry run: a PVC cannot be deleted here
// (nothing removes its kubernetes.io/pvc-protection finalizer), and a dry
// run passes every admission plugin, DefaultStorageClass included.
func (a *admissionRig) createPVC(ctx context.Context, ns, class string, mode corev1.PersistentVolumeMode, modes ...corev1.PersistentVolumeAccessMode) error {
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "e2e-" + a.id + "-claim", Namespace: ns, Labels: a.labels()},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: modes,
			VolumeMode:  ptr.To(mode),
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		},
	}
	if class != "" {
		pvc.Spec.StorageClassName = ptr.To(class)
	}
	_, err := a.admin.CoreV1().PersistentVolumeClaims(ns).Create(ctx, pvc, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	return err
}

func (a *admissionRig) testPVCAccessModes(t *testing.T) {
	ns := a.env.Namespace(t)
	rwxFs := func(class string) verdict {
		return deniedBy(polPVCModes, metav1.StatusReasonInvalid,
			"PersistentVolumeClaim e2e-"+a.id+"-claim of StorageClass "+class+" asks for ReadWriteMany with volumeMode Filesystem, which loopvol.csi.io cannot serve",
			"neither may be mounted by two nodes at once. loopvol offers ReadWriteMany only with volumeMode: Block")
	}
	a.waitEnforced(t, "ReadWriteMany filesystem of the base's class", rwxFs(admBaseClass), func(ctx context.Context) error {
		return a.createPVC(ctx, ns, admBaseClass, corev1.PersistentVolumeFilesystem, corev1.ReadWriteMany)
	})
	const (
		fs    = corev1.PersistentVolumeFilesystem
		block = corev1.PersistentVolumeBlock
		rwo   = corev1.ReadWriteOnce
		rwop  = corev1.ReadWriteOncePod
		rox   = corev1.ReadOnlyMany
		rwx   = corev1.ReadWriteMany
	)
	other := "e2e-" + a.id + "-other"
	for _, tc := range []struct {
		name  string
		class string
		mode  corev1.PersistentVolumeMode
		modes []corev1.PersistentVolumeAccessMode
		want  verdict
	}{
		{name: "ReadWriteOnce filesystem", class: admBaseClass, mode: fs, modes: []corev1.PersistentVolumeAccessMode{rwo}, want: allowed},
		{name: "ReadWriteOncePod filesystem", class: admBaseClass, mode: fs, modes: []corev1.PersistentVolumeAccessMode{rwop}, want: allowed},
		{name: "ReadOnlyMany filesystem", class: admBaseClass, mode: fs, modes: []corev1.PersistentVolumeAccessMode{rox}, want: allowed},
		{name: "ReadWriteMany block", class: admBaseClass, mode: block, modes: []corev1.PersistentVolumeAccessMode{rwx}, want: allowed},
		{name: "ReadWriteMany filesystem", class: admBaseClass, mode: fs, modes: []corev1.PersistentVolumeAccessMode{rwx}, want: rwxFs(admBaseClass)},
		{name: "ReadWriteOnce and ReadWriteMany filesystem", class: admBaseClass, mode: fs, modes: []corev1.PersistentVolumeAccessMode{rwo, rwx}, want: rwxFs(admBaseClass)},
		{name: "another class, ReadWriteMany filesystem", class: other, mode: fs, modes: []corev1.PersistentVolumeAccessMode{rwx}, want: allowed},
		{name: "no class and no default class", mode: fs, modes: []corev1.PersistentVolumeAccessMode{rwx}, want: allowed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.want.check(t, tc.name, a.createPVC(a.ctx, ns, tc.class, tc.mode, tc.modes...))
		})
	}

	// A claim naming no class gets the default class's name from the
	// DefaultStorageClass admission plugin before any validating policy
	// runs; a loopvol default class (listed, as an overlay would) is thus
	// checked as well.
	def := "e2e-" + a.id + "-default"
	a.setParam(t, "storageClasses", admBaseClass+","+def)
	if err := a.createClassOf(a.ctx, a.admin, def, driverName, nil, map[string]string{"storageclass.kubernetes.io/is-default-class": "true"}, false); err != nil {
		t.Fatalf("create the default class: %v", err)
	}
	a.waitEnforced(t, "ReadWriteMany filesystem of no class, loopvol's default", rwxFs(def), func(ctx context.Context) error {
		return a.createPVC(ctx, ns, "", fs, rwx)
	})
	allowed.check(t, "ReadWriteMany block of no class, loopvol's default", a.createPVC(a.ctx, ns, "", block, rwx))
	// Gone before the next test: a default class changes every claim.
	if err := a.admin.StorageV1().StorageClasses().Delete(a.ctx, def, metav1.DeleteOptions{}); err != nil {
		t.Errorf("delete the default class: %v", err)
	}
}

// testParamsMissing deletes the params object and checks each binding's
// parameterNotFoundAction: the guards of VolumeAttachment status and
// CSIStorageCapacity fail closed (the sidecar is refused too), the claim
// check and the class warning step aside.
func (a *admissionRig) testParamsMissing(t *testing.T) {
	ctx := a.ctx
	if err := a.admin.CoreV1().ConfigMaps(admNamespace).Delete(ctx, admParams, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	kcm := admClient(t, a.env.UserConfig(t, admAttachDetach))
	va := "e2e-" + a.id + "-va-params"
	if _, err := a.createVA(t, kcm, va, driverName, "e2e-"+a.id+"-node"); err != nil {
		t.Fatal(err)
	}
	noParams := func(policy string) verdict {
		return deniedBy(policy, metav1.StatusReasonInvalid, "failed to configure binding: no params found for policy binding with `Deny` parameterNotFoundAction")
	}
	a.waitEnforced(t, "the controller sidecar attaches without params", noParams(polVAStatus), func(ctx context.Context) error {
		return a.patchVAStatus(ctx, a.controller, va, `{"status":{"attached":true}}`, true)
	})
	_, err := a.controller.StorageV1().CSIStorageCapacities(admNamespace).Create(ctx,
		a.capacityObject(admNamespace, capacity.ManagedByCentral, admBaseClass), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	noParams(polCapacity).check(t, "the controller sidecar creates a capacity object without params", err)

	// The base's class is no longer known to be loopvol's: the claim check
	// lets everything through rather than stopping claims.
	ns := a.env.Namespace(t)
	allowed.check(t, "ReadWriteMany filesystem of the base's class without params",
		a.createPVC(ctx, ns, admBaseClass, corev1.PersistentVolumeFilesystem, corev1.ReadWriteMany))
	a.warned.take()
	allowed.check(t, "a loopvol class without params", a.createClass(ctx, a.admin, "e2e-"+a.id+"-noparams", nil, true))
	if got := a.warned.take(); len(got) > 0 {
		t.Errorf("a loopvol class without params warns: %q", got)
	}
}
