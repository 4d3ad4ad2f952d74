//go:build tools

// Package provisioner pins the upstream csi-provisioner
// (external-provisioner) that loopvol's controller pod runs beside its own
// sidecar. A module of its own: the replace directives in go.mod repeat the
// upstream module's (only the main module's replaces count), so the binary
// is built against the Kubernetes libraries its release was tested with.
//
// The build tag keeps this file out of every build; the blank import only
// makes `go mod tidy` keep the modules and go.sum lines that build.sh needs.
package provisioner

import (
	_ "github.com/kubernetes-csi/external-provisioner/v6/cmd/csi-provisioner"
)
