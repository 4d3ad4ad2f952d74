package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/loopvol/loopvol/internal/harness/testenv"
)

// deployDirs are the kustomizations a user applies: the base and every
// overlay, and each component on the base ("base+components/<name>").
var deployDirs = []string{"base", "overlays/local", "overlays/dev", "overlays/shared", "overlays/distributed",
	"base+components/upstream-attacher", "overlays/shared+components/fencing"}

// renderDeploy renders deploy/kubernetes/<dir> with kustomize's library,
// as `kubectl apply -k` would, and returns its objects. A dir of the form
// "<resource>+<component>" is rendered through a kustomization of its own
// that lists both, as a user's overlay would.
func renderDeploy(t *testing.T, dir string) []*unstructured.Unstructured {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(root, "deploy", "kubernetes", dir)
	if resource, component, ok := strings.Cut(dir, "+"); ok {
		// Beside the others: kustomize loads no file from outside its
		// root, but relative directories are kustomizations of their own.
		path = filepath.Join(t.TempDir(), "overlay")
		k := fmt.Sprintf("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - %s\ncomponents:\n  - %s\n",
			relTo(t, path, filepath.Join(root, "deploy", "kubernetes", resource)),
			relTo(t, path, filepath.Join(root, "deploy", "kubernetes", component)))
		if err := os.MkdirAll(path, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(path, "kustomization.yaml"), []byte(k), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	res, err := k.Run(filesys.MakeFsOnDisk(), path)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	var objs []*unstructured.Unstructured
	for _, r := range res.Resources() {
		m, err := r.Map()
		if err != nil {
			t.Fatalf("%s: %v", dir, err)
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
	return objs
}

func relTo(t *testing.T, from, to string) string {
	t.Helper()
	rel, err := filepath.Rel(from, to)
	if err != nil {
		t.Fatal(err)
	}
	return rel
}

// warnings collects the warnings the API server sends one client
// (deprecated or unknown fields, admission policies in Warn mode).
type warnings struct {
	mu   sync.Mutex
	list []string
}

func (w *warnings) HandleWarningHeader(code int, agent, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.list = append(w.list, text)
}

// take returns the warnings received since the last call.
func (w *warnings) take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := w.list
	w.list = nil
	return out
}

// TestDeployApplies renders the base and every overlay with kustomize and
// applies each to the real kube-apiserver with server-side apply, twice:
// no error, no warning, no conflict, and the second apply changes nothing
// (every object keeps its resourceVersion). Objects other than the
// namespace are deleted after each kustomization (a namespace cannot be
// deleted without kube-controller-manager).
func TestDeployApplies(t *testing.T) {
	env := cluster.Env(t)
	_, ctx := contextFor(t)
	a := newApplier(t, env.Config)
	for _, dir := range deployDirs {
		t.Run(dir, func(t *testing.T) {
			objs := renderDeploy(t, dir)
			t.Cleanup(func() {
				ctx := context.WithoutCancel(ctx)
				for _, o := range slices.Backward(objs) {
					if o.GetKind() == "Namespace" {
						continue
					}
					if err := a.delete(ctx, o); err != nil {
						t.Errorf("cleanup: %v", err)
					}
				}
				waitAdmissionPoliciesGone(t, ctx, env)
			})
			apply := func(round int) map[string]string {
				t.Helper()
				versions := map[string]string{}
				for _, o := range objs {
					key := fmt.Sprintf("%s %s/%s", o.GetKind(), o.GetNamespace(), o.GetName())
					out, err := a.apply(ctx, o)
					if err != nil {
						t.Fatalf("apply %d of %s: %s: %v", round, dir, key, err)
					}
					versions[key] = out.GetResourceVersion()
				}
				if w := a.warnings.take(); len(w) > 0 {
					t.Errorf("apply %d of %s: the API server warned:\n%s", round, dir, strings.Join(w, "\n"))
				}
				return versions
			}
			first := apply(1)
			second := apply(2)
			for key, rv := range first {
				if second[key] != rv {
					t.Errorf("the second apply of %s changed %s (resourceVersion %s → %s)", dir, key, rv, second[key])
				}
			}
			t.Logf("%s: %d objects applied twice, no warning, nothing changed the second time", dir, len(objs))
		})
	}
}

// applier applies rendered objects with server-side apply, as
// `kubectl apply --server-side` does, and collects the API server's
// warnings.
type applier struct {
	t        *testing.T
	dyn      dynamic.Interface
	mapper   meta.RESTMapper
	warnings *warnings
}

func newApplier(t *testing.T, base *rest.Config) *applier {
	t.Helper()
	cfg := rest.CopyConfig(base)
	cfg.QPS, cfg.Burst = 500, 1000
	a := &applier{t: t, warnings: &warnings{}}
	cfg.WarningHandler = a.warnings
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	disc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	a.dyn = dyn
	a.mapper = restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disc))
	return a
}

func (a *applier) resource(o *unstructured.Unstructured) (dynamic.ResourceInterface, error) {
	gvk := o.GroupVersionKind()
	m, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", gvk, o.GetName(), err)
	}
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		return a.dyn.Resource(m.Resource).Namespace(o.GetNamespace()), nil
	}
	return a.dyn.Resource(m.Resource), nil
}

// apply applies o (field manager loopvol-deploy, no forced conflicts).
func (a *applier) apply(ctx context.Context, o *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	res, err := a.resource(o)
	if err != nil {
		return nil, err
	}
	data, err := o.MarshalJSON()
	if err != nil {
		return nil, err
	}
	return res.Patch(ctx, o.GetName(), types.ApplyPatchType, data, metav1.PatchOptions{FieldManager: "loopvol-deploy", Force: ptrTo(false)})
}

// delete deletes o; it is not an error when o is gone.
func (a *applier) delete(ctx context.Context, o *unstructured.Unstructured) error {
	res, err := a.resource(o)
	if err != nil {
		return err
	}
	if err := res.Delete(ctx, o.GetName(), metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete %s %s: %w", o.GetKind(), o.GetName(), err)
	}
	return nil
}

func ptrTo[T any](v T) *T { return &v }

// waitAdmissionPoliciesGone waits until the API server no longer enforces
// the deployment's admission policies after their bindings were deleted
// (its policy informer lags): the tests after this one write VolumeAttachment
// status as users the policies would refuse. The API server drops all
// bindings through one informer, so a class the parameter policy refuses
// passing a dry run stands for all of them.
func waitAdmissionPoliciesGone(t *testing.T, ctx context.Context, env *testenv.Env) {
	t.Helper()
	bad := &storagev1.StorageClass{
		ObjectMeta:  metav1.ObjectMeta{Name: "e2e-deploy-policy-probe"},
		Provisioner: driverName,
		Parameters:  map[string]string{"no-such-parameter": "x"},
	}
	var last error
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, shortWait, true, func(ctx context.Context) (bool, error) {
		_, last = env.Client.StorageV1().StorageClasses().Create(ctx, bad, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return last == nil, nil
	})
	if err != nil {
		t.Errorf("cleanup: the admission policies are still enforced %s after their bindings were deleted: %v", shortWait, last)
	}
}

// contextFor is a context that ends with the test, with a logger.
func contextFor(t *testing.T) (context.CancelFunc, context.Context) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return cancel, ctx
}
