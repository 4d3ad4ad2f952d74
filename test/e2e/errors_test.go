package e2e

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
)

// TestAttachErrors: a node at its attachment limit (--max-volumes-per-node=2)
// gets RESOURCE_EXHAUSTED (8) in attachError.errorCode, a single-node volume
// asked for on a second node gets FAILED_PRECONDITION (9), both with an
// AttachFailed Event; and each clears (attached, no attachError) once its
// cause goes away: a detach on the same node frees a slot, a detach of the
// same volume frees the volume.
func TestAttachErrors(t *testing.T) {
	r := newRig(t, "--max-volumes-per-node=2")
	r.startNodePlugin("node-b") // node-b known to the controller through its node record
	nodeAName, nodeBName := r.nodeName("a"), r.nodeName("b")
	r.createCSINode(nodeAName, nodeA)
	r.createCSINode(nodeBName, "node-b")
	r.startAttacher("attacher")

	vols := r.createVolumes("err", 3)
	first := r.createVAs(vols[:2], nodeAName)
	r.waitVAs("two VolumeAttachments on node-a (its limit) attached", shortWait, first, attachedTo(nodeA))

	full := r.createVAs(vols[2:3], nodeAName)     // a third volume on node-a
	elsewhere := r.createVAs(vols[:1], nodeBName) // the first volume, single-node, on node-b
	r.waitVAs("third VolumeAttachment on node-a fails with RESOURCE_EXHAUSTED", shortWait, full, attachFailedWith(int32(codes.ResourceExhausted)))
	r.waitVAs("the node-a volume asked for on node-b fails with FAILED_PRECONDITION", shortWait, elsewhere, attachFailedWith(int32(codes.FailedPrecondition)))
	r.expectEvent(full[0], "AttachFailed")
	r.expectEvent(elsewhere[0], "AttachFailed")
	r.checkPublished("while the two fail", vols, allOn(vols[:2], nodeA))

	// A slot on node-a frees up: the third volume attaches there.
	start := time.Now()
	r.deleteVAs(first[1:2])
	r.waitVAs("third VolumeAttachment attached after a detach on node-a", shortWait, full, attachedTo(nodeA))
	t.Logf("RESOURCE_EXHAUSTED cleared %s after the detach that freed a slot", time.Since(start).Round(time.Millisecond))

	// The volume leaves node-a: it attaches on node-b.
	start = time.Now()
	r.deleteVAs(first[:1])
	r.waitVAs("VolumeAttachment on node-b attached after the detach from node-a", shortWait, elsewhere, attachedTo("node-b"))
	t.Logf("FAILED_PRECONDITION cleared %s after the detach from the other node", time.Since(start).Round(time.Millisecond))
	r.waitVAs("detached VolumeAttachments gone", shortWait, first, gone)
	r.checkPublished("after the errors cleared", vols, map[string][]string{
		vols[0].handle: {"node-b"},
		vols[2].handle: {nodeA},
	})

	rest := append(full, elsewhere...)
	r.deleteVAs(rest)
	r.waitVAs("all detached", shortWait, rest, gone)
	r.checkPublished("after all detaches", vols, nil)
	r.deletePVs(vols)
	r.waitPVsReleased("PersistentVolumes released", vols)
}

// expectEvent fails unless a VolumeAttachment gets an Event with reason.
// The Events of cluster-scoped objects go to the default namespace, and the
// recorder sends them asynchronously.
func (r *rig) expectEvent(vaName, reason string) {
	r.t.Helper()
	sel := fields.Set{"involvedObject.kind": "VolumeAttachment", "involvedObject.name": vaName, "reason": reason}.AsSelector().String()
	var lastErr error
	err := wait.PollUntilContextTimeout(r.ctx, 200*time.Millisecond, shortWait, true, func(ctx context.Context) (bool, error) {
		events, err := r.client.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{FieldSelector: sel})
		lastErr = err
		return err == nil && len(events.Items) > 0, nil
	})
	if err != nil {
		r.t.Fatalf("no %s Event on VolumeAttachment %s after %s (last list error: %v); its state: %s",
			reason, vaName, shortWait, lastErr, describeVA(r.getVA(vaName)))
	}
}
