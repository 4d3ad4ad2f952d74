//go:build tools

// Package containerd pins the container runtime of the one-node cluster
// (internal/harness/cluster): containerd, its runc shim and ctr. It is a
// module of its own so that containerd gets exactly the dependency graph
// its release declares, apart from Kubernetes' (../go.mod).
//
// The build tag keeps this file out of every build; the blank imports only
// make `go mod tidy` keep the modules and go.sum lines that build.sh needs.
package containerd

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
