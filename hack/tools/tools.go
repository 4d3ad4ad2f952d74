//go:build tools

// Package tools pins the Kubernetes commands that loopvol's tests run for
// real. It is never compiled: the build tag keeps it out of every build, and
// the blank imports only make `go mod tidy` keep the modules (and go.sum
// lines) those commands need, so build.sh can `go build` them offline from
// the module cache with exactly the versions in go.mod.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
