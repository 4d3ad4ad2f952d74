package clustertest

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/loopvol/loopvol/internal/harness/cluster"
)

// LogLine waits until the pod's main container has written a line
// containing want and returns the whole log; it fails the test after two
// minutes with the log so far.
func LogLine(ctx context.Context, t *testing.T, c *cluster.Cluster, pod *corev1.Pod, want string) string {
	t.Helper()
	var log string
	if err := c.Wait(ctx, fmt.Sprintf("%s/%s logs %q", pod.Namespace, pod.Name, want), 2*time.Minute, func(context.Context) (bool, error) {
		log, _ = c.ContainerLog(pod, "main")
		return strings.Contains(log, want), nil
	}); err != nil {
		t.Fatalf("%v; log so far: %q", err, log)
	}
	return log
}

// DriverArgs are the arguments of the node plugin's driver container (the
// DaemonSet loopvol-node's container "driver").
func DriverArgs(ctx context.Context, c *cluster.Cluster) ([]string, error) {
	ds, err := c.Client.AppsV1().DaemonSets(cluster.Namespace).Get(ctx, "loopvol-node", metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	i := slices.IndexFunc(ds.Spec.Template.Spec.Containers, func(c corev1.Container) bool { return c.Name == "driver" })
	if i < 0 {
		return nil, fmt.Errorf("DaemonSet loopvol-node has no container driver")
	}
	return ds.Spec.Template.Spec.Containers[i].Args, nil
}

// SetDriverArgs gives the node plugin's driver container args and waits
// until the DaemonSet has rolled out on every node and every node's CSINode
// has count as loopvol's allocatable volumes (what kubelet writes from
// NodeGetInfo: --max-volumes-per-node).
func SetDriverArgs(ctx context.Context, c *cluster.Cluster, args []string, count int32) error {
	apps := c.Client.AppsV1().DaemonSets(cluster.Namespace)
	ds, err := apps.Get(ctx, "loopvol-node", metav1.GetOptions{})
	if err != nil {
		return err
	}
	i := slices.IndexFunc(ds.Spec.Template.Spec.Containers, func(c corev1.Container) bool { return c.Name == "driver" })
	if i < 0 {
		return fmt.Errorf("DaemonSet loopvol-node has no container driver")
	}
	patch, err := json.Marshal([]map[string]any{
		// The test op makes a reordered DaemonSet fail instead of
		// patching another container.
		{"op": "test", "path": fmt.Sprintf("/spec/template/spec/containers/%d/name", i), "value": "driver"},
		{"op": "replace", "path": fmt.Sprintf("/spec/template/spec/containers/%d/args", i), "value": args},
	})
	if err != nil {
		return err
	}
	if _, err := apps.Patch(ctx, "loopvol-node", types.JSONPatchType, patch, metav1.PatchOptions{}); err != nil {
		return err
	}
	return c.Wait(ctx, fmt.Sprintf("node plugins rolled out, every CSINode allocatable %d", count), 4*time.Minute, func(ctx context.Context) (bool, error) {
		ds, err := apps.Get(ctx, "loopvol-node", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		s := ds.Status
		if s.ObservedGeneration != ds.Generation || s.UpdatedNumberScheduled != s.DesiredNumberScheduled || s.NumberReady != s.DesiredNumberScheduled || s.NumberAvailable != s.DesiredNumberScheduled {
			return false, nil
		}
		for _, n := range c.Nodes() {
			got, err := CSINodeCount(ctx, c, n.Name)
			if err != nil || got != count {
				return false, err
			}
		}
		return true, nil
	})
}

// CSINodeCount is the allocatable count kubelet wrote for loopvol into the
// node's CSINode, or -1 when there is none.
func CSINodeCount(ctx context.Context, c *cluster.Cluster, node string) (int32, error) {
	n, err := c.Client.StorageV1().CSINodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return -1, err
	}
	i := slices.IndexFunc(n.Spec.Drivers, func(d storagev1.CSINodeDriver) bool { return d.Name == cluster.DriverName })
	if i < 0 || n.Spec.Drivers[i].Allocatable == nil || n.Spec.Drivers[i].Allocatable.Count == nil {
		return -1, nil
	}
	return *n.Spec.Drivers[i].Allocatable.Count, nil
}
