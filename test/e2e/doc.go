// Package e2e runs kproxy against a real kube-apiserver: kproxy in a "node"
// network namespace, the control plane in another (see package framework),
// cluster state written through client-go, and the result checked in the
// node's kernel, on kproxy's health and metrics endpoints, and with real
// connections.
//
// The whole package runs on one control plane (sharedControlPlane, stopped
// in TestMain): each test finds it holding only what the API server makes
// itself and leaves it so; the disruption tests stop and restart its API
// server in place.
//
// The tests need root and the control-plane binaries (test/tools/build.sh).
// Without them they skip, unless KPROXY_E2E=1 (CI) makes them mandatory:
// missing binaries are then built and anything else missing is a failure.
package e2e
