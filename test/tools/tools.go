//go:build tools

// Package tools pins the binaries the end-to-end tests run. It is a separate
// module so that kproxy's own dependency graph never includes
// k8s.io/kubernetes; build.sh builds from here.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kubemark"
)
