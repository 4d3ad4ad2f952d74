package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

// TestTakeOverFromUpstream: objects as the upstream external-attacher leaves
// them (PV and VolumeAttachment finalizer external-attacher/loopvol-csi-io,
// annotation csi.alpha.kubernetes.io/node-id, status attached=true, the
// volume published on the driver) are taken over as they are: no
// ControllerPublishVolume, no change. On deletion our attacher unpublishes
// them and removes the finalizers, also for a node whose CSINode is gone
// (the node ID then comes from the annotation alone).
func TestTakeOverFromUpstream(t *testing.T) {
	r := newRig(t)
	withCSINode, withoutCSINode := r.nodeName("a"), r.nodeName("gone")
	r.createCSINode(withCSINode, nodeA)
	vols := r.createVolumes("up", 2, finalizer)

	// What external-attacher did: PV finalizer (at creation above), VA
	// finalizer and annotation, ControllerPublishVolume, status.
	var names []string
	for i, node := range []string{withCSINode, withoutCSINode} {
		va := r.newVA(vols[i], node)
		va.Finalizers = []string{finalizer}
		va.Annotations = map[string]string{nodeIDAnnotation: nodeA}
		if _, err := r.client.StorageV1().VolumeAttachments().Create(r.ctx, va, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create VolumeAttachment %s: %v", va.Name, err)
		}
		if _, err := r.ctrl.ControllerPublishVolume(r.ctx, &csi.ControllerPublishVolumeRequest{
			VolumeId:         vols[i].handle,
			NodeId:           nodeA,
			VolumeCapability: mountCapability(),
		}); err != nil {
			t.Fatalf("ControllerPublishVolume %s on %s, as external-attacher did: %v", vols[i].handle, nodeA, err)
		}
		r.patchVAStatus(va.Name, `{"status":{"attached":true}}`)
		names = append(names, va.Name)
	}
	before := map[string]string{}
	for _, name := range names {
		before[name] = r.getVA(name).ResourceVersion
	}

	a := r.startAttacher("attacher", "--reconcile-sync=2s")
	// The first reconcile pass after the caches synced: by then every
	// object has been synced once and compared with the driver.
	r.waitLog(a, `"Reconciled VolumeAttachments with the driver"`)
	am := r.scrape(a.metrics)
	expectCount(t, "attacher ControllerPublishVolume calls for objects attached by upstream", am.sidecarCalls(methodPublish, ""), 0)
	expectCount(t, "attacher reconcile re-syncs", am.reconcileResyncs(), 0)
	for _, name := range names {
		if va := r.getVA(name); va.ResourceVersion != before[name] {
			t.Errorf("VolumeAttachment %s was written by the attacher taking over (resourceVersion %s → %s): %s",
				name, before[name], va.ResourceVersion, describeVA(va))
		}
	}
	r.checkPublished("after the take-over", vols, allOn(vols, nodeA))

	r.deleteVAs(names)
	r.waitVAs("detached by our attacher", shortWait, names, gone)
	r.checkPublished("after the detaches", vols, nil)
	r.deletePVs(vols)
	r.waitPVsReleased("PersistentVolumes released", vols)
	am = r.scrape(a.metrics)
	expectCount(t, "attacher ControllerUnpublishVolume OK calls", am.sidecarCalls(methodUnpublish, "OK"), 2)
	expectCount(t, "attacher detaches", am.detaches(), 2)
}

// waitLog waits until the attacher's log contains s.
func (r *rig) waitLog(a *attacher, s string) {
	r.t.Helper()
	err := wait.PollUntilContextTimeout(r.ctx, 100*time.Millisecond, shortWait, true, func(context.Context) (bool, error) {
		return strings.Contains(a.Log(), s), nil
	})
	if err != nil {
		r.t.Fatalf("attacher %s did not log %s within %s", a.Name, s, shortWait)
	}
}
