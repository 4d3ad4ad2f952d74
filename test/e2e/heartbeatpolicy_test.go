package e2e

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/loopvol/loopvol/internal/harness/testenv"
	"github.com/loopvol/loopvol/pkg/heartbeat"
)

const polHeartbeat = "loopvol-heartbeat-leases"

// TestHeartbeatLeasePolicy applies components/fencing's heartbeat RBAC and
// its ValidatingAdmissionPolicy to the real kube-apiserver and checks, with
// real Pod-bound ServiceAccount tokens of two nodes' plugins, that each
// writes its own heartbeat Lease (the shipped Renewer included) and no
// other: not another node's, not one it takes from another node, not the
// sidecar's leader Lease, not with a token bound to no node.
func TestHeartbeatLeasePolicy(t *testing.T) {
	a := newAdmissionRig(t)
	ctx := a.ctx
	a.applyHeartbeatComponent(t)
	nodeA, nodeB := "e2e-"+a.id+"-hb-a", "e2e-"+a.id+"-hb-b"
	clientA, clientB := a.nodeSidecar(t, nodeA), a.nodeSidecar(t, nodeB)
	leases := func(c kubernetes.Interface) func(context.Context, *coordinationv1.Lease, bool) error {
		return func(ctx context.Context, l *coordinationv1.Lease, dryRun bool) error {
			opts := metav1.CreateOptions{}
			if dryRun {
				opts.DryRun = []string{metav1.DryRunAll}
			}
			_, err := c.CoordinationV1().Leases(admNamespace).Create(ctx, l, opts)
			if err == nil && !dryRun {
				t.Cleanup(func() {
					a.cleanupErr(t, "Lease "+l.Name, a.admin.CoordinationV1().Leases(admNamespace).Delete(context.WithoutCancel(ctx), l.Name, metav1.DeleteOptions{}))
				})
			}
			return err
		}
	}
	createA, createB := leases(clientA), leases(clientB)
	hb := func(node, holder string) *coordinationv1.Lease {
		return &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{
				Name:   heartbeat.LeaseName(driverName, node),
				Labels: map[string]string{heartbeat.ComponentLabel: heartbeat.ComponentHeartbeat, heartbeat.DriverLabel: driverName, testLabel: a.id},
			},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(holder), RenewTime: &metav1.MicroTime{Time: time.Now()}},
		}
	}
	update := func(c kubernetes.Interface, name string, change func(*coordinationv1.Lease)) error {
		l, err := a.admin.CoordinationV1().Leases(admNamespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		change(l)
		_, err = c.CoordinationV1().Leases(admNamespace).Update(ctx, l, metav1.UpdateOptions{})
		return err
	}

	a.waitEnforced(t, "node A creating node B's heartbeat", deniedBy(polHeartbeat, metav1.StatusReasonForbidden, "holder '"+nodeB+"'", "node plugin of "+nodeA), func(ctx context.Context) error {
		return createA(ctx, hb(nodeB, nodeB), true)
	})

	// Its own: created, renewed.
	own := hb(nodeA, nodeA)
	allowed.check(t, "node A creating its own heartbeat", createA(ctx, own, false))
	allowed.check(t, "node A renewing its own heartbeat", update(clientA, own.Name, func(l *coordinationv1.Lease) {
		l.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
		l.Annotations = map[string]string{heartbeat.FencedVolumesAnnotation: "0"}
	}))

	// Another node's.
	theirs := hb(nodeB, nodeB)
	allowed.check(t, "node B creating its own heartbeat", createB(ctx, theirs, false))
	deniedBy(polHeartbeat, metav1.StatusReasonForbidden, "before the write: '"+nodeB+"'").check(t, "node A taking node B's heartbeat over",
		update(clientA, theirs.Name, func(l *coordinationv1.Lease) { l.Spec.HolderIdentity = ptr.To(nodeA) }))
	deniedBy(polHeartbeat, metav1.StatusReasonForbidden, "holder '"+nodeB+"'").check(t, "node A renewing node B's heartbeat",
		update(clientA, theirs.Name, func(l *coordinationv1.Lease) { l.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()} }))
	deniedBy(polHeartbeat, metav1.StatusReasonForbidden, "holder '"+nodeB+"'").check(t, "node A writing a fenced-volumes count of 0 into node B's heartbeat",
		update(clientA, theirs.Name, func(l *coordinationv1.Lease) {
			l.Annotations = map[string]string{heartbeat.FencedVolumesAnnotation: "0"}
		}))

	// The sidecar's leader Lease, in the same namespace.
	leader := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "e2e-" + a.id + "-leader", Labels: map[string]string{testLabel: a.id}},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To("loopvol-controller-0"), LeaseDurationSeconds: ptr.To[int32](15)},
	}
	allowed.check(t, "the administrator creating a leader Lease", leases(a.admin)(ctx, leader, false))
	deniedBy(polHeartbeat, metav1.StatusReasonForbidden, "is not a heartbeat").check(t, "node A taking the sidecar's leadership",
		update(clientA, leader.Name, func(l *coordinationv1.Lease) { l.Spec.HolderIdentity = ptr.To(nodeA) }))
	deniedBy(polHeartbeat, metav1.StatusReasonForbidden, "is not a heartbeat").check(t, "node A labelling the leader Lease a heartbeat of its own",
		update(clientA, leader.Name, func(l *coordinationv1.Lease) {
			l.Labels[heartbeat.ComponentLabel] = heartbeat.ComponentHeartbeat
			l.Spec.HolderIdentity = ptr.To(nodeA)
		}))
	unlabelled := hb(nodeA, nodeA)
	unlabelled.Name, unlabelled.Labels = "e2e-"+a.id+"-unlabelled", map[string]string{testLabel: a.id}
	deniedBy(polHeartbeat, metav1.StatusReasonForbidden, "is not a heartbeat").check(t, "node A creating a Lease that is no heartbeat",
		createA(ctx, unlabelled, true))

	// A token bound to no node.
	unbound := leases(a.saClient(t, admNode, nil))
	deniedBy(polHeartbeat, metav1.StatusReasonForbidden, "bound to no node").check(t, "a node token bound to no Pod creating a heartbeat",
		unbound(ctx, hb(nodeA+"-x", nodeA+"-x"), true))

	// The shipped Renewer, with node B's token, renews under the policy.
	r, err := heartbeat.NewRenewer(heartbeat.RenewerConfig{
		Client: clientB, Namespace: admNamespace, DriverName: driverName, NodeID: nodeB, Incarnation: time.Now(),
		FencedVolumes: func(context.Context) int { return 0 },
	})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, shortWait, true, func(context.Context) (bool, error) {
		return !r.LastRenewed().IsZero(), nil
	})
	stop()
	if rerr := <-done; rerr != nil {
		t.Errorf("Renewer: %v", rerr)
	}
	if err != nil {
		t.Fatalf("the Renewer with node B's token never renewed node B's heartbeat under the policy: %v", err)
	}
}

// applyHeartbeatComponent creates components/fencing's heartbeat Role and
// RoleBinding and its Lease policy and binding, as shipped, and deletes
// them at the end.
func (a *admissionRig) applyHeartbeatComponent(t *testing.T) {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "deploy", "kubernetes", "components", "fencing")
	docs := func(file string) [][]byte {
		b, err := os.ReadFile(filepath.Join(dir, file))
		if err != nil {
			t.Fatal(err)
		}
		return bytes.Split(b, []byte("\n---\n"))
	}
	decode := func(doc []byte, into any) {
		if err := yaml.UnmarshalStrict(doc, into); err != nil {
			t.Fatalf("decode %s: %v", doc, err)
		}
	}
	ctx := context.WithoutCancel(a.ctx)
	var role rbacv1.Role
	decode(docs("rbac-heartbeat.yaml")[0], &role)
	var binding rbacv1.RoleBinding
	for _, d := range docs("bindings.yaml") {
		var rb rbacv1.RoleBinding
		if bytes.Contains(d, []byte("kind: RoleBinding")) && bytes.Contains(d, []byte("name: loopvol-heartbeat\n")) {
			decode(d, &rb)
			binding = rb
		}
	}
	if binding.Name == "" {
		t.Fatal("bindings.yaml has no RoleBinding loopvol-heartbeat")
	}
	rbac := a.admin.RbacV1()
	if _, err := rbac.Roles(admNamespace).Create(ctx, &role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		a.cleanupErr(t, "Role "+role.Name, rbac.Roles(admNamespace).Delete(ctx, role.Name, metav1.DeleteOptions{}))
	})
	if _, err := rbac.RoleBindings(admNamespace).Create(ctx, &binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		a.cleanupErr(t, "RoleBinding "+binding.Name, rbac.RoleBindings(admNamespace).Delete(ctx, binding.Name, metav1.DeleteOptions{}))
	})
	policyDocs := docs("heartbeat-leases.yaml")
	if len(policyDocs) != 2 {
		t.Fatalf("heartbeat-leases.yaml has %d documents, want the policy and its binding", len(policyDocs))
	}
	var policy admissionv1.ValidatingAdmissionPolicy
	var pb admissionv1.ValidatingAdmissionPolicyBinding
	decode(policyDocs[0], &policy)
	decode(policyDocs[1], &pb)
	adm := a.admin.AdmissionregistrationV1()
	if _, err := adm.ValidatingAdmissionPolicies().Create(ctx, &policy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		a.cleanupErr(t, "ValidatingAdmissionPolicy "+policy.Name, adm.ValidatingAdmissionPolicies().Delete(ctx, policy.Name, metav1.DeleteOptions{}))
	})
	if _, err := adm.ValidatingAdmissionPolicyBindings().Create(ctx, &pb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		a.cleanupErr(t, "ValidatingAdmissionPolicyBinding "+pb.Name, adm.ValidatingAdmissionPolicyBindings().Delete(ctx, pb.Name, metav1.DeleteOptions{}))
	})
}
