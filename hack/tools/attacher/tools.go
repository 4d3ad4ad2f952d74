//go:build tools

// Package attacher pins the upstream csi-attacher (external-attacher) that
// the real-cluster tests swap in for loopvol's sidecar and back
// (test/cluster, the switching scenario): a drop-in must be replaceable
// both ways while volumes stay attached. A module of its own, like
// ../provisioner: the replace directives in go.mod repeat the upstream
// module's, so the binary is built against the libraries its release was
// tested with.
//
// The build tag keeps this file out of every build; the blank import only
// makes `go mod tidy` keep the modules and go.sum lines that build.sh needs.
package attacher

import (
	_ "github.com/kubernetes-csi/external-attacher/v4/cmd/csi-attacher"
)
