package e2e

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/loopvol/loopvol/internal/testenv"
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
// files (deploy/kubernetes/base/<file>), renamed with suffix so that
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
	for _, file := range files {
		data, err := os.ReadFile(filepath.Join(root, "deploy", "kubernetes", "base", file))
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
			case "":
			default:
				t.Fatalf("%s: unexpected kind %q in an RBAC file", file, head.Kind)
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
