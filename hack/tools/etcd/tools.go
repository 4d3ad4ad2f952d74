//go:build tools

// Package etcd pins the etcd server that envtest starts under kube-apiserver.
// It is a module of its own, apart from ../go.mod, because k8s.io/kubernetes
// v1.37.2 requires the etcd client libraries at v3.7.0: in one module, minimal
// version selection would build either etcd or kube-apiserver against
// dependency versions their releases were not tested with. Here etcd gets
// exactly the graph its v3.7.3 release declares.
//
// The build tag keeps this file out of every build; the blank import only
// makes `go mod tidy` keep the modules etcd's main package needs.
package etcd

import (
	_ "go.etcd.io/etcd/server/v3"
)
