package ipvs

import (
	"k8s.io/apimachinery/pkg/types"

	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy"
)

// newHealth is an empty Desired.Health.
func newHealth() proxy.Result {
	return proxy.Result{
		HealthCheckPorts: map[types.NamespacedName]uint16{},
		LocalEndpoints:   map[types.NamespacedName]int{},
		NoLocalEndpoints: map[string]int{"internal": 0, "external": 0},
	}
}

// health adds one service port's figures to Desired.Health, counted as
// the other modes' proxiers count them: a service with a health check
// node port gets it, with its local endpoints summed over its ports (what
// the health check node port server answers); a Local policy with usable
// endpoints elsewhere but none here counts as no local endpoints.
func (r *renderer) health(sp *model.ServicePort, sel model.Selection) {
	h := &r.d.Health
	if sp.HealthCheckNodePort != 0 {
		h.HealthCheckPorts[sp.Name.NamespacedName] = uint16(sp.HealthCheckNodePort)
		h.LocalEndpoints[sp.Name.NamespacedName] += len(sel.Local)
	}
	if sel.HasAny && len(sel.Local) == 0 {
		if sp.InternalPolicyLocal {
			h.NoLocalEndpoints["internal"]++
		}
		if sp.ExternalPolicyLocal && sp.ExternallyAccessible() {
			h.NoLocalEndpoints["external"]++
		}
	}
}
