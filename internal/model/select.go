package model

import (
	"slices"

	"k8s.io/klog/v2"
)

// Topology modes derived from EndpointSlice hints.
const (
	TopologyNone = ""
	TopologyNode = "PreferSameNode"
	TopologyZone = "PreferSameZone"
)

// Selection is the endpoints of one service port chosen for this node.
type Selection struct {
	// Cluster are used for traffic with policy Cluster; Local for traffic
	// with policy Local. AllReachable is their union, for things like
	// conntrack cleanup and affinity sets.
	Cluster, Local, AllReachable []*Endpoint
	// HasAny is true when some usable endpoint exists anywhere, even if
	// none can be used from this node: then Local traffic is dropped
	// rather than rejected.
	HasAny bool
	// Topology is the hint mode applied to Cluster.
	Topology string
	// ClusterFallback / LocalFallback are true when no ready endpoint
	// existed and serving+terminating ones were used instead.
	ClusterFallback, LocalFallback bool
	// Excluded says why each endpoint that is in neither list was left
	// out; nil when none was.
	Excluded map[*Endpoint]string
}

// SelectEndpoints applies upstream's rules (pkg/proxy/topology.go,
// CategorizeEndpoints) to the endpoints of one service port:
//   - Cluster: ready endpoints, filtered by topology hints; if there are
//     none, serving+terminating ones.
//   - Local: this node's ready endpoints; if there are none, this node's
//     serving+terminating ones.
func SelectEndpoints(sp *ServicePort, eps []*Endpoint, nodeName, zone string) Selection {
	var sel Selection
	if sp.UsesClusterEndpoints() {
		sel.Topology = topologyMode(eps, nodeName, zone)
		sel.Cluster = filter(eps, func(e *Endpoint) bool {
			return e.Ready && availableForTopology(e, sel.Topology, nodeName, zone)
		})
		if len(sel.Cluster) == 0 {
			sel.Cluster = filter(eps, func(e *Endpoint) bool { return e.Serving && e.Terminating })
			sel.ClusterFallback = len(sel.Cluster) > 0
		}
		sel.HasAny = len(sel.Cluster) > 0
	}
	if !sp.UsesLocalEndpoints() {
		sel.AllReachable = sel.Cluster
		sel.Excluded = excluded(eps, sel, nodeName, zone)
		return sel
	}
	var localReady, localServingTerminating bool
	for _, e := range eps {
		switch {
		case e.Ready:
			sel.HasAny = true
			localReady = localReady || e.Local
		case e.Serving && e.Terminating:
			sel.HasAny = true
			localServingTerminating = localServingTerminating || e.Local
		}
	}
	if localReady {
		sel.Local = filter(eps, func(e *Endpoint) bool { return e.Local && e.Ready })
	} else if localServingTerminating {
		sel.Local = filter(eps, func(e *Endpoint) bool { return e.Local && e.Serving && e.Terminating })
		sel.LocalFallback = true
	}
	if !sp.UsesClusterEndpoints() {
		sel.AllReachable = sel.Local
	} else {
		// Cluster may hold remote endpoints not in Local, and Local may hold
		// terminating or topology-filtered local ones not in Cluster.
		sel.AllReachable = slices.Clone(sel.Cluster)
		for _, e := range sel.Local {
			if !slices.Contains(sel.AllReachable, e) {
				sel.AllReachable = append(sel.AllReachable, e)
			}
		}
		slices.SortFunc(sel.AllReachable, CompareEndpoints)
	}
	sel.Excluded = excluded(eps, sel, nodeName, zone)
	return sel
}

// filter returns the endpoints keep accepts, in order (nil when none),
// counted first so that the result is allocated once.
func filter(eps []*Endpoint, keep func(*Endpoint) bool) []*Endpoint {
	n := 0
	for _, e := range eps {
		if keep(e) {
			n++
		}
	}
	if n == 0 {
		return nil
	}
	out := make([]*Endpoint, 0, n)
	for _, e := range eps {
		if keep(e) {
			out = append(out, e)
		}
	}
	return out
}

// topologyMode decides which hints apply: same-node hints only when every
// ready endpoint has node hints and one names this node; else same-zone
// hints only when every ready endpoint has zone hints and one names this
// node's zone; else none.
func topologyMode(eps []*Endpoint, nodeName, zone string) string {
	hasForNode, allNodeHints := false, true
	hasForZone, allZoneHints := false, true
	any := false
	for _, e := range eps {
		if !e.Ready {
			continue
		}
		any = true
		if e.NodeHints.Len() == 0 {
			allNodeHints = false
		} else if e.NodeHints.Has(nodeName) {
			hasForNode = true
		}
		if e.ZoneHints.Len() == 0 {
			allZoneHints = false
		} else if e.ZoneHints.Has(zone) {
			hasForZone = true
		}
	}
	if !any {
		return TopologyNone
	}
	if allNodeHints && hasForNode {
		return TopologyNode
	}
	if allZoneHints {
		if hasForZone {
			return TopologyZone
		}
		klog.V(4).InfoS("Ignoring zone hints: none for this node's zone", "zone", zone)
	}
	return TopologyNone
}

func availableForTopology(e *Endpoint, mode, nodeName, zone string) bool {
	switch mode {
	case TopologyNode:
		return e.NodeHints.Has(nodeName)
	case TopologyZone:
		return e.ZoneHints.Has(zone)
	}
	return true
}

// excluded explains the endpoints in neither sel.Cluster nor sel.Local;
// nil when there are none (the usual case, so no map is made for it).
// Both lists are filters of eps, in eps's order: one walk finds what they
// left out.
func excluded(eps []*Endpoint, sel Selection, nodeName, zone string) map[*Endpoint]string {
	if len(sel.Cluster) == len(eps) || len(sel.Local) == len(eps) {
		return nil
	}
	var out map[*Endpoint]string
	c, l := 0, 0
	for _, e := range eps {
		inCluster := c < len(sel.Cluster) && sel.Cluster[c] == e
		if inCluster {
			c++
		}
		inLocal := l < len(sel.Local) && sel.Local[l] == e
		if inLocal {
			l++
		}
		if inCluster || inLocal {
			continue
		}
		var why string
		switch {
		case !e.Ready && !(e.Serving && e.Terminating):
			why = "not ready"
		case !e.Ready && sel.Cluster != nil && !sel.ClusterFallback:
			why = "terminating; ready endpoints exist"
		case e.Ready && sel.Topology == TopologyNode && !e.NodeHints.Has(nodeName):
			why = "topology: hinted for other nodes"
		case e.Ready && sel.Topology == TopologyZone && !e.ZoneHints.Has(zone):
			why = "topology: hinted for other zones"
		case !e.Local && sel.Cluster == nil:
			why = "on another node; traffic policy Local"
		case e.Local && !e.Ready && sel.Local != nil:
			why = "terminating; ready local endpoints exist"
		default:
			why = "not used"
		}
		if out == nil {
			out = map[*Endpoint]string{}
		}
		out[e] = why
	}
	return out
}
