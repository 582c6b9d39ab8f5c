//go:build tools

// Package tools records the Go programs this module pins, so that `go mod
// tidy` keeps their dependencies in go.mod/go.sum. It is never compiled
// (build tag `tools`); build.sh builds the commands themselves.
package tools

import (
	_ "github.com/rancher/local-path-provisioner"
	_ "helm.sh/helm/v3/cmd/helm"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
