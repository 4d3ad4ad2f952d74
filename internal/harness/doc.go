// Package harness is the parent of what loopvol's tests and its demo run
// around the binaries. Nothing under it ships: the two binaries (cmd/driver
// and cmd/attacher) and the packages they are built from (pkg/...,
// internal/kube, internal/unixsock) never import it.
//
//   - cluster brings up a real one-node Kubernetes cluster on this machine,
//     for `make demo` (hack/demo) and the suites in test/cluster and
//     test/e2e-k8s; cluster/clustertest adds what those suites share on top.
//   - testenv starts kube-apiserver and etcd from bin/ through envtest, for
//     the tests that need a real API server.
//   - testcert makes throwaway CAs and serving certificates.
//   - testfs makes the small real filesystems tests put pools on (a
//     loop-mounted xfs with reflink, a small ext4, one filled to ENOSPC).
//   - proc runs a binary as a real process with its log in a file: the
//     cluster's daemons and the loopvol and upstream binaries the suites
//     under test/ start.
//
// A test file of a shipped package may import a harness package (pkg/webhook's
// tests use testcert, pkg/pool's testfs); the code the binaries are built from may not.
// TestShippedImportsNoHarness checks that with `go list -deps ./cmd/...
// ./pkg/...`.
//
// Why under internal/ and not test/internal/: Go lets only the tree rooted
// at internal's parent import a package under internal/, and hack/demo
// imports cluster, so the harness cannot live under test/internal/. The
// helpers that only the suites under test/ use (gobuild, modbuild,
// driverproc, attacherproc, extattacher, extprovisioner) stay there.
package harness
