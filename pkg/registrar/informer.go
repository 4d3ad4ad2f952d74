package registrar

import (
	"context"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	"github.com/loopvol/loopvol/internal/kube"
)

// namedInformer is an informer over the one object called name: its list
// and watch carry the field selector metadata.name=name, so a registrar on
// each node caches its own CSINode, not every node's (and RBAC could limit
// a rule to that name: resourceNames applies to such a list or watch).
// Handlers still check the name: a fake clientset ignores field selectors.
func namedInformer(client kube.Client, example runtime.Object, name string,
	list func(context.Context, metav1.ListOptions) (runtime.Object, error),
	watchFunc func(context.Context, metav1.ListOptions) (watch.Interface, error)) cache.SharedIndexInformer {
	sel := fields.OneTermEqualSelector(metav1.ObjectNameField, name).String()
	lw := cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = sel
			return list(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = sel
			return watchFunc(ctx, o)
		},
	}, client)
	inf := cache.NewSharedIndexInformerWithOptions(lw, example, cache.SharedIndexInformerOptions{})
	_ = inf.SetTransform(kube.StripForCache) // fails only once the informer runs
	return inf
}
