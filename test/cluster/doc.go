// Package cluster holds the tests that run on a real one-node Kubernetes
// cluster (internal/harness/cluster): loopvol deployed with `kubectl apply
// --server-side -k` of deploy/kubernetes/overlays/local, and real
// PersistentVolumeClaims and Pods taken through the scheduler, the
// provisioner, the attach/detach controller and kubelet. `make
// test-cluster` builds what they need (make cluster-tools images
// cluster-images) and runs them as root.
package cluster
