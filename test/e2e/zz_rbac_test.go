package e2e

// This file's name sorts last: its test runs after every other test of the
// package, when the API server's audit log holds every call the components
// made under their restricted users.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/loopvol/loopvol/internal/harness/testenv"
)

// auditEvent is the part of an audit.k8s.io/v1 Event the check reads.
type auditEvent struct {
	User struct {
		Username string `json:"username"`
	} `json:"user"`
	Verb      string `json:"verb"`
	ObjectRef *struct {
		Resource    string `json:"resource"`
		Subresource string `json:"subresource"`
		Namespace   string `json:"namespace"`
		APIGroup    string `json:"apiGroup"`
		Name        string `json:"name"`
	} `json:"objectRef"`
	ResponseStatus *struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
	RequestReceived time.Time `json:"requestReceivedTimestamp"`
}

// apiCall is one kind of request: what RBAC decides on.
type apiCall struct {
	verb, group, resource, subresource string
	namespaced                         bool
	// name is set for the resources whose rules name their objects
	// (byName): RBAC decides on the name there.
	name string
}

// byName are the resources loopvol's rules grant by resourceNames only.
var byName = map[string]bool{"validatingwebhookconfigurations": true}

func (c apiCall) String() string {
	r := c.resource
	if c.subresource != "" {
		r += "/" + c.subresource
	}
	if c.group != "" {
		r += "." + c.group
	}
	if c.name != "" {
		r += " " + c.name
	}
	scope := "cluster-wide"
	if c.namespaced {
		scope = "in its namespace"
	}
	return c.verb + " " + r + " (" + scope + ")"
}

// fromCode are calls each component makes on paths the e2e tests may not
// take (read from the code): publish secrets, events, owner lookups.
var fromCode = map[string][]apiCall{
	"rbac-attacher.yaml": {
		{verb: "get", resource: "secrets", namespaced: true},
		{verb: "create", resource: "events", namespaced: true},
		{verb: "patch", resource: "events", namespaced: true},
		{verb: "patch", group: "storage.k8s.io", resource: "volumeattachments", subresource: "status"},
		{verb: "create", group: "coordination.k8s.io", resource: "leases", namespaced: true},
		{verb: "update", group: "coordination.k8s.io", resource: "leases", namespaced: true},
	},
	"rbac-capacity.yaml": {
		{verb: "get", resource: "pods", namespaced: true},
		{verb: "get", group: "apps", resource: "replicasets", namespaced: true},
		{verb: "create", group: "storage.k8s.io", resource: "csistoragecapacities", namespaced: true},
		{verb: "delete", group: "storage.k8s.io", resource: "csistoragecapacities", namespaced: true},
	},
	"rbac-webhook.yaml": {
		// The caBundle of its own configuration, patched only when the
		// CA changes.
		{verb: "patch", group: "admissionregistration.k8s.io", resource: "validatingwebhookconfigurations", name: "loopvol-webhook"},
	},
	// The placement controller runs on the real cluster only
	// (test/multinode): each of its calls is read from the code.
	"rbac-placement.yaml": {
		{verb: "list", resource: "pods"},
		{verb: "watch", resource: "pods"},
		{verb: "list", resource: "persistentvolumeclaims"},
		{verb: "watch", resource: "persistentvolumeclaims"},
		{verb: "list", resource: "persistentvolumes"},
		{verb: "watch", resource: "persistentvolumes"},
		{verb: "get", resource: "nodes"},
		{verb: "list", resource: "nodes"},
		{verb: "watch", resource: "nodes"},
		{verb: "create", resource: "events", namespaced: true},
		{verb: "patch", resource: "events", namespaced: true},
		{verb: "get", group: "coordination.k8s.io", resource: "leases", namespaced: true},
		{verb: "create", group: "coordination.k8s.io", resource: "leases", namespaced: true},
		{verb: "update", group: "coordination.k8s.io", resource: "leases", namespaced: true},
	},
	"rbac-resizer.yaml": {
		{verb: "get", resource: "secrets", namespaced: true},
		{verb: "patch", resource: "persistentvolumeclaims", subresource: "status", namespaced: true},
		{verb: "patch", resource: "persistentvolumes"},
		// --handle-volume-inuse-error lists the claim's Pods after a
		// FAILED_PRECONDITION; --node-deployment reads its Node.
		{verb: "list", resource: "pods", namespaced: true},
		{verb: "get", resource: "nodes"},
	},
}

// neverAllowed are requests no loopvol component may make: the sample of
// what a compromised sidecar must not be able to do.
var neverAllowed = []apiCall{
	{verb: "create", resource: "persistentvolumes"},
	// The webhook patches its own configuration only.
	{verb: "patch", group: "admissionregistration.k8s.io", resource: "validatingwebhookconfigurations", name: "another-webhook"},
	{verb: "create", resource: "secrets", namespaced: true},
	{verb: "update", resource: "secrets", namespaced: true},
	{verb: "list", resource: "secrets", namespaced: true},
	{verb: "delete", resource: "nodes"},
	{verb: "create", resource: "pods", subresource: "exec", namespaced: true},
	{verb: "impersonate", resource: "users"},
	{verb: "impersonate", resource: "serviceaccounts", namespaced: true},
	{verb: "create", resource: "serviceaccounts", subresource: "token", namespaced: true},
	{verb: "update", group: "storage.k8s.io", resource: "csidrivers"},
	{verb: "escalate", group: "rbac.authorization.k8s.io", resource: "clusterroles"},
	{verb: "bind", group: "rbac.authorization.k8s.io", resource: "clusterroles"},
}

// TestZZRBACCoversEveryCall proves the shipped RBAC with
// SubjectAccessReviews:
//   - every call the audit log shows a component's restricted user making
//     during this run (plus the calls read from its code) is allowed to a
//     ServiceAccount bound to exactly that component's RBAC file, and to
//     the controller ServiceAccount of the base deployment;
//   - none of the calls in neverAllowed is allowed to either, and the node
//     ServiceAccount (the registrar in kubelet mode) is allowed none of the
//     components' calls at all.
func TestZZRBACCoversEveryCall(t *testing.T) {
	env := cluster.Env(t)
	if env.AuditLogPath == "" {
		t.Fatal("the control plane runs without an audit log")
	}
	r := &rig{t: t, env: env, client: env.Client, id: shortID()}
	_, r.ctx = contextFor(t)

	observed := map[string]map[apiCall]bool{} // RBAC file → calls
	f, err := os.Open(env.AuditLogPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	var refused []string
	// A kube-apiserver restarted by a test (TestFaultAPIServerOutage)
	// refuses everyone until its RBAC caches sync; the components' retries
	// and events meet that, and it says nothing about the shipped rules.
	warmUps, warmingUp := env.WarmUps(), 0
	for sc.Scan() {
		var ev auditEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil || ev.ObjectRef == nil {
			continue
		}
		files, ok := restrictedUsers.get(ev.User.Username)
		if !ok {
			continue
		}
		o := ev.ObjectRef
		call := apiCall{verb: ev.Verb, group: o.APIGroup, resource: o.Resource, subresource: o.Subresource, namespaced: o.Namespace != ""}
		if byName[o.Resource] {
			call.name = o.Name
		}
		if ev.ResponseStatus != nil && ev.ResponseStatus.Code == 403 {
			if slices.ContainsFunc(warmUps, func(w testenv.Window) bool { return w.Contains(ev.RequestReceived) }) {
				warmingUp++
			} else {
				refused = append(refused, fmt.Sprintf("%s: %s", ev.User.Username, call))
			}
		}
		key := strings.Join(files, "+")
		if observed[key] == nil {
			observed[key] = map[apiCall]bool{}
		}
		observed[key][call] = true
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if warmingUp > 0 {
		t.Logf("left out %d refusals while a restarted kube-apiserver was not ready yet", warmingUp)
	}
	if len(refused) > 0 {
		t.Errorf("the API server refused calls of the restricted users (the shipped RBAC is short): %v", refused)
	}
	for file, calls := range fromCode {
		if observed[file] == nil {
			observed[file] = map[apiCall]bool{}
		}
		for _, c := range calls {
			observed[file][c] = true
		}
	}

	// The base's ServiceAccounts and bindings, as `kubectl apply -k` makes
	// them.
	ns := "loopvol"
	if _, err := r.client.CoreV1().Namespaces().Get(r.ctx, ns, metav1.GetOptions{}); err != nil {
		if _, err := r.client.CoreV1().Namespaces().Create(r.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	applyBaseRBAC(t, r)

	sar := func(user string, c apiCall) bool {
		t.Helper()
		ra := &authorizationv1.ResourceAttributes{Verb: c.verb, Group: c.group, Resource: c.resource, Subresource: c.subresource, Name: c.name}
		if c.namespaced {
			ra.Namespace = ns
		}
		rsp, err := r.client.AuthorizationV1().SubjectAccessReviews().Create(r.ctx, &authorizationv1.SubjectAccessReview{
			Spec: authorizationv1.SubjectAccessReviewSpec{
				User:               user,
				Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
				ResourceAttributes: ra,
			},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("SubjectAccessReview: %v", err)
		}
		return rsp.Status.Allowed
	}

	// The API server's RBAC authorizer reads roles and bindings from its
	// own caches: a binding made a moment ago may not be seen yet. What
	// must be allowed is asked again for a while before it counts as
	// refused (what must be denied needs no wait: a late binding could
	// only make it pass wrongly, not fail).
	allowedSoon := func(user string, c apiCall) bool {
		t.Helper()
		for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			if sar(user, c) {
				return true
			}
			if time.Now().After(deadline) {
				return false
			}
		}
	}

	controllerSA := "system:serviceaccount:" + ns + ":loopvol-controller"
	nodeSA := "system:serviceaccount:" + ns + ":loopvol-node"
	var checked int
	for _, key := range slices.Sorted(maps.Keys(observed)) {
		files := strings.Split(key, "+")
		var parts []string
		component := false
		for _, f := range files {
			component = component || strings.Contains(f, "/")
			parts = append(parts, strings.TrimSuffix(strings.TrimPrefix(filepath.Base(f), "rbac-"), ".yaml"))
		}
		name := "rbac-proof-" + strings.Join(parts, "-")
		if _, err := r.client.CoreV1().ServiceAccounts(ns).Create(r.ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ignoreNotFound(t, r.client.CoreV1().ServiceAccounts(ns).Delete(r.ctx, name, metav1.DeleteOptions{}))
		})
		bindRBACFiles(t, r.ctx, r.client, rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: ns}, name, ns, files...)
		proofSA := "system:serviceaccount:" + ns + ":" + name
		calls := slices.SortedFunc(maps.Keys(observed[key]), func(a, b apiCall) int { return strings.Compare(a.String(), b.String()) })
		for _, c := range calls {
			checked++
			if !allowedSoon(proofSA, c) {
				t.Errorf("%s: %s is not allowed by the file", key, c)
			}
			// A component's files (components/fencing/...) are bound by
			// the component, not the base: the file alone is checked.
			if component {
				continue
			}
			// The registrar's direct mode is for clusters without kubelet:
			// the base binds its rules to nobody.
			if !slices.Contains(files, "rbac-registrar.yaml") && !allowedSoon(controllerSA, c) {
				t.Errorf("%s: %s is not allowed to the base's %s", key, c, controllerSA)
			}
			if sar(nodeSA, c) {
				t.Errorf("%s: %s is allowed to %s, which needs no API access in the base", key, c, nodeSA)
			}
		}
		for _, c := range neverAllowed {
			if sar(proofSA, c) {
				t.Errorf("%s allows %s", key, c)
			}
		}
		t.Logf("%s: %d calls allowed, %d forbidden ones denied", key, len(calls), len(neverAllowed))
	}
	for _, c := range neverAllowed {
		if c.verb == "create" && c.resource == "persistentvolumes" {
			continue // the provisioner in the controller pod creates PVs
		}
		if sar(controllerSA, c) {
			t.Errorf("the base's %s is allowed %s", controllerSA, c)
		}
		if sar(nodeSA, c) {
			t.Errorf("the base's %s is allowed %s", nodeSA, c)
		}
	}
	if checked == 0 {
		t.Fatal("no call of a restricted user was found in the audit log")
	}
}

// applyBaseRBAC applies the base's ServiceAccounts, roles and bindings (as
// kustomize renders them) and deletes them when the test ends.
func applyBaseRBAC(t *testing.T, r *rig) {
	t.Helper()
	a := newApplier(t, r.env.Config)
	for _, o := range renderDeploy(t, "base") {
		switch o.GetKind() {
		case "ServiceAccount", "ClusterRole", "Role", "ClusterRoleBinding", "RoleBinding":
		default:
			continue
		}
		if _, err := a.apply(r.ctx, o); err != nil {
			t.Fatalf("apply %s %s: %v", o.GetKind(), o.GetName(), err)
		}
		t.Cleanup(func() {
			if err := a.delete(context.WithoutCancel(r.ctx), o); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		})
	}
}
