package capacity

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
)

// MetadataGetter reads the metadata of one object of any kind.
type MetadataGetter interface {
	// Get returns the metadata of the object apiVersion/kind namespace/name.
	// It is an error (NotFound) when the object does not exist.
	Get(ctx context.Context, apiVersion, kind, namespace, name string) (*metav1.PartialObjectMetadata, error)
}

// errNoController is the error of an object on the ownership chain that
// has no controlling owner.
var errNoController = errors.New("has no controlling owner, so the chain cannot go further up")

// LookupOwner walks up the ownership chain from the Pod podName in
// namespace, levels steps: 0 is the Pod itself, 1 its controlling owner
// (a StatefulSet or DaemonSet), 2 that owner's controlling owner (the
// Deployment of a ReplicaSet), and so on. It returns a controlling
// reference to the object reached. Like upstream it reads every object on
// the way but the last: level 1 needs only pods get, level 2 also the
// ReplicaSet's.
func LookupOwner(ctx context.Context, g MetadataGetter, namespace, podName string, levels int) (*metav1.OwnerReference, error) {
	if levels < 0 {
		return nil, nil
	}
	apiVersion, kind, name := "v1", "Pod", podName
	for level := 0; ; level++ {
		md, err := g.Get(ctx, apiVersion, kind, namespace, name)
		if err != nil {
			return nil, fmt.Errorf("get %s %s/%s: %w", kind, namespace, name, err)
		}
		if level == levels {
			return controllerRef(apiVersion, kind, name, string(md.UID)), nil
		}
		owner := metav1.GetControllerOfNoCopy(md)
		if owner == nil {
			return nil, fmt.Errorf("%s %s/%s %w (%d levels up from Pod %s asked for)", kind, namespace, name, errNoController, levels, podName)
		}
		if level+1 == levels {
			return controllerRef(owner.APIVersion, owner.Kind, owner.Name, string(owner.UID)), nil
		}
		apiVersion, kind, name = owner.APIVersion, owner.Kind, owner.Name
	}
}

func controllerRef(apiVersion, kind, name, uid string) *metav1.OwnerReference {
	return &metav1.OwnerReference{APIVersion: apiVersion, Kind: kind, Name: name, UID: types.UID(uid), Controller: ptr.To(true)}
}

// OwnerLookup is an OwnerFunc that runs LookupOwner, and retries it while
// the API server fails in a way that may pass (not a missing object, a
// refusal or a chain without an owner), with backoff from 1 s to 30 s.
func OwnerLookup(g MetadataGetter, namespace, podName string, levels int) OwnerFunc {
	return func(ctx context.Context) (*metav1.OwnerReference, error) {
		delay := time.Second
		for {
			ref, err := LookupOwner(ctx, g, namespace, podName, levels)
			if err == nil || !retriable(err) {
				return ref, err
			}
			klog.FromContext(ctx).Error(err, "Could not look up the owner of the CSIStorageCapacity objects, will retry", "retryAfter", delay)
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(delay):
			}
			delay = min(2*delay, 30*time.Second)
		}
	}
}

func retriable(err error) bool {
	switch {
	case errors.Is(err, errNoController), apierrors.IsNotFound(err), apierrors.IsForbidden(err),
		apierrors.IsUnauthorized(err), apierrors.IsBadRequest(err), apierrors.IsInvalid(err):
		return false
	}
	return true
}

// wellKnown maps the owners of Pods to their resources, so the walk needs
// no discovery for them.
var wellKnown = map[schema.GroupVersionKind]string{
	{Version: "v1", Kind: "Pod"}:                        "pods",
	{Group: "apps", Version: "v1", Kind: "ReplicaSet"}:  "replicasets",
	{Group: "apps", Version: "v1", Kind: "Deployment"}:  "deployments",
	{Group: "apps", Version: "v1", Kind: "StatefulSet"}: "statefulsets",
	{Group: "apps", Version: "v1", Kind: "DaemonSet"}:   "daemonsets",
	{Group: "batch", Version: "v1", Kind: "Job"}:        "jobs",
	{Group: "batch", Version: "v1", Kind: "CronJob"}:    "cronjobs",
}

// metadataGetter reads object metadata with the metadata client, finding
// the resource of a kind that is not well known through discovery.
type metadataGetter struct {
	client    metadata.Interface
	discovery discovery.DiscoveryInterface
}

// NewMetadataGetter returns a MetadataGetter that uses rc.
func NewMetadataGetter(rc *rest.Config) (MetadataGetter, error) {
	client, err := metadata.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("create the Kubernetes metadata client: %w", err)
	}
	disc, err := discovery.NewDiscoveryClientForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("create the Kubernetes discovery client: %w", err)
	}
	return metadataGetter{client: client, discovery: disc}, nil
}

func (g metadataGetter) Get(ctx context.Context, apiVersion, kind, namespace, name string) (*metav1.PartialObjectMetadata, error) {
	gv, err := schema.ParseGroupVersion(apiVersion)
	if err != nil {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("apiVersion %q: %v", apiVersion, err))
	}
	resource, ok := wellKnown[gv.WithKind(kind)]
	if !ok {
		list, err := g.discovery.ServerResourcesForGroupVersion(apiVersion)
		if err != nil {
			return nil, fmt.Errorf("discover the resources of %s: %w", apiVersion, err)
		}
		for _, r := range list.APIResources {
			if r.Kind == kind && !strings.Contains(r.Name, "/") {
				resource = r.Name
				break
			}
		}
		if resource == "" {
			return nil, apierrors.NewBadRequest(fmt.Sprintf("the API server serves no resource of kind %s in %s", kind, apiVersion))
		}
	}
	return g.client.Resource(gv.WithResource(resource)).Namespace(namespace).Get(ctx, name, metav1.GetOptions{})
}
