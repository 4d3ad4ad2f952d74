//go:build tools

// Package runc pins the OCI runtime that containerd's shim runs
// (internal/harness/cluster). A module of its own: runc gets the
// dependency graph its release declares. build.sh builds it with cgo and
// the seccomp tag (Debian's libseccomp-dev).
//
// The build tag keeps this file out of every build; the blank import only
// makes `go mod tidy` keep the modules and go.sum lines that build.sh needs.
package runc

import (
	_ "github.com/opencontainers/runc"
)
