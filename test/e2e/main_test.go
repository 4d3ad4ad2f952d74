// Package e2e runs loopvol's real binaries against a real control plane: a
// kube-apiserver and etcd from bin/ (internal/harness/testenv), the driver
// built from cmd/driver (--mode=all, plus --mode=node processes for more
// nodes on the same pool) and the attacher built from cmd/attacher. The
// tests create CSINode, PersistentVolume and VolumeAttachment objects the
// way kubelet and the attach/detach controller of kube-controller-manager
// would, and check the outcome on both sides: the objects (status, errors,
// finalizers) and the driver (its ListVolumes published_node_ids and its
// call counts on /metrics).
//
// No controller-manager runs, so nothing else touches the objects: what
// changes them is the attacher under test. VolumeAttachments, PVs and
// CSINodes are cluster-scoped and every attacher watches all of them, so
// the tests run one after another (never t.Parallel), each with its own
// driver, pool, node names and attacher processes, and each removes its
// objects when it ends.
//
// The tests need root (the driver runs as it does on a node) and bin/
// kube-apiserver and bin/etcd (`make tools`); without them they skip (under
// CI=true a missing control plane fails instead). `make test-e2e` runs them;
// the Makefile's unit-test target leaves test/ out. The whole package takes
// about a minute on two cores.
package e2e

import (
	"os"
	"testing"

	"github.com/loopvol/loopvol/internal/harness/testenv"
	"github.com/loopvol/loopvol/test/internal/attacherproc"
	"github.com/loopvol/loopvol/test/internal/driverproc"
)

// cluster has an audit log: zz_rbac_test.go checks every call the components made.
var cluster = testenv.Shared{Options: testenv.Options{AuditLog: true}}

func TestMain(m *testing.M) {
	code := cluster.Run(m)
	driverproc.Cleanup()
	attacherproc.Cleanup()
	os.Exit(code)
}
