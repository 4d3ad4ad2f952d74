//go:build tools

// Package snapshotter pins external-snapshotter: the snapshot-controller
// (cluster-wide, it binds VolumeSnapshots to VolumeSnapshotContents) and
// the csi-snapshotter sidecar (beside the driver, it calls CreateSnapshot
// and DeleteSnapshot), which the upstream storage e2e suite's snapshot
// specs need on the real cluster (test/e2e-k8s). A module of its own,
// like ../provisioner: the replace directives in go.mod repeat the
// upstream module's, so the binaries are built against the libraries its
// release was tested with.
//
// The build tag keeps this file out of every build; the blank imports
// only make `go mod tidy` keep the modules and go.sum lines that build.sh
// needs.
package snapshotter

import (
	_ "github.com/kubernetes-csi/external-snapshotter/v8/cmd/csi-snapshotter"
	_ "github.com/kubernetes-csi/external-snapshotter/v8/cmd/snapshot-controller"
)
