package e2e

import (
	"bytes"
	"context"
	"os"
	"path/filepath"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
	root, err := testenv.RepoRoot()
	if err != nil {
		r.t.Fatal(err)
	}
	rbac := r.client.RbacV1()
	subject := []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}
	for _, file := range files {
		data, err := os.ReadFile(filepath.Join(root, "deploy", "kubernetes", "base", file))
		if err != nil {
			r.t.Fatal(err)
		}
		for doc := range bytes.SplitSeq(data, []byte("\n---\n")) {
			var head metav1.TypeMeta
			if err := yaml.Unmarshal(doc, &head); err != nil {
				r.t.Fatalf("%s: %v", file, err)
			}
			switch head.Kind {
			case "ClusterRole":
				var role rbacv1.ClusterRole
				if err := yaml.UnmarshalStrict(doc, &role); err != nil {
					r.t.Fatalf("%s: %v", file, err)
				}
				role.Name += "-" + user
				if _, err := rbac.ClusterRoles().Create(r.ctx, &role, metav1.CreateOptions{}); err != nil {
					r.t.Fatalf("%s: create ClusterRole: %v", file, err)
				}
				binding := &rbacv1.ClusterRoleBinding{
					ObjectMeta: metav1.ObjectMeta{Name: role.Name},
					RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
					Subjects:   subject,
				}
				if _, err := rbac.ClusterRoleBindings().Create(r.ctx, binding, metav1.CreateOptions{}); err != nil {
					r.t.Fatalf("%s: create ClusterRoleBinding: %v", file, err)
				}
				r.t.Cleanup(func() {
					ctx := context.WithoutCancel(r.ctx)
					ignoreNotFound(r, rbac.ClusterRoleBindings().Delete(ctx, role.Name, metav1.DeleteOptions{}))
					ignoreNotFound(r, rbac.ClusterRoles().Delete(ctx, role.Name, metav1.DeleteOptions{}))
				})
			case "Role":
				var role rbacv1.Role
				if err := yaml.UnmarshalStrict(doc, &role); err != nil {
					r.t.Fatalf("%s: %v", file, err)
				}
				role.Namespace = namespace
				role.Name += "-" + user
				if _, err := rbac.Roles(namespace).Create(r.ctx, &role, metav1.CreateOptions{}); err != nil {
					r.t.Fatalf("%s: create Role: %v", file, err)
				}
				binding := &rbacv1.RoleBinding{
					ObjectMeta: metav1.ObjectMeta{Name: role.Name, Namespace: namespace},
					RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
					Subjects:   subject,
				}
				if _, err := rbac.RoleBindings(namespace).Create(r.ctx, binding, metav1.CreateOptions{}); err != nil {
					r.t.Fatalf("%s: create RoleBinding: %v", file, err)
				}
				r.t.Cleanup(func() {
					ctx := context.WithoutCancel(r.ctx)
					ignoreNotFound(r, rbac.RoleBindings(namespace).Delete(ctx, role.Name, metav1.DeleteOptions{}))
					ignoreNotFound(r, rbac.Roles(namespace).Delete(ctx, role.Name, metav1.DeleteOptions{}))
				})
			case "":
			default:
				r.t.Fatalf("%s: unexpected kind %q in an RBAC file", file, head.Kind)
			}
		}
	}
	return r.env.UserKubeconfig(r.t, user)
}

func ignoreNotFound(r *rig, err error) {
	if err != nil && !apierrors.IsNotFound(err) {
		r.t.Errorf("cleanup: %v", err)
	}
}
