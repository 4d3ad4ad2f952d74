// Package testenv gives loopvol's tests a real Kubernetes control plane
// (kube-apiserver and etcd) and the root checks that real-node tests need.
//
// Why a real API server and not client-go's fake clientset: the fake one
// does no validation, no defaulting, no admission, no RBAC, no field
// selectors and no resourceVersion conflicts, and those are exactly where a
// CSI driver's controller code goes wrong. envtest (controller-runtime) runs
// the real binaries; this package wraps it so that every test package starts
// it the same way:
//
//   - The binaries come only from the repository's bin/, built from the
//     versions pinned in hack/tools by `make tools`. envtest never downloads
//     anything (there is no network here, and a test must not depend on
//     whatever KUBEBUILDER_ASSETS or /usr/local/kubebuilder happens to hold),
//     so the paths are set explicitly and USE_EXISTING_CLUSTER is ignored.
//   - When bin/ lacks them a test skips with a message naming `make tools`,
//     so `go test ./...` on a fresh clone still works; under CI (CI=true) the
//     same check fails instead, because a CI run that silently skipped the
//     control-plane tests would prove nothing.
//   - Stopping leaves no process and no temporary directory behind, and a
//     watchdog does the same when the test binary dies without stopping (a
//     -timeout panic, ^C, os.Exit), because envtest starts its processes in
//     their own process group where nothing else would reach them.
//   - A test that runs separate loopvol binaries against the API server gets
//     a kubeconfig file with the same admin (system:masters) credentials.
//
// Only the API server and etcd run: no controller-manager, scheduler or
// kubelet. So namespaces are never finalized (a deleted one stays
// Terminating), no ServiceAccount or token is made for a namespace, nothing
// is garbage-collected and no Pod is ever scheduled. Tests create what they
// need and use a fresh namespace each rather than deleting and re-creating.
//
// One control plane takes a few seconds to start, so a package with many
// tests shares one through [Shared] from TestMain, and a lone test uses
// [Start].
package testenv
