//go:build tools

// Package csi pins the kubernetes-csi sidecars the real-cluster tests run
// beside loopvol: csi-provisioner (external-provisioner), csi-attacher
// (external-attacher, which test/cluster's switching scenario swaps in for
// loopvol's sidecar and back), and external-snapshotter's csi-snapshotter
// sidecar and cluster-wide snapshot-controller (the upstream storage e2e
// suite's snapshot specs, test/e2e-k8s).
//
// The three are one module so that their common libraries (client-go,
// apimachinery, gRPC, Prometheus, OpenTelemetry, …) are compiled once for
// all four binaries: as modules of their own each compiled them again, and
// a cold build of the three took 9 minutes of CI's 90. The replace
// directives in go.mod are the upstream modules' own, raised from the
// Kubernetes libraries v0.37.0 that external-attacher and
// external-snapshotter release with (external-provisioner v6.4.0 released
// on v0.36.1) to the v0.37.2 of the Kubernetes tools and of loopvol itself:
// hack/alignmods keeps the libraries shared with them at one version, so
// that they are compiled once for all.
//
// The snapshot client is named too: it is the module of the same release
// as external-snapshotter (upstream replaces it by the repository's ./client),
// and its config/crd holds the CRDs test/e2e-k8s applies.
//
// The build tag keeps this file out of every build; the blank imports only
// make `go mod tidy` keep the modules and go.sum lines that build.sh needs.
package csi

import (
	_ "github.com/kubernetes-csi/external-attacher/v4/cmd/csi-attacher"
	_ "github.com/kubernetes-csi/external-provisioner/v6/cmd/csi-provisioner"
	_ "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	_ "github.com/kubernetes-csi/external-snapshotter/v8/cmd/csi-snapshotter"
	_ "github.com/kubernetes-csi/external-snapshotter/v8/cmd/snapshot-controller"
)
