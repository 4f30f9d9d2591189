// Package e2e runs kproxy against a real kube-apiserver: kproxy in a "node"
// network namespace, the control plane in another (see package framework),
// cluster state written through client-go, and the result checked in the
// node's kernel, on kproxy's health and metrics endpoints, and with real
// connections.
//
// The tests need root and the control-plane binaries (test/tools/build.sh).
// Without them they skip, unless KPROXY_E2E=1 (CI) makes them mandatory:
// missing binaries are then built and anything else missing is a failure.
package e2e
