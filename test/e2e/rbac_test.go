package e2e

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/loopvol/loopvol/internal/harness/testenv"
)

// restrictedKubeconfig makes a user that holds only the RBAC rules of the
// deployment's files (deploy/kubernetes/base/<file>: ClusterRoles bound
// cluster-wide, Roles bound in namespace), and returns a kubeconfig for it.
// A component run with it fails with "forbidden" where the shipped rules
// are short, which is what the tests look for. Everything it creates is
// deleted when the test ends.
func (r *rig) restrictedKubeconfig(user, namespace string, files ...string) string {
	r.t.Helper()
	restrictedUsers.add(user, files)
	bindRBACFiles(r.t, r.ctx, r.client, rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}, user, namespace, files...)
	return r.env.UserKubeconfig(r.t, user)
}

// bindRBACFiles creates the ClusterRoles and Roles of the deployment's RBAC
// files (see rbacFile), renamed with suffix so that
// several subjects never share one, and binds them to subject: ClusterRoles
// cluster-wide, Roles in namespace. Everything is deleted when the test
// ends.
func bindRBACFiles(t *testing.T, ctx context.Context, client kubernetes.Interface, subject rbacv1.Subject, suffix, namespace string, files ...string) {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	rbac := client.RbacV1()
	subjects := []rbacv1.Subject{subject}
	var granted []grant
	defer func() {
		if !t.Failed() {
			waitGranted(t, ctx, client, subject, granted)
		}
	}()
	for _, file := range files {
		data, err := os.ReadFile(rbacFile(root, file))
		if err != nil {
			t.Fatal(err)
		}
		for doc := range bytes.SplitSeq(data, []byte("\n---\n")) {
			var head metav1.TypeMeta
			if err := yaml.Unmarshal(doc, &head); err != nil {
				t.Fatalf("%s: %v", file, err)
			}
			switch head.Kind {
			case "ClusterRole":
				var role rbacv1.ClusterRole
				if err := yaml.UnmarshalStrict(doc, &role); err != nil {
					t.Fatalf("%s: %v", file, err)
				}
				role.Name += "-" + suffix
				if _, err := rbac.ClusterRoles().Create(ctx, &role, metav1.CreateOptions{}); err != nil {
					t.Fatalf("%s: create ClusterRole: %v", file, err)
				}
				binding := &rbacv1.ClusterRoleBinding{
					ObjectMeta: metav1.ObjectMeta{Name: role.Name},
					RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
					Subjects:   subjects,
				}
				if _, err := rbac.ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
					t.Fatalf("%s: create ClusterRoleBinding: %v", file, err)
				}
				t.Cleanup(func() {
					ctx := context.WithoutCancel(ctx)
					ignoreNotFound(t, rbac.ClusterRoleBindings().Delete(ctx, role.Name, metav1.DeleteOptions{}))
					ignoreNotFound(t, rbac.ClusterRoles().Delete(ctx, role.Name, metav1.DeleteOptions{}))
				})
				granted = append(granted, grant{"", role.Rules})
			case "Role":
				var role rbacv1.Role
				if err := yaml.UnmarshalStrict(doc, &role); err != nil {
					t.Fatalf("%s: %v", file, err)
				}
				role.Namespace = namespace
				role.Name += "-" + suffix
				if _, err := rbac.Roles(namespace).Create(ctx, &role, metav1.CreateOptions{}); err != nil {
					t.Fatalf("%s: create Role: %v", file, err)
				}
				binding := &rbacv1.RoleBinding{
					ObjectMeta: metav1.ObjectMeta{Name: role.Name, Namespace: namespace},
					RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
					Subjects:   subjects,
				}
				if _, err := rbac.RoleBindings(namespace).Create(ctx, binding, metav1.CreateOptions{}); err != nil {
					t.Fatalf("%s: create RoleBinding: %v", file, err)
				}
				t.Cleanup(func() {
					ctx := context.WithoutCancel(ctx)
					ignoreNotFound(t, rbac.RoleBindings(namespace).Delete(ctx, role.Name, metav1.DeleteOptions{}))
					ignoreNotFound(t, rbac.Roles(namespace).Delete(ctx, role.Name, metav1.DeleteOptions{}))
				})
				granted = append(granted, grant{namespace, role.Rules})
			case "":
			default:
				t.Fatalf("%s: unexpected kind %q in an RBAC file", file, head.Kind)
			}
		}
	}
}

// rbacFile is the path of an RBAC file of the deployment: a name alone is
// the base's (deploy/kubernetes/base/<file>), a path a component's
// ("components/fencing/rbac-fencing.yaml", under deploy/kubernetes).
func rbacFile(root, file string) string {
	if strings.Contains(file, "/") {
		return filepath.Join(root, "deploy", "kubernetes", file)
	}
	return filepath.Join(root, "deploy", "kubernetes", "base", file)
}

// grant is what one binding gives: rules, in namespace ("" cluster-wide).
type grant struct {
	namespace string
	rules     []rbacv1.PolicyRule
}

// waitGranted waits until the API server's authorizer allows subject every
// verb of every rule of granted (SubjectAccessReview). A binding takes
// effect only once the authorizer's caches have seen it: a component
// started at once could be refused its first calls (events, mostly, which
// it does not retry), and the audit-log check of zz_rbac_test.go would
// count them as rules missing from the shipped files.
func waitGranted(t *testing.T, ctx context.Context, client kubernetes.Interface, subject rbacv1.Subject, granted []grant) {
	t.Helper()
	spec := authorizationv1.SubjectAccessReviewSpec{User: subject.Name}
	if subject.Kind == rbacv1.ServiceAccountKind {
		spec.User = "system:serviceaccount:" + subject.Namespace + ":" + subject.Name
		spec.Groups = []string{"system:serviceaccounts", "system:serviceaccounts:" + subject.Namespace, "system:authenticated"}
	}
	for _, g := range granted {
		for _, rule := range g.rules {
			for _, verb := range rule.Verbs {
				attrs := &authorizationv1.ResourceAttributes{Namespace: g.namespace, Verb: verb, Group: rule.APIGroups[0], Resource: rule.Resources[0]}
				if len(rule.ResourceNames) > 0 {
					attrs.Name = rule.ResourceNames[0]
				}
				sar := &authorizationv1.SubjectAccessReview{Spec: spec}
				sar.Spec.ResourceAttributes = attrs
				err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
					out, err := client.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
					return err == nil && out.Status.Allowed, nil
				})
				if err != nil {
					t.Fatalf("the authorizer never allowed %s to %s %+v: %v", spec.User, verb, attrs, err)
				}
			}
		}
	}
}

// restrictedUsers records which RBAC files each restricted user holds, so
// that zz_rbac_test.go can check every call the API server's audit log shows
// them making against those files.
var restrictedUsers = userFiles{m: map[string][]string{}}

type userFiles struct {
	mu sync.Mutex
	m  map[string][]string
}

func (u *userFiles) add(user string, files []string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.m[user] = slices.Clone(files)
}

func (u *userFiles) get(user string) ([]string, bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	f, ok := u.m[user]
	return f, ok
}

func ignoreNotFound(t *testing.T, err error) {
	if err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("cleanup: %v", err)
	}
}
