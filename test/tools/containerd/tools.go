//go:build tools

// Package tools pins containerd 2.x and its runc shim, the container runtime
// of the test cluster's nodes (test/cluster). It is a module of its own so
// that containerd's dependency versions never meet k8s.io/kubernetes's in
// the parent test/tools module; ../build.sh builds from here.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
)
