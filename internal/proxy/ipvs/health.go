package ipvs

import (
	"maps"

	"k8s.io/apimachinery/pkg/types"

	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy"
)

// healthOf is one service port's figures, counted as the other modes'
// proxiers count them: a service with a health check node port gets it,
// with its local endpoints (summed over the service's ports: what the
// health check node port server answers); a Local policy with usable
// endpoints elsewhere but none here counts as no local endpoints.
func healthOf(sp *model.ServicePort, sel model.Selection) shareHealth {
	h := shareHealth{port: uint16(sp.HealthCheckNodePort), local: len(sel.Local)}
	if sel.HasAny && len(sel.Local) == 0 {
		h.noLocalInternal = sp.InternalPolicyLocal
		h.noLocalExternal = sp.ExternalPolicyLocal && sp.ExternallyAccessible()
	}
	return h
}

// healthCheck is one service's health check node port, counted over its
// service ports.
type healthCheck struct {
	port  uint16
	local int
	ports int
}

// countHealth adds (n = 1) or removes (n = -1) one share's figures.
func (c *composer) countHealth(name model.ServicePortName, h shareHealth, n int) {
	if h.port != 0 {
		svc := name.NamespacedName
		hc := c.healthChecks[svc]
		if hc == nil {
			hc = &healthCheck{}
			c.healthChecks[svc] = hc
		}
		hc.port = h.port
		hc.local += n * h.local
		if hc.ports += n; hc.ports <= 0 {
			delete(c.healthChecks, svc)
		}
	}
	if h.noLocalInternal {
		c.noLocal["internal"] += n
	}
	if h.noLocalExternal {
		c.noLocal["external"] += n
	}
}

// result is what the sync reports to the loop: every health check node
// port with its local endpoints, and the Local policies without a local
// endpoint. Maps of its own, which the loop may keep.
func (c *composer) result() proxy.Result {
	r := proxy.Result{
		HealthCheckPorts: make(map[types.NamespacedName]uint16, len(c.healthChecks)),
		LocalEndpoints:   make(map[types.NamespacedName]int, len(c.healthChecks)),
		NoLocalEndpoints: maps.Clone(c.noLocal),
	}
	for svc, hc := range c.healthChecks {
		r.HealthCheckPorts[svc] = hc.port
		r.LocalEndpoints[svc] = hc.local
	}
	return r
}
