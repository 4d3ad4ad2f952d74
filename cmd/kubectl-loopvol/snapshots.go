package main

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// snapshotContents is the resource of the external-snapshotter's
// VolumeSnapshotContents: a CRD, read through the dynamic client so that
// the plugin needs no client of its own for it.
var snapshotContents = schema.GroupVersionResource{Group: "snapshot.storage.k8s.io", Version: "v1", Resource: "volumesnapshotcontents"}

// snapshotsByVolume maps a volume handle to the names of the
// VolumeSnapshotContents of the driver taken from it. It returns nil and
// no error when the snapshot CRDs are not installed: a cluster without
// snapshots is no error, and callers show "-" for unknown.
func (e *env) snapshotsByVolume(ctx context.Context) (map[string][]string, error) {
	list, err := e.dyn.Resource(snapshotContents).List(ctx, metav1.ListOptions{})
	if err != nil {
		if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("list VolumeSnapshotContents: %w", err)
	}
	out := map[string][]string{}
	for _, item := range list.Items {
		if driver, _, _ := unstructured.NestedString(item.Object, "spec", "driver"); driver != e.opts.driver {
			continue
		}
		if handle, ok, _ := unstructured.NestedString(item.Object, "spec", "source", "volumeHandle"); ok && handle != "" {
			out[handle] = append(out[handle], item.GetName())
		}
	}
	return out, nil
}
