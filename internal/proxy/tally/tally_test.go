package tally

import (
	"maps"
	"net/netip"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kproxy/kproxy/internal/model"
)

func TestOf(t *testing.T) {
	local := &model.Endpoint{Local: true, Ready: true}
	remote := &model.Endpoint{Ready: true}
	some := model.Selection{HasAny: true, Cluster: []*model.Endpoint{remote}, AllReachable: []*model.Endpoint{remote}}
	here := model.Selection{HasAny: true, Local: []*model.Endpoint{local, local}, Cluster: []*model.Endpoint{local, local}}
	none := model.Selection{}
	terminating := &model.Endpoint{Local: true, Serving: true, Terminating: true}
	onlyTerminating := model.Selection{HasAny: true, Local: []*model.Endpoint{terminating}, LocalFallback: true, AllReachable: []*model.Endpoint{terminating}}
	nodePort := func(sp model.ServicePort) *model.ServicePort { sp.NodePort = 30080; return &sp }
	externalIP := func(sp model.ServicePort) *model.ServicePort {
		sp.ExternalIPs = []netip.Addr{netip.MustParseAddr("198.19.9.9")}
		return &sp
	}
	bothLocal := model.ServicePort{InternalPolicyLocal: true, ExternalPolicyLocal: true, HealthCheckNodePort: 32000}
	for _, tc := range []struct {
		name string
		sp   *model.ServicePort
		sel  model.Selection
		want Port
	}{
		{"cluster policies", &model.ServicePort{NodePort: 30080}, some, Port{}},
		{"cluster policies, local endpoints", &model.ServicePort{NodePort: 30080}, here, Port{LocalEndpoints: 2}},
		{"internal Local, endpoints elsewhere only", &model.ServicePort{InternalPolicyLocal: true}, some, Port{NoLocalInternal: true}},
		{"internal Local, no endpoints at all: rejected, not counted", &model.ServicePort{InternalPolicyLocal: true}, none, Port{}},
		{"internal Local, local endpoints", &model.ServicePort{InternalPolicyLocal: true}, here, Port{LocalEndpoints: 2}},
		// An external policy counts only where there is external traffic.
		{"external Local, cluster IP only", &model.ServicePort{ExternalPolicyLocal: true, HealthCheckNodePort: 32000}, some, Port{HealthCheckNodePort: 32000}},
		{"external Local, node port", nodePort(model.ServicePort{ExternalPolicyLocal: true, HealthCheckNodePort: 32000}), some, Port{HealthCheckNodePort: 32000, NoLocalExternal: true}},
		{"external Local, external IP", externalIP(model.ServicePort{ExternalPolicyLocal: true}), some, Port{NoLocalExternal: true}},
		{"both Local, node port", nodePort(bothLocal), some, Port{HealthCheckNodePort: 32000, NoLocalInternal: true, NoLocalExternal: true}},
		{"both Local, node port, no endpoints", nodePort(bothLocal), none, Port{HealthCheckNodePort: 32000}},
		{"both Local, node port, local endpoints", nodePort(bothLocal), here, Port{HealthCheckNodePort: 32000, LocalEndpoints: 2}},
		// Traffic falls back to the terminating endpoints, but the
		// health check reports none ready, as upstream: load balancers
		// must stop sending to the node.
		{"both Local, node port, only terminating local endpoints", nodePort(bothLocal), onlyTerminating, Port{HealthCheckNodePort: 32000}},
	} {
		if got := Of(tc.sp, tc.sel); got != tc.want {
			t.Errorf("%s: Of() = %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

func spn(ns, name, port string) model.ServicePortName {
	return model.ServicePortName{NamespacedName: types.NamespacedName{Namespace: ns, Name: name}, Port: port, Protocol: v1.ProtocolTCP}
}

func TestTallySumsOverServicePorts(t *testing.T) {
	var ta Tally // the zero value is ready
	check := func(step string, wantPorts map[types.NamespacedName]uint16, wantLocal map[types.NamespacedName]int, wantInt, wantExt int) {
		t.Helper()
		ports, local := ta.HealthChecks()
		if !maps.Equal(ports, wantPorts) || !maps.Equal(local, wantLocal) {
			t.Errorf("%s: HealthChecks() = %v, %v; want %v, %v", step, ports, local, wantPorts, wantLocal)
		}
		if i, e := ta.NoLocal(); i != wantInt || e != wantExt {
			t.Errorf("%s: NoLocal() = %d, %d; want %d, %d", step, i, e, wantInt, wantExt)
		}
		r := ta.Result()
		if !maps.Equal(r.HealthCheckPorts, wantPorts) || !maps.Equal(r.LocalEndpoints, wantLocal) ||
			!maps.Equal(r.NoLocalEndpoints, map[string]int{"internal": wantInt, "external": wantExt}) {
			t.Errorf("%s: Result() = %+v", step, r)
		}
	}
	type ports = map[types.NamespacedName]uint16
	type locals = map[types.NamespacedName]int
	web := types.NamespacedName{Namespace: "a", Name: "web"}
	dns := types.NamespacedName{Namespace: "b", Name: "dns"}
	check("empty", ports{}, locals{}, 0, 0)

	webHTTP, webHTTPS := spn("a", "web", "http"), spn("a", "web", "https")
	ta.Add(webHTTP, Port{HealthCheckNodePort: 32000, LocalEndpoints: 2})
	ta.Add(webHTTPS, Port{HealthCheckNodePort: 32000, LocalEndpoints: 3})
	ta.Add(spn("a", "plain", ""), Port{LocalEndpoints: 7}) // no health check port: not reported
	check("two ports of one service", ports{web: 32000}, locals{web: 5}, 0, 0)

	dnsUDP := spn("b", "dns", "dns")
	ta.Add(dnsUDP, Port{HealthCheckNodePort: 32001, NoLocalInternal: true, NoLocalExternal: true})
	check("a service with no local endpoint", ports{web: 32000, dns: 32001}, locals{web: 5, dns: 0}, 1, 1)

	// An update: the old figures go, the new ones come.
	ta.Remove(webHTTP, Port{HealthCheckNodePort: 32000, LocalEndpoints: 2})
	ta.Add(webHTTP, Port{HealthCheckNodePort: 32000, NoLocalExternal: true})
	check("one port lost its local endpoints", ports{web: 32000, dns: 32001}, locals{web: 3, dns: 0}, 1, 2)

	// The service keeps its health check while one of its ports is left.
	ta.Remove(webHTTPS, Port{HealthCheckNodePort: 32000, LocalEndpoints: 3})
	check("one port of two gone", ports{web: 32000, dns: 32001}, locals{web: 0, dns: 0}, 1, 2)
	ta.Remove(webHTTP, Port{HealthCheckNodePort: 32000, NoLocalExternal: true})
	ta.Remove(dnsUDP, Port{HealthCheckNodePort: 32001, NoLocalInternal: true, NoLocalExternal: true})
	check("all gone", ports{}, locals{}, 0, 0)
}

func TestResultMapsAreTheCallers(t *testing.T) {
	var ta Tally
	n := spn("a", "web", "")
	ta.Add(n, Port{HealthCheckNodePort: 32000, LocalEndpoints: 1, NoLocalInternal: true})
	r := ta.Result()
	r.HealthCheckPorts[n.NamespacedName] = 1
	r.LocalEndpoints[n.NamespacedName] = 9
	r.NoLocalEndpoints["internal"] = 9
	if again := ta.Result(); again.HealthCheckPorts[n.NamespacedName] != 32000 || again.LocalEndpoints[n.NamespacedName] != 1 || again.NoLocalEndpoints["internal"] != 1 {
		t.Errorf("changing a Result changed the tally: %+v", again)
	}
}
