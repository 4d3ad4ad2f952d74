// Package multinode holds the tests that run on a real cluster of two
// nodes on this machine (internal/harness/cluster with Config.Nodes): each
// node its own network and mount namespaces, kubelet and containerd, joined
// by a bridge. A shared pool (one host directory every node sees, the
// stand-in for NFS) and pools of each node's own (distributed) are
// deployed from deploy/kubernetes as users would, and volumes, Pods and
// nodes are taken through what a cluster of nodes does to them: a Pod
// moved to the other node, fencing, Multi-Attach, drain, capacity-aware
// scheduling. `make test-multinode` builds what they need and runs them as
// root.
package multinode
