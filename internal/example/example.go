// Package example holds kproxy's built-in example cluster state: two nodes
// in two zones and a Service for each feature a proxy must handle, written
// as `kubectl get svc,endpointslices,nodes -A -o yaml` would write it. See
// the comment at the top of example.yaml for the address plan.
package example

import (
	_ "embed"
	"errors"
	"fmt"

	"github.com/kproxy/kproxy/internal/source/file"
)

// YAML is the example, a kubectl List.
//
//go:embed example.yaml
var YAML []byte

// FileName is the name the example is parsed under (it appears in errors
// and logs).
const FileName = "example.yaml"

// Names used in the example.
const (
	Namespace = "demo"
	NodeA     = "node-a" // zone-a
	NodeB     = "node-b" // zone-b
)

// The example's address plan (see example.yaml).
var (
	// ClusterCIDRs hold the pods' addresses (detectLocalMode ClusterCIDR).
	ClusterCIDRs = []string{"198.18.128.0/17", "fd00:18:1::/48"}
	// ServiceCIDRs hold the services' cluster IPs.
	ServiceCIDRs = []string{"198.19.0.0/16", "fd00:19::/112"}
	// NodeCIDRs hold the nodes' own addresses.
	NodeCIDRs = []string{"198.18.0.0/24", "fd00:18::/64"}
)

// Objects parses the example. Each call returns new objects, which the
// caller may change. It panics if the example does not parse cleanly,
// which the package's test rules out.
func Objects() *file.Objects {
	objs, errs := file.Parse(FileName, YAML)
	if len(errs) > 0 {
		panic(fmt.Sprintf("example.yaml: %v", errors.Join(errs...)))
	}
	return objs
}
