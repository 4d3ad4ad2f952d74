package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/loopvol/loopvol/internal/testenv"
)

// deployDirs are the kustomizations a user applies: the base and every
// overlay.
var deployDirs = []string{"base", "overlays/local", "overlays/dev", "overlays/shared", "overlays/distributed"}

// renderDeploy renders deploy/kubernetes/<dir> with kustomize's library,
// as `kubectl apply -k` would, and returns its objects.
func renderDeploy(t *testing.T, dir string) []*unstructured.Unstructured {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	res, err := k.Run(filesys.MakeFsOnDisk(), filepath.Join(root, "deploy", "kubernetes", dir))
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

// warnings collects the API server's warnings (deprecated fields, unknown
// fields, ...) of one client.
type warnings struct {
	mu   sync.Mutex
	list []string
}

func (w *warnings) HandleWarningHeader(code int, agent, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.list = append(w.list, text)
}

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
	cfg := rest.CopyConfig(env.Config)
	cfg.QPS, cfg.Burst = 500, 1000
	warn := &warnings{}
	cfg.WarningHandler = warn
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	disc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disc))

	for _, dir := range deployDirs {
		t.Run(dir, func(t *testing.T) {
			objs := renderDeploy(t, dir)
			resource := func(o *unstructured.Unstructured) dynamic.ResourceInterface {
				t.Helper()
				gvk := o.GroupVersionKind()
				m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
				if err != nil {
					t.Fatalf("%s %s: %v", gvk, o.GetName(), err)
				}
				if m.Scope.Name() == meta.RESTScopeNameNamespace {
					return dyn.Resource(m.Resource).Namespace(o.GetNamespace())
				}
				return dyn.Resource(m.Resource)
			}
			t.Cleanup(func() {
				ctx := context.WithoutCancel(ctx)
				for _, o := range slices.Backward(objs) {
					if o.GetKind() == "Namespace" {
						continue
					}
					err := resource(o).Delete(ctx, o.GetName(), metav1.DeleteOptions{})
					if err != nil && !apierrors.IsNotFound(err) {
						t.Errorf("cleanup: delete %s %s: %v", o.GetKind(), o.GetName(), err)
					}
				}
			})
			apply := func(round int) map[string]string {
				t.Helper()
				versions := map[string]string{}
				for _, o := range objs {
					data, err := o.MarshalJSON()
					if err != nil {
						t.Fatal(err)
					}
					out, err := resource(o).Patch(ctx, o.GetName(), types.ApplyPatchType, data,
						metav1.PatchOptions{FieldManager: "loopvol-deploy", Force: ptrTo(false)})
					key := fmt.Sprintf("%s %s/%s", o.GetKind(), o.GetNamespace(), o.GetName())
					if err != nil {
						t.Fatalf("apply %d of %s: %s: %v", round, dir, key, err)
					}
					versions[key] = out.GetResourceVersion()
				}
				if w := warn.take(); len(w) > 0 {
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

func ptrTo[T any](v T) *T { return &v }

// contextFor is a context that ends with the test, with a logger.
func contextFor(t *testing.T) (context.CancelFunc, context.Context) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return cancel, ctx
}
