package model

// Addresses: 198.18.0.0/16 nodes and pods (198.18.1.x and 198.18.2.x pod
// endpoints, all on port 80), 198.19.0.0/16 service IPs, fd00::/8 ULAs for
// IPv6 (unused here).
//
// The scenarios and expected results of TestSelectEndpoints follow upstream's
// pkg/proxy/topology_test.go (TestCategorizeEndpoints), with upstream's
// 10.1.2.x endpoints written as 198.18.1.x and 10.0.0.N as 198.18.2.1N; the
// same-node cases follow upstream's topology.go rules for node hints.

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/util/sets"
)

// selEP is an endpoint for selection tests: by default neither ready, serving
// nor terminating, not local, without hints, like upstream's test endpoints.
func selEP(ipPort string, opts ...func(*Endpoint)) *Endpoint {
	ap := netip.MustParseAddrPort(ipPort)
	e := &Endpoint{IP: ap.Addr(), Port: int32(ap.Port())}
	for _, o := range opts {
		o(e)
	}
	return e
}

func ready(e *Endpoint)       { e.Ready, e.Serving = true, true }
func servingTerm(e *Endpoint) { e.Serving, e.Terminating = true, true }
func local(e *Endpoint)       { e.Local, e.NodeName = true, thisNode }
func zoneHints(z ...string) func(*Endpoint) {
	return func(e *Endpoint) { e.ZoneHints = sets.New(z...) }
}
func nodeHints(n ...string) func(*Endpoint) {
	return func(e *Endpoint) { e.NodeHints = sets.New(n...) }
}

// selPort is a ClusterIP service port edited by opts.
func selPort(opts ...func(*ServicePort)) *ServicePort {
	p := &ServicePort{Name: httpName, Family: IPv4, ClusterIP: clusterV4, Port: 80, Protocol: TCP}
	for _, o := range opts {
		o(p)
	}
	return p
}

func nodePort8080(p *ServicePort) { p.NodePort = 8080 }
func etpLocal(p *ServicePort)     { p.ExternalPolicyLocal = true }
func itpLocal(p *ServicePort)     { p.InternalPolicyLocal = true }

func epStrings(eps []*Endpoint) []string {
	var out []string
	for _, e := range eps {
		out = append(out, e.String())
	}
	return out
}

func sortedEPStrings(eps []*Endpoint) []string {
	out := epStrings(eps)
	slices.Sort(out)
	return out
}

func TestSelectEndpoints(t *testing.T) {
	type testCase struct {
		name string
		zone string // this node's zone label
		port *ServicePort
		eps  []*Endpoint

		// Expected endpoints (in any order). nil and empty mean the same;
		// whether a list is used at all is the port's UsesCluster/LocalEndpoints.
		wantCluster, wantLocal []string
		// wantAll is needed only when both lists are in use.
		wantAll             []string
		wantHasAny          bool
		wantTopology        string
		wantClusterFallback bool
		wantLocalFallback   bool
	}
	tests := []testCase{{
		name: "topology used: all endpoints have zone hints, node has a zone, some are for it",
		zone: "zone-a", port: selPort(),
		eps: []*Endpoint{
			selEP("198.18.1.3:80", zoneHints("zone-a"), ready),
			selEP("198.18.1.4:80", zoneHints("zone-b"), ready),
			selEP("198.18.1.5:80", zoneHints("zone-c"), ready),
			selEP("198.18.1.6:80", zoneHints("zone-a"), ready),
		},
		wantCluster: []string{"198.18.1.3:80", "198.18.1.6:80"},
		wantHasAny:  true, wantTopology: TopologyZone,
	}, {
		name: "externalTrafficPolicy Local: topology ignored for local endpoints",
		zone: "zone-a", port: selPort(etpLocal, nodePort8080),
		eps: []*Endpoint{
			selEP("198.18.1.3:80", zoneHints("zone-a"), ready, local),
			selEP("198.18.1.4:80", zoneHints("zone-b"), ready, local),
			selEP("198.18.1.5:80", zoneHints("zone-c"), ready),
			selEP("198.18.1.6:80", zoneHints("zone-a"), ready),
		},
		wantCluster: []string{"198.18.1.3:80", "198.18.1.6:80"},
		wantLocal:   []string{"198.18.1.3:80", "198.18.1.4:80"},
		wantAll:     []string{"198.18.1.3:80", "198.18.1.4:80", "198.18.1.6:80"},
		wantHasAny:  true, wantTopology: TopologyZone,
	}, {
		name: "internalTrafficPolicy Local: topology ignored for local endpoints",
		zone: "zone-a", port: selPort(itpLocal, nodePort8080),
		eps: []*Endpoint{
			selEP("198.18.1.3:80", zoneHints("zone-a"), ready, local),
			selEP("198.18.1.4:80", zoneHints("zone-b"), ready, local),
			selEP("198.18.1.5:80", zoneHints("zone-c"), ready),
			selEP("198.18.1.6:80", zoneHints("zone-a"), ready),
		},
		wantCluster: []string{"198.18.1.3:80", "198.18.1.6:80"},
		wantLocal:   []string{"198.18.1.3:80", "198.18.1.4:80"},
		wantAll:     []string{"198.18.1.3:80", "198.18.1.4:80", "198.18.1.6:80"},
		wantHasAny:  true, wantTopology: TopologyZone,
	}, {
		name: "node without a zone label: no topology",
		zone: "", port: selPort(),
		eps:         []*Endpoint{selEP("198.18.1.3:80", zoneHints("zone-a"), ready)},
		wantCluster: []string{"198.18.1.3:80"},
		wantHasAny:  true, wantTopology: TopologyNone,
	}, {
		name: "node in a zone no endpoint is hinted for: no filtering",
		zone: "zone-b", port: selPort(),
		eps:         []*Endpoint{selEP("198.18.1.3:80", zoneHints("zone-a"), ready)},
		wantCluster: []string{"198.18.1.3:80"},
		wantHasAny:  true, wantTopology: TopologyNone,
	}, {
		name: "unready endpoint is left out",
		zone: "zone-a", port: selPort(),
		eps: []*Endpoint{
			selEP("198.18.1.3:80", zoneHints("zone-a"), ready),
			selEP("198.18.1.4:80", zoneHints("zone-b"), ready),
			selEP("198.18.1.5:80", zoneHints("zone-c"), ready),
			selEP("198.18.1.6:80", zoneHints("zone-a")),
		},
		wantCluster: []string{"198.18.1.3:80"},
		wantHasAny:  true, wantTopology: TopologyZone,
	}, {
		name: "only unready endpoints in this zone: topology not used",
		zone: "zone-a", port: selPort(),
		eps: []*Endpoint{
			selEP("198.18.1.3:80", zoneHints("zone-a")),
			selEP("198.18.1.4:80", zoneHints("zone-b"), ready),
			selEP("198.18.1.5:80", zoneHints("zone-c"), ready),
			selEP("198.18.1.6:80", zoneHints("zone-a")),
		},
		wantCluster: []string{"198.18.1.4:80", "198.18.1.5:80"},
		wantHasAny:  true, wantTopology: TopologyNone,
	}, {
		name: "an endpoint without hints: no filtering",
		zone: "zone-a", port: selPort(),
		eps: []*Endpoint{
			selEP("198.18.1.3:80", zoneHints("zone-a"), ready),
			selEP("198.18.1.4:80", zoneHints("zone-b"), ready),
			selEP("198.18.1.5:80", ready),
			selEP("198.18.1.6:80", zoneHints("zone-a"), ready),
		},
		wantCluster: []string{"198.18.1.3:80", "198.18.1.4:80", "198.18.1.5:80", "198.18.1.6:80"},
		wantHasAny:  true, wantTopology: TopologyNone,
	}, {
		name: "unready endpoint without hints does not stop topology",
		zone: "zone-a", port: selPort(),
		eps: []*Endpoint{
			selEP("198.18.1.3:80", zoneHints("zone-a"), ready),
			selEP("198.18.1.4:80", zoneHints("zone-b"), ready),
			selEP("198.18.1.5:80"),
		},
		wantCluster: []string{"198.18.1.3:80"},
		wantHasAny:  true, wantTopology: TopologyZone,
	}, {
		name: "several hints per endpoint: any endpoint hinted for this zone",
		zone: "zone-c", port: selPort(),
		eps: []*Endpoint{
			selEP("198.18.1.3:80", zoneHints("zone-a", "zone-b", "zone-c"), ready),
			selEP("198.18.1.4:80", zoneHints("zone-b", "zone-c"), ready),
			selEP("198.18.1.5:80", zoneHints("zone-b", "zone-d"), ready),
			selEP("198.18.1.6:80", zoneHints("zone-c"), ready),
		},
		wantCluster: []string{"198.18.1.3:80", "198.18.1.4:80", "198.18.1.6:80"},
		wantHasAny:  true, wantTopology: TopologyZone,
	}, {
		name: "conflicting topology and localness: AllReachable merges both",
		zone: "zone-a", port: selPort(etpLocal, nodePort8080),
		eps: []*Endpoint{
			selEP("198.18.2.10:80", zoneHints("zone-a"), ready, local),
			selEP("198.18.2.11:80", zoneHints("zone-b"), ready, local),
			selEP("198.18.2.12:80", zoneHints("zone-a"), ready),
			selEP("198.18.2.13:80", zoneHints("zone-b"), ready),
		},
		wantCluster: []string{"198.18.2.10:80", "198.18.2.12:80"},
		wantLocal:   []string{"198.18.2.10:80", "198.18.2.11:80"},
		wantAll:     []string{"198.18.2.10:80", "198.18.2.11:80", "198.18.2.12:80"},
		wantHasAny:  true, wantTopology: TopologyZone,
	}, {
		name: "internalTrafficPolicy Local, no endpoints",
		port: selPort(itpLocal),
	}, {
		name: "internalTrafficPolicy Local, all endpoints remote: drop, not reject",
		port: selPort(itpLocal),
		eps: []*Endpoint{
			selEP("198.18.2.10:80", ready),
			selEP("198.18.2.11:80", ready),
		},
		wantHasAny: true,
	}, {
		name: "internalTrafficPolicy Local, all endpoints local",
		port: selPort(itpLocal),
		eps: []*Endpoint{
			selEP("198.18.2.10:80", ready, local),
			selEP("198.18.2.11:80", ready, local),
		},
		wantLocal:  []string{"198.18.2.10:80", "198.18.2.11:80"},
		wantHasAny: true,
	}, {
		name: "internalTrafficPolicy Local, some endpoints local",
		port: selPort(itpLocal),
		eps: []*Endpoint{
			selEP("198.18.2.10:80", ready, local),
			selEP("198.18.2.11:80", ready),
		},
		wantLocal:  []string{"198.18.2.10:80"},
		wantHasAny: true,
	}, {
		name: "Cluster policy, no endpoint ready",
		port: selPort(),
		eps: []*Endpoint{
			selEP("198.18.2.10:80"),
			selEP("198.18.2.11:80"),
		},
	}, {
		name: "Cluster policy, some endpoints ready",
		port: selPort(),
		eps: []*Endpoint{
			selEP("198.18.2.10:80"),
			selEP("198.18.2.11:80", ready),
		},
		wantCluster: []string{"198.18.2.11:80"},
		wantHasAny:  true,
	}, {
		name: "Cluster policy, all endpoints terminating: serving ones are used",
		port: selPort(),
		eps: []*Endpoint{
			selEP("198.18.2.10:80", servingTerm, local),
			selEP("198.18.2.11:80", servingTerm),
		},
		wantCluster: []string{"198.18.2.10:80", "198.18.2.11:80"},
		wantHasAny:  true, wantClusterFallback: true,
	}, {
		name: "Cluster policy, terminating but not serving endpoints are never used",
		port: selPort(),
		eps: []*Endpoint{
			selEP("198.18.2.10:80", func(e *Endpoint) { e.Terminating = true }),
		},
	}, {
		name: "Cluster policy, ready endpoints win over terminating ones",
		port: selPort(),
		eps: []*Endpoint{
			selEP("198.18.2.10:80", servingTerm),
			selEP("198.18.2.11:80", ready),
		},
		wantCluster: []string{"198.18.2.11:80"},
		wantHasAny:  true,
	}, {
		name: "iTP Local, eTP Cluster, some endpoints local",
		port: selPort(itpLocal, nodePort8080),
		eps: []*Endpoint{
			selEP("198.18.2.10:80", ready, local),
			selEP("198.18.2.11:80", ready),
		},
		wantCluster: []string{"198.18.2.10:80", "198.18.2.11:80"},
		wantLocal:   []string{"198.18.2.10:80"},
		wantAll:     []string{"198.18.2.10:80", "198.18.2.11:80"},
		wantHasAny:  true,
	}, {
		name: "iTP Cluster, eTP Local, some endpoints local",
		port: selPort(etpLocal, nodePort8080),
		eps: []*Endpoint{
			selEP("198.18.2.10:80", ready, local),
			selEP("198.18.2.11:80", ready),
		},
		wantCluster: []string{"198.18.2.10:80", "198.18.2.11:80"},
		wantLocal:   []string{"198.18.2.10:80"},
		wantAll:     []string{"198.18.2.10:80", "198.18.2.11:80"},
		wantHasAny:  true,
	}, {
		// Externally accessible: cluster endpoints are still needed to short
		// circuit traffic from pods to the node port or external IPs.
		name: "iTP Local, eTP Local, some endpoints local",
		port: selPort(itpLocal, etpLocal, nodePort8080),
		eps: []*Endpoint{
			selEP("198.18.2.10:80", ready, local),
			selEP("198.18.2.11:80", ready),
		},
		wantCluster: []string{"198.18.2.10:80", "198.18.2.11:80"},
		wantLocal:   []string{"198.18.2.10:80"},
		wantAll:     []string{"198.18.2.10:80", "198.18.2.11:80"},
		wantHasAny:  true,
	}, {
		name: "iTP Local, eTP Local, all endpoints remote",
		port: selPort(itpLocal, etpLocal, nodePort8080),
		eps: []*Endpoint{
			selEP("198.18.2.10:80", ready),
			selEP("198.18.2.11:80", ready),
		},
		wantCluster: []string{"198.18.2.10:80", "198.18.2.11:80"},
		wantAll:     []string{"198.18.2.10:80", "198.18.2.11:80"},
		wantHasAny:  true,
	}, {
		name: "iTP Local, eTP Local, all endpoints remote and terminating",
		port: selPort(itpLocal, etpLocal, nodePort8080),
		eps: []*Endpoint{
			selEP("198.18.2.10:80", servingTerm),
			selEP("198.18.2.11:80", servingTerm),
		},
		wantCluster: []string{"198.18.2.10:80", "198.18.2.11:80"},
		wantAll:     []string{"198.18.2.10:80", "198.18.2.11:80"},
		wantHasAny:  true, wantClusterFallback: true,
	}, {
		name: "iTP Cluster, eTP Local, terminating endpoints: local falls back on its own",
		port: selPort(etpLocal, nodePort8080),
		eps: []*Endpoint{
			selEP("198.18.2.10:80", ready),
			selEP("198.18.2.11:80", local),
			selEP("198.18.2.12:80", servingTerm, local),
			selEP("198.18.2.13:80", servingTerm),
		},
		wantCluster: []string{"198.18.2.10:80"},
		wantLocal:   []string{"198.18.2.12:80"},
		wantAll:     []string{"198.18.2.10:80", "198.18.2.12:80"},
		wantHasAny:  true, wantLocalFallback: true,
	}, {
		name: "externalTrafficPolicy ignored when not externally accessible",
		port: selPort(etpLocal),
		eps: []*Endpoint{
			selEP("198.18.2.10:80", ready),
			selEP("198.18.2.11:80", ready, local),
		},
		wantCluster: []string{"198.18.2.10:80", "198.18.2.11:80"},
		wantHasAny:  true,
	}, {
		name: "no cluster endpoints for an iTP Local internal-only service",
		port: selPort(itpLocal),
		eps: []*Endpoint{
			selEP("198.18.2.10:80", ready),
			selEP("198.18.2.11:80", ready, local),
		},
		wantLocal:  []string{"198.18.2.11:80"},
		wantHasAny: true,
	}, {
		name: "iTP Local: local terminating endpoints used only when no local one is ready",
		port: selPort(itpLocal),
		eps: []*Endpoint{
			selEP("198.18.2.10:80", servingTerm, local),
			selEP("198.18.2.11:80", ready),
		},
		wantLocal:  []string{"198.18.2.10:80"},
		wantHasAny: true, wantLocalFallback: true,
	}, {
		name: "iTP Local: only terminating endpoints elsewhere still count for HasAny",
		port: selPort(itpLocal),
		eps: []*Endpoint{
			selEP("198.18.2.10:80", servingTerm),
			selEP("198.18.2.11:80", local),
		},
		wantHasAny: true,
	}, {
		name: "same node: every endpoint has node hints and one is for this node",
		zone: "zone-a", port: selPort(),
		eps: []*Endpoint{
			selEP("198.18.1.3:80", zoneHints("zone-a"), nodeHints(thisNode), ready, local),
			selEP("198.18.1.4:80", zoneHints("zone-a"), nodeHints("node-b"), ready),
			selEP("198.18.1.5:80", zoneHints("zone-b"), nodeHints("node-c"), ready),
		},
		wantCluster: []string{"198.18.1.3:80"},
		wantHasAny:  true, wantTopology: TopologyNode,
	}, {
		name: "same node: several endpoints hinted for this node",
		port: selPort(),
		eps: []*Endpoint{
			selEP("198.18.1.3:80", nodeHints(thisNode), ready, local),
			selEP("198.18.1.4:80", nodeHints(thisNode, "node-b"), ready),
			selEP("198.18.1.5:80", nodeHints("node-b"), ready),
		},
		wantCluster: []string{"198.18.1.3:80", "198.18.1.4:80"},
		wantHasAny:  true, wantTopology: TopologyNode,
	}, {
		name: "same node: no endpoint for this node falls back to zone hints",
		zone: "zone-a", port: selPort(),
		eps: []*Endpoint{
			selEP("198.18.1.3:80", zoneHints("zone-a"), nodeHints("node-b"), ready),
			selEP("198.18.1.4:80", zoneHints("zone-b"), nodeHints("node-c"), ready),
		},
		wantCluster: []string{"198.18.1.3:80"},
		wantHasAny:  true, wantTopology: TopologyZone,
	}, {
		name: "same node: an endpoint without node hints falls back to zone hints",
		zone: "zone-a", port: selPort(),
		eps: []*Endpoint{
			selEP("198.18.1.3:80", zoneHints("zone-a"), nodeHints(thisNode), ready, local),
			selEP("198.18.1.4:80", zoneHints("zone-a"), ready),
			selEP("198.18.1.5:80", zoneHints("zone-b"), nodeHints("node-c"), ready),
		},
		wantCluster: []string{"198.18.1.3:80", "198.18.1.4:80"},
		wantHasAny:  true, wantTopology: TopologyZone,
	}, {
		name: "same node: no endpoint for this node and no zone hints: no topology",
		zone: "zone-a", port: selPort(),
		eps: []*Endpoint{
			selEP("198.18.1.3:80", nodeHints("node-b"), ready),
			selEP("198.18.1.4:80", nodeHints("node-c"), ready),
		},
		wantCluster: []string{"198.18.1.3:80", "198.18.1.4:80"},
		wantHasAny:  true, wantTopology: TopologyNone,
	}, {
		name: "same node: the only endpoint for this node is unready: zone hints",
		zone: "zone-a", port: selPort(),
		eps: []*Endpoint{
			selEP("198.18.1.3:80", zoneHints("zone-a"), nodeHints(thisNode), local),
			selEP("198.18.1.4:80", zoneHints("zone-a"), nodeHints("node-b"), ready),
			selEP("198.18.1.5:80", zoneHints("zone-b"), nodeHints("node-c"), ready),
		},
		wantCluster: []string{"198.18.1.4:80"},
		wantHasAny:  true, wantTopology: TopologyZone,
	}, {
		name: "same node with externalTrafficPolicy Local: local list ignores hints",
		port: selPort(etpLocal, nodePort8080),
		eps: []*Endpoint{
			selEP("198.18.1.3:80", nodeHints(thisNode), ready),
			selEP("198.18.1.4:80", nodeHints("node-b"), ready, local),
		},
		wantCluster: []string{"198.18.1.3:80"},
		wantLocal:   []string{"198.18.1.4:80"},
		wantAll:     []string{"198.18.1.3:80", "198.18.1.4:80"},
		wantHasAny:  true, wantTopology: TopologyNode,
	}, {
		name: "hints are ignored when only terminating endpoints are left",
		zone: "zone-a", port: selPort(),
		eps: []*Endpoint{
			selEP("198.18.1.3:80", zoneHints("zone-a"), servingTerm),
			selEP("198.18.1.4:80", zoneHints("zone-b"), servingTerm),
		},
		wantCluster: []string{"198.18.1.3:80", "198.18.1.4:80"},
		wantHasAny:  true, wantTopology: TopologyNone, wantClusterFallback: true,
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sel := SelectEndpoints(tc.port, tc.eps, thisNode, tc.zone)
			cmpList := func(what string, want []string, got []*Endpoint) {
				t.Helper()
				slices.Sort(want)
				if diff := cmp.Diff(want, sortedEPStrings(got)); diff != "" {
					t.Errorf("%s (-want +got):\n%s", what, diff)
				}
			}
			cmpList("Cluster", tc.wantCluster, sel.Cluster)
			cmpList("Local", tc.wantLocal, sel.Local)
			wantAll := tc.wantAll
			switch {
			case !tc.port.UsesLocalEndpoints():
				wantAll = tc.wantCluster
			case !tc.port.UsesClusterEndpoints():
				wantAll = tc.wantLocal
			}
			cmpList("AllReachable", wantAll, sel.AllReachable)
			if !slices.IsSortedFunc(sel.AllReachable, func(x, y *Endpoint) int { return x.AddrPort().Compare(y.AddrPort()) }) {
				t.Errorf("AllReachable is not sorted: %v", epStrings(sel.AllReachable))
			}
			if sel.HasAny != tc.wantHasAny {
				t.Errorf("HasAny = %v, want %v", sel.HasAny, tc.wantHasAny)
			}
			if sel.Topology != tc.wantTopology {
				t.Errorf("Topology = %q, want %q", sel.Topology, tc.wantTopology)
			}
			if sel.ClusterFallback != tc.wantClusterFallback || sel.LocalFallback != tc.wantLocalFallback {
				t.Errorf("ClusterFallback, LocalFallback = %v, %v; want %v, %v",
					sel.ClusterFallback, sel.LocalFallback, tc.wantClusterFallback, tc.wantLocalFallback)
			}
			// Every endpoint is either selected or excluded with a reason.
			for _, e := range tc.eps {
				selected := slices.Contains(sel.Cluster, e) || slices.Contains(sel.Local, e)
				why, excluded := sel.Excluded[e]
				if selected == excluded {
					t.Errorf("endpoint %s: selected=%v, excluded=%v (%q); want exactly one", e, selected, excluded, why)
				}
				if excluded && (why == "" || why == "not used") {
					t.Errorf("endpoint %s excluded without a specific reason: %q", e, why)
				}
			}
		})
	}
}

func TestSelectEndpointsExcluded(t *testing.T) {
	tests := []struct {
		name string
		zone string
		port *ServicePort
		eps  []*Endpoint
		want map[string]string // endpoint → reason; selected endpoints absent
	}{{
		name: "not ready, and terminating while ready ones exist",
		port: selPort(),
		eps: []*Endpoint{
			selEP("198.18.2.10:80", ready),
			selEP("198.18.2.11:80"),
			selEP("198.18.2.12:80", servingTerm),
			selEP("198.18.2.13:80", func(e *Endpoint) { e.Terminating = true }),
		},
		want: map[string]string{
			"198.18.2.11:80": "not ready",
			"198.18.2.12:80": "terminating; ready endpoints exist",
			"198.18.2.13:80": "not ready",
		},
	}, {
		name: "zone topology",
		zone: "zone-a", port: selPort(),
		eps: []*Endpoint{
			selEP("198.18.2.10:80", ready, zoneHints("zone-a")),
			selEP("198.18.2.11:80", ready, zoneHints("zone-b")),
		},
		want: map[string]string{"198.18.2.11:80": "topology: hinted for other zones"},
	}, {
		name: "node topology",
		port: selPort(),
		eps: []*Endpoint{
			selEP("198.18.2.10:80", ready, nodeHints(thisNode)),
			selEP("198.18.2.11:80", ready, nodeHints("node-b")),
		},
		want: map[string]string{"198.18.2.11:80": "topology: hinted for other nodes"},
	}, {
		name: "internalTrafficPolicy Local",
		port: selPort(itpLocal),
		eps: []*Endpoint{
			selEP("198.18.2.10:80", ready, local),
			selEP("198.18.2.11:80", servingTerm, local),
			selEP("198.18.2.12:80", ready),
			selEP("198.18.2.13:80", servingTerm),
		},
		want: map[string]string{
			"198.18.2.11:80": "terminating; ready local endpoints exist",
			"198.18.2.12:80": "on another node; traffic policy Local",
			"198.18.2.13:80": "on another node; traffic policy Local",
		},
	}, {
		name: "externalTrafficPolicy Local: a local endpoint filtered by topology is still used",
		zone: "zone-a", port: selPort(etpLocal, nodePort8080),
		eps: []*Endpoint{
			selEP("198.18.2.10:80", ready, zoneHints("zone-a")),
			selEP("198.18.2.11:80", ready, local, zoneHints("zone-b")),
			selEP("198.18.2.12:80", ready, zoneHints("zone-b")),
		},
		want: map[string]string{"198.18.2.12:80": "topology: hinted for other zones"},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sel := SelectEndpoints(tc.port, tc.eps, thisNode, tc.zone)
			got := map[string]string{}
			for e, why := range sel.Excluded {
				got[e.String()] = why
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Excluded (-want +got):\n%s", diff)
			}
		})
	}
}
