// Package cluster brings up a real Kubernetes cluster on this machine, of
// one node or (Config.Nodes) of several, each node then in network, mount
// and UTS namespaces of its own (node.go, nodens.go; docs/cluster.md "A
// cluster of nodes"), reachable from nowhere else, with every piece of
// state under one directory:
// etcd, kube-apiserver (RBAC and Node authorization, NodeRestriction,
// ServiceAccount token signing), kube-controller-manager (its attach/detach
// controller makes the VolumeAttachments), kube-scheduler, containerd with
// runc and a loopback-only CNI configuration, and kubelet. The binaries are
// those hack/tools/build.sh builds into bin/ (`make cluster-tools`); the
// images are OCI archives (`make images cluster-images`) imported into
// containerd's k8s.io namespace.
//
// Up starts it and waits until the node is Ready; Deploy applies a
// kustomize overlay with `kubectl apply --server-side -k`; Down stops it and
// leaves no process, mount, loop device, kubepods cgroup or containerd shim
// behind. docs/cluster.md tells more, with the settings this kind of
// machine needs (cgroup v1, no CAP_SYS_RESOURCE, no pod network). Each
// daemon runs through internal/harness/proc, in a process group of its
// own, its output in <Dir>/logs/<name>.log.
//
// It is used by `make demo` (hack/demo) and by the tests in test/cluster.
package cluster
