package resize

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/loopvol/loopvol/internal/kube"
	"github.com/loopvol/loopvol/internal/kube/claimtest"
)

func resourceQ(s string) *resource.Quantity {
	q := resource.MustParse(s)
	return &q
}

func TestDecide(t *testing.T) {
	const (
		none        = corev1.ClaimResourceStatus("")
		ctrlRunning = corev1.PersistentVolumeClaimControllerResizeInProgress
		ctrlNo      = corev1.PersistentVolumeClaimControllerResizeInfeasible
		nodePending = corev1.PersistentVolumeClaimNodeResizePending
		nodeRunning = corev1.PersistentVolumeClaimNodeResizeInProgress
		nodeNo      = corev1.PersistentVolumeClaimNodeResizeInfeasible
	)
	tests := []struct {
		name       string
		request    string
		allocated  string // "" for none
		status     corev1.ClaimResourceStatus
		fsPending  bool
		pv         string
		finalError bool
		nodeOnly   bool
		want       string // "" for no action
		wantRetry  bool
	}{
		{name: "first expansion", request: "2Gi", pv: "1Gi", want: "2Gi"},
		{name: "raised after a finished one", request: "3Gi", allocated: "2Gi", pv: "2Gi", want: "3Gi"},
		{name: "controller running, uncertain → the recorded size", request: "3Gi", allocated: "5Gi", status: ctrlRunning, pv: "1Gi", want: "5Gi", wantRetry: true},
		{name: "controller running, failed for sure → the request", request: "3Gi", allocated: "5Gi", status: ctrlRunning, pv: "1Gi", finalError: true, want: "3Gi"},
		{name: "infeasible, request lowered → the request", request: "3Gi", allocated: "100Gi", status: ctrlNo, pv: "1Gi", want: "3Gi"},
		{name: "infeasible, request unchanged → retry it", request: "100Gi", allocated: "100Gi", status: ctrlNo, pv: "1Gi", want: "100Gi", wantRetry: true},
		{name: "node pending, raised again → wait for the node", request: "3Gi", allocated: "2Gi", status: nodePending, pv: "2Gi"},
		{name: "node running, raised again → wait for the node", request: "3Gi", allocated: "2Gi", status: nodeRunning, pv: "2Gi"},
		{name: "node pending but the volume smaller than recorded → finish the controller part", request: "3Gi", allocated: "2Gi", status: nodePending, pv: "1Gi", want: "2Gi", wantRetry: true},
		{name: "node infeasible, raised → the recorded size again, for kubelet to retry", request: "3Gi", allocated: "2Gi", status: nodeNo, pv: "2Gi", want: "2Gi", wantRetry: true},
		{name: "volume holds the request, node pending → nothing", request: "2Gi", allocated: "2Gi", status: nodePending, pv: "2Gi"},
		{name: "volume holds the request, node infeasible → reset at the recorded size", request: "2Gi", allocated: "2Gi", status: nodeNo, pv: "2Gi", want: "2Gi", wantRetry: true},
		{name: "volume holds the request, node infeasible, node-only driver → the request", request: "2Gi", allocated: "3Gi", status: nodeNo, pv: "3Gi", nodeOnly: true, want: "2Gi"},
		{name: "volume holds the request, controller running → record it at the recorded size", request: "2Gi", allocated: "2Gi", status: ctrlRunning, pv: "2Gi", want: "2Gi", wantRetry: true},
		{name: "volume holds a lowered request, controller running, failed for sure → the request", request: "2Gi", allocated: "5Gi", status: ctrlRunning, pv: "2Gi", finalError: true, want: "2Gi"},
		{name: "volume holds a lowered request after an infeasible one → the request (upstream: the failed size)", request: "2Gi", allocated: "5Gi", status: ctrlNo, pv: "2Gi", want: "2Gi"},
		{name: "volume holds the request, no status, recorded size → it", request: "2Gi", allocated: "2Gi", pv: "2Gi", want: "2Gi", wantRetry: true},
		{name: "volume holds the request, no allocatedResources, FileSystemResizePending → nothing", request: "2Gi", fsPending: true, pv: "2Gi"},
		{name: "volume holds the request, nothing recorded → the request", request: "2Gi", pv: "2Gi", want: "2Gi"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pvc := claimtest.Claim("c", tc.request, "1Gi")
			if tc.allocated != "" {
				claimtest.Allocated(tc.allocated, tc.status)(pvc)
			} else if tc.status != none {
				t.Fatal("a status needs an allocated size in this table")
			}
			if tc.fsPending {
				claimtest.Condition(corev1.PersistentVolumeClaimFileSystemResizePending, "")(pvc)
			}
			d := decide(pvc, resource.MustParse(tc.pv), tc.finalError, !tc.nodeOnly)
			switch {
			case tc.want == "" && d.act:
				t.Fatalf("decide = act on %s, want no action", d.target.String())
			case tc.want == "":
				return
			case !d.act:
				t.Fatalf("decide = no action, want %s", tc.want)
			}
			if d.target.Cmp(resource.MustParse(tc.want)) != 0 || d.retry != tc.wantRetry {
				t.Errorf("decide = %s (retry %v), want %s (retry %v)", d.target.String(), d.retry, tc.want, tc.wantRetry)
			}
		})
	}
}

// TestShouldEnqueue: which claim updates queue a sync (the claim handler
// with the controller's shouldEnqueue); the controller's own writes coming
// back never do.
func TestShouldEnqueue(t *testing.T) {
	base := claimtest.Claim("c", "2Gi", "1Gi")
	tests := []struct {
		name   string
		change func(*corev1.PersistentVolumeClaim)
		sameRV bool
		own    bool
		want   bool
	}{
		{name: "resync (same resourceVersion)", change: func(*corev1.PersistentVolumeClaim) {}, sameRV: true, want: true},
		{name: "request raised", change: func(p *corev1.PersistentVolumeClaim) {
			p.Spec.Resources.Requests[corev1.ResourceStorage] = *resourceQ("3Gi")
		}, want: true},
		{name: "request lowered (recovery)", change: func(p *corev1.PersistentVolumeClaim) {
			p.Spec.Resources.Requests[corev1.ResourceStorage] = *resourceQ("1500Mi")
		}, want: true},
		{name: "capacity grew (the node finished)", change: func(p *corev1.PersistentVolumeClaim) { p.Status.Capacity[corev1.ResourceStorage] = *resourceQ("2Gi") }, want: true},
		{name: "bound", change: func(p *corev1.PersistentVolumeClaim) { p.Status.Phase = corev1.ClaimLost }, want: true},
		{name: "resize status changed by kubelet", change: claimtest.Allocated("2Gi", corev1.PersistentVolumeClaimNodeResizeInfeasible), want: true},
		{name: "resizer annotation set", change: func(p *corev1.PersistentVolumeClaim) { p.Annotations = map[string]string{resizerAnn: claimtest.Driver} }, want: true},
		{name: "label added", change: func(p *corev1.PersistentVolumeClaim) { p.Labels = map[string]string{"a": "b"} }},
		{name: "own write of the resize status", change: claimtest.Allocated("2Gi", corev1.PersistentVolumeClaimControllerResizeInProgress), own: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, expandCaps, nil)
			old, pvc := base.DeepCopy(), base.DeepCopy()
			tc.change(pvc)
			if !tc.sameRV {
				pvc.ResourceVersion = "2"
			}
			if tc.own {
				f.c.claims.Writes.Record(kube.ClaimKey(pvc), pvc.ResourceVersion, claimtest.Now)
			}
			f.c.claims.ClaimUpdated(old, pvc)
			if got := f.c.claims.Queue.Q.Len() == 1; got != tc.want {
				t.Errorf("queued = %v, want %v", got, tc.want)
			}
		})
	}
}
