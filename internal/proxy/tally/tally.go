// Package tally keeps the per-sync figures every mode reports to the loop
// in proxy.Result: the health check node port of each service with its
// local endpoints (summed over the service's ports, what the health check
// node port server answers), and how many Local traffic policies have no
// local endpoint (sync_proxy_rules_no_local_endpoints_total, "internal"
// and "external").
//
// A backend computes one service port's figures with Of when it renders
// the port and keeps them with what it applied; a Tally sums them. Add
// and Remove cost O(1) whatever the number of services, so a partial sync
// updates the sums for the service ports it touched only (remove the old
// figures, add the new ones) and reading them costs one pass over the
// services with a health check node port.
package tally

import (
	"k8s.io/apimachinery/pkg/types"

	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy"
)

// Port is one service port's share of a sync's figures.
type Port struct {
	// LocalEndpoints are this node's ready endpoints, what the health
	// check node port reports (upstream's LocalReadyEndpoints): the
	// serving terminating ones Local traffic falls back to do not count,
	// so that load balancers stop sending to the node.
	// HealthCheckNodePort is the service's (0: none).
	LocalEndpoints      int
	HealthCheckNodePort int32
	// NoLocalInternal/External: traffic policy Local with usable
	// endpoints elsewhere but none here (traffic is dropped, not
	// rejected). External counts only for an externally accessible
	// port (node port, external IP or load balancer IP).
	NoLocalInternal, NoLocalExternal bool
}

// Of returns the figures of service port sp whose endpoints for this node
// are sel, as upstream's proxiers count them.
func Of(sp *model.ServicePort, sel model.Selection) Port {
	p := Port{LocalEndpoints: len(sel.Local), HealthCheckNodePort: sp.HealthCheckNodePort}
	if sel.LocalFallback {
		p.LocalEndpoints = 0
	}
	if sel.HasAny && len(sel.Local) == 0 {
		p.NoLocalInternal = sp.InternalPolicyLocal
		p.NoLocalExternal = sp.ExternalPolicyLocal && sp.ExternallyAccessible()
	}
	return p
}

// Tally sums the figures of the service ports added and not removed. The
// zero value is empty and ready to use.
type Tally struct {
	health                           map[types.NamespacedName]health
	noLocalInternal, noLocalExternal int
}

// health is one service's health check node port and its local
// endpoints, over ports (the service ports counted, >0).
type health struct {
	port         uint16
	local, ports int
}

// Add counts service port n's figures p.
func (t *Tally) Add(n model.ServicePortName, p Port) { t.count(n, p, 1) }

// Remove takes back figures p that Add counted for service port n.
func (t *Tally) Remove(n model.ServicePortName, p Port) { t.count(n, p, -1) }

func (t *Tally) count(n model.ServicePortName, p Port, sign int) {
	if p.NoLocalInternal {
		t.noLocalInternal += sign
	}
	if p.NoLocalExternal {
		t.noLocalExternal += sign
	}
	if p.HealthCheckNodePort == 0 {
		return
	}
	if t.health == nil {
		t.health = map[types.NamespacedName]health{}
	}
	h := t.health[n.NamespacedName]
	if sign > 0 {
		// A service's ports share its health check node port.
		h.port = uint16(p.HealthCheckNodePort)
	}
	h.local += sign * p.LocalEndpoints
	if h.ports += sign; h.ports <= 0 {
		delete(t.health, n.NamespacedName)
		return
	}
	t.health[n.NamespacedName] = h
}

// NoLocal returns how many service ports with internal / external traffic
// policy Local have no local endpoint.
func (t *Tally) NoLocal() (internal, external int) {
	return t.noLocalInternal, t.noLocalExternal
}

// HealthChecks returns, per service with a health check node port, the
// port and the number of local endpoints (summed over the service's
// ports). The maps are new: the caller may keep them.
func (t *Tally) HealthChecks() (ports map[types.NamespacedName]uint16, local map[types.NamespacedName]int) {
	ports = make(map[types.NamespacedName]uint16, len(t.health))
	local = make(map[types.NamespacedName]int, len(t.health))
	for svc, h := range t.health {
		ports[svc] = h.port
		local[svc] = h.local
	}
	return ports, local
}

// Result returns the figures as the loop takes them, in maps of their
// own.
func (t *Tally) Result() proxy.Result {
	ports, local := t.HealthChecks()
	return proxy.Result{
		HealthCheckPorts: ports,
		LocalEndpoints:   local,
		NoLocalEndpoints: map[string]int{"internal": t.noLocalInternal, "external": t.noLocalExternal},
	}
}
