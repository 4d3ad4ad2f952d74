//go:build tools

// Package populator pins the volume populator that the upstream e2e
// suite's "provision storage with any volume data source" spec deploys:
// hello-populator, the example of kubernetes-csi/lib-volume-populator,
// which fills a new volume with one file named by a Hello object. A module
// of its own, like ../attacher, so that its old client-go stays out of the
// Kubernetes build in ../go.mod.
//
// The build tag keeps this file out of every build; the blank import only
// makes `go mod tidy` keep the modules and go.sum lines that build.sh needs.
package populator

import (
	_ "github.com/kubernetes-csi/lib-volume-populator/example/hello-populator"
)
