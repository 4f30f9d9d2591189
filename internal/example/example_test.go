package example

// The address plan checked here is the one at the top of example.yaml:
//   nodes 198.18.0.0/24, fd00:18::/64; pods 198.18.128.0/17, fd00:18:1::/48
//   (node-a 198.18.129.0/24 + fd00:18:1:a::/64, node-b 198.18.130.0/24 +
//   fd00:18:1:b::/64); service IPs 198.19.0.0/16, fd00:19::/112;
//   external and load balancer IPs 198.19.200.0/24, fd00:19::c8:0/112.

import (
	"net/netip"
	"slices"
	"sort"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/source/file"
)

var externalCIDRs = []string{"198.19.200.0/24", "fd00:19::c8:0/112"}

func inAny(t *testing.T, addr string, cidrs []string) bool {
	t.Helper()
	a, err := netip.ParseAddr(addr)
	if err != nil {
		t.Errorf("bad address %q: %v", addr, err)
		return false
	}
	for _, c := range cidrs {
		if netip.MustParsePrefix(c).Contains(a) {
			return true
		}
	}
	return false
}

// fixture indexes the parsed example.
type fixture struct {
	objs     *file.Objects
	services map[string]*v1.Service
	slices   map[string][]*discovery.EndpointSlice // by service name
	nodes    map[string]*v1.Node
}

func load(t *testing.T) *fixture {
	t.Helper()
	objs, errs := file.Parse(FileName, YAML)
	for _, err := range errs {
		t.Errorf("example.yaml: %v", err)
	}
	f := &fixture{objs: objs, services: map[string]*v1.Service{}, slices: map[string][]*discovery.EndpointSlice{}, nodes: map[string]*v1.Node{}}
	for _, s := range objs.Services {
		f.services[s.Name] = s
	}
	for _, s := range objs.EndpointSlices {
		name := s.Labels[discovery.LabelServiceName]
		f.slices[name] = append(f.slices[name], s)
	}
	for _, n := range objs.Nodes {
		f.nodes[n.Name] = n
	}
	return f
}

func TestExampleParsesCleanly(t *testing.T) {
	f := load(t)
	var names []string
	for n := range f.services {
		names = append(names, n)
	}
	sort.Strings(names)
	want := []string{"affinity", "dns-udp", "dual-stack", "etp-local", "ext-ip", "headless", "itp-local", "lb-ranges",
		"no-endpoints", "other-proxy", "sctp", "terminating-only", "topology", "web-clusterip", "web-nodeport"}
	if diff := cmp.Diff(want, names); diff != "" {
		t.Errorf("services (-want +got):\n%s", diff)
	}
	for _, s := range f.objs.Services {
		if s.Namespace != Namespace {
			t.Errorf("service %s in namespace %q, want %q", s.Name, s.Namespace, Namespace)
		}
	}
	// Objects() is the same, and a fresh copy each time.
	a, b := Objects(), Objects()
	if len(a.Services) != len(f.objs.Services) || a.Services[0] == b.Services[0] {
		t.Errorf("Objects() should parse anew: %d services, shared pointers %v", len(a.Services), a.Services[0] == b.Services[0])
	}
}

func TestExampleNodes(t *testing.T) {
	f := load(t)
	if len(f.nodes) != 2 {
		t.Fatalf("nodes: %d, want 2", len(f.nodes))
	}
	for name, zone := range map[string]string{NodeA: "zone-a", NodeB: "zone-b"} {
		n := f.nodes[name]
		if n == nil {
			t.Errorf("node %s missing", name)
			continue
		}
		if n.Labels[v1.LabelTopologyZone] != zone {
			t.Errorf("node %s zone = %q, want %q", name, n.Labels[v1.LabelTopologyZone], zone)
		}
		node, errs := model.ConvertNode(n)
		if len(errs) != 0 {
			t.Errorf("node %s: %v", name, errs)
		}
		for _, fam := range []v1.IPFamily{model.IPv4, model.IPv6} {
			cidrs := node.PodCIDRsOf(fam)
			if len(cidrs) != 1 || !inAny(t, cidrs[0].Addr().String(), ClusterCIDRs) {
				t.Errorf("node %s %s pod CIDRs %v, want one inside %v", name, fam, cidrs, ClusterCIDRs)
			}
			var addrs []netip.Addr
			for _, a := range node.Addresses {
				if model.FamilyOf(a) == fam && inAny(t, a.String(), NodeCIDRs) {
					addrs = append(addrs, a)
				}
			}
			if len(addrs) != 1 {
				t.Errorf("node %s: %s addresses in %v: %v, want one", name, fam, NodeCIDRs, addrs)
			}
		}
	}
}

// TestExampleSlices: every slice is as the EndpointSlice controller writes
// it, and every endpoint sits where the address plan says.
func TestExampleSlices(t *testing.T) {
	f := load(t)
	for _, s := range f.objs.EndpointSlices {
		name := s.Namespace + "/" + s.Name
		svc := f.services[s.Labels[discovery.LabelServiceName]]
		if svc == nil {
			t.Errorf("slice %s: label %s names no service", name, discovery.LabelServiceName)
			continue
		}
		if _, ok := model.TriggerTime(s); !ok {
			t.Errorf("slice %s: no valid %s annotation", name, model.AnnotationTriggerTime)
		}
		if len(s.OwnerReferences) != 1 || s.OwnerReferences[0].UID != svc.UID {
			t.Errorf("slice %s: owner references %v, want its service's uid %s", name, s.OwnerReferences, svc.UID)
		}
		for i, e := range s.Endpoints {
			if e.NodeName == nil || e.Zone == nil {
				t.Errorf("slice %s endpoint %d: nodeName and zone must be set", name, i)
				continue
			}
			n := f.nodes[*e.NodeName]
			if n == nil {
				t.Errorf("slice %s endpoint %d: unknown node %q", name, i, *e.NodeName)
				continue
			}
			if *e.Zone != n.Labels[v1.LabelTopologyZone] {
				t.Errorf("slice %s endpoint %d: zone %q, but node %s is in %q", name, i, *e.Zone, n.Name, n.Labels[v1.LabelTopologyZone])
			}
			if !inAny(t, e.Addresses[0], n.Spec.PodCIDRs) {
				t.Errorf("slice %s endpoint %d: %s not in node %s's pod CIDRs %v", name, i, e.Addresses[0], n.Name, n.Spec.PodCIDRs)
			}
			if a := netip.MustParseAddr(e.Addresses[0]); (a.Is4() && s.AddressType != discovery.AddressTypeIPv4) || (a.Is6() && s.AddressType != discovery.AddressTypeIPv6) {
				t.Errorf("slice %s endpoint %d: %s in a slice of type %s", name, i, a, s.AddressType)
			}
		}
	}
	for _, svc := range f.objs.Services {
		if len(f.slices[svc.Name]) == 0 {
			t.Errorf("service %s has no slice", svc.Name)
		}
		for _, ip := range svc.Spec.ClusterIPs {
			if ip != v1.ClusterIPNone && !inAny(t, ip, ServiceCIDRs) {
				t.Errorf("service %s: cluster IP %s not in %v", svc.Name, ip, ServiceCIDRs)
			}
		}
		for _, ip := range svc.Spec.ExternalIPs {
			if !inAny(t, ip, externalCIDRs) {
				t.Errorf("service %s: external IP %s not in %v", svc.Name, ip, externalCIDRs)
			}
		}
		for _, in := range svc.Status.LoadBalancer.Ingress {
			if !inAny(t, in.IP, externalCIDRs) {
				t.Errorf("service %s: load balancer IP %s not in %v", svc.Name, in.IP, externalCIDRs)
			}
		}
	}
}

func endpointsOf(slices []*discovery.EndpointSlice) []discovery.Endpoint {
	var out []discovery.Endpoint
	for _, s := range slices {
		out = append(out, s.Endpoints...)
	}
	return out
}

func nodesOf(eps []discovery.Endpoint) []string {
	var out []string
	for _, e := range eps {
		if e.NodeName != nil && !slices.Contains(out, *e.NodeName) {
			out = append(out, *e.NodeName)
		}
	}
	sort.Strings(out)
	return out
}

// TestExampleFeatures checks, service by service, the feature each one is
// there for, on the objects as written.
func TestExampleFeatures(t *testing.T) {
	f := load(t)
	both := []string{NodeA, NodeB}
	tests := []struct {
		service string
		check   func(t *testing.T, s *v1.Service, sl []*discovery.EndpointSlice)
	}{
		{"web-clusterip", func(t *testing.T, s *v1.Service, sl []*discovery.EndpointSlice) {
			if s.Spec.Type != v1.ServiceTypeClusterIP || len(s.Spec.ExternalIPs) != 0 || !cmp.Equal(nodesOf(endpointsOf(sl)), both) {
				t.Errorf("want a plain ClusterIP service with endpoints on both nodes")
			}
		}},
		{"web-nodeport", func(t *testing.T, s *v1.Service, sl []*discovery.EndpointSlice) {
			if s.Spec.Type != v1.ServiceTypeNodePort || s.Spec.Ports[0].NodePort == 0 {
				t.Errorf("want type NodePort with a node port")
			}
		}},
		{"lb-ranges", func(t *testing.T, s *v1.Service, sl []*discovery.EndpointSlice) {
			if s.Spec.Type != v1.ServiceTypeLoadBalancer || s.Spec.Ports[0].NodePort == 0 {
				t.Errorf("want type LoadBalancer with a node port")
			}
			if !cmp.Equal(s.Spec.LoadBalancerSourceRanges, []string{"198.18.0.0/24", "203.0.113.0/24"}) {
				t.Errorf("loadBalancerSourceRanges = %v", s.Spec.LoadBalancerSourceRanges)
			}
			modes := map[v1.LoadBalancerIPMode]int{}
			for _, in := range s.Status.LoadBalancer.Ingress {
				if in.IPMode != nil {
					modes[*in.IPMode]++
				}
			}
			if modes[v1.LoadBalancerIPModeVIP] != 1 || modes[v1.LoadBalancerIPModeProxy] != 1 {
				t.Errorf("ingress ipModes = %v, want one VIP and one Proxy", modes)
			}
		}},
		{"ext-ip", func(t *testing.T, s *v1.Service, sl []*discovery.EndpointSlice) {
			if s.Spec.Type != v1.ServiceTypeClusterIP || len(s.Spec.ExternalIPs) != 2 {
				t.Errorf("want a ClusterIP service with an external IP of each family, got %v", s.Spec.ExternalIPs)
			}
		}},
		{"etp-local", func(t *testing.T, s *v1.Service, sl []*discovery.EndpointSlice) {
			if s.Spec.Type != v1.ServiceTypeLoadBalancer || s.Spec.ExternalTrafficPolicy != v1.ServiceExternalTrafficPolicyLocal ||
				s.Spec.HealthCheckNodePort == 0 || len(s.Status.LoadBalancer.Ingress) == 0 {
				t.Errorf("want a LoadBalancer with externalTrafficPolicy Local, a health check node port and an ingress IP")
			}
			if !cmp.Equal(nodesOf(endpointsOf(sl)), both) {
				t.Errorf("endpoints on %v, want both nodes", nodesOf(endpointsOf(sl)))
			}
		}},
		{"itp-local", func(t *testing.T, s *v1.Service, sl []*discovery.EndpointSlice) {
			if s.Spec.InternalTrafficPolicy == nil || *s.Spec.InternalTrafficPolicy != v1.ServiceInternalTrafficPolicyLocal {
				t.Errorf("want internalTrafficPolicy Local")
			}
			if !cmp.Equal(nodesOf(endpointsOf(sl)), []string{NodeA}) {
				t.Errorf("endpoints on %v, want node-a only (node-b then has none locally)", nodesOf(endpointsOf(sl)))
			}
		}},
		{"affinity", func(t *testing.T, s *v1.Service, sl []*discovery.EndpointSlice) {
			c := s.Spec.SessionAffinityConfig
			if s.Spec.SessionAffinity != v1.ServiceAffinityClientIP || c == nil || c.ClientIP == nil || c.ClientIP.TimeoutSeconds == nil {
				t.Errorf("want ClientIP affinity with timeoutSeconds")
			}
		}},
		{"dual-stack", func(t *testing.T, s *v1.Service, sl []*discovery.EndpointSlice) {
			if !cmp.Equal(s.Spec.IPFamilies, []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}) || len(s.Spec.ClusterIPs) != 2 {
				t.Errorf("want both families and two cluster IPs, got %v %v", s.Spec.IPFamilies, s.Spec.ClusterIPs)
			}
			types := map[discovery.AddressType]bool{}
			for _, x := range sl {
				if len(x.Endpoints) > 0 {
					types[x.AddressType] = true
				}
			}
			if !types[discovery.AddressTypeIPv4] || !types[discovery.AddressTypeIPv6] {
				t.Errorf("want an IPv4 and an IPv6 slice with endpoints, got %v", types)
			}
		}},
		{"dns-udp", func(t *testing.T, s *v1.Service, sl []*discovery.EndpointSlice) {
			if !slices.ContainsFunc(s.Spec.Ports, func(p v1.ServicePort) bool { return p.Protocol == v1.ProtocolUDP && p.Port == 53 }) {
				t.Errorf("want port 53/UDP")
			}
		}},
		{"sctp", func(t *testing.T, s *v1.Service, sl []*discovery.EndpointSlice) {
			if !slices.ContainsFunc(s.Spec.Ports, func(p v1.ServicePort) bool { return p.Protocol == v1.ProtocolSCTP }) || len(endpointsOf(sl)) == 0 {
				t.Errorf("want an SCTP port with endpoints")
			}
		}},
		{"no-endpoints", func(t *testing.T, s *v1.Service, sl []*discovery.EndpointSlice) {
			if n := len(endpointsOf(sl)); n != 0 {
				t.Errorf("%d endpoints, want none", n)
			}
		}},
		{"terminating-only", func(t *testing.T, s *v1.Service, sl []*discovery.EndpointSlice) {
			eps := endpointsOf(sl)
			if len(eps) == 0 {
				t.Errorf("no endpoints")
			}
			for _, e := range eps {
				c := e.Conditions
				if c.Ready == nil || *c.Ready || c.Serving == nil || !*c.Serving || c.Terminating == nil || !*c.Terminating {
					t.Errorf("endpoint %v: want ready false, serving true, terminating true", e.Addresses)
				}
			}
		}},
		{"topology", func(t *testing.T, s *v1.Service, sl []*discovery.EndpointSlice) {
			eps := endpointsOf(sl)
			zones := map[string]bool{}
			for _, e := range eps {
				if e.Hints == nil || len(e.Hints.ForZones) == 0 {
					t.Errorf("endpoint %v has no zone hint", e.Addresses)
					continue
				}
				zones[e.Hints.ForZones[0].Name] = true
			}
			if !zones["zone-a"] || !zones["zone-b"] || !cmp.Equal(nodesOf(eps), both) {
				t.Errorf("want hinted endpoints in both zones, got %v", zones)
			}
		}},
		{"headless", func(t *testing.T, s *v1.Service, sl []*discovery.EndpointSlice) {
			if s.Spec.ClusterIP != v1.ClusterIPNone {
				t.Errorf("want clusterIP None")
			}
			for _, x := range sl {
				if _, ok := x.Labels[model.LabelHeadless]; !ok {
					t.Errorf("slice %s lacks the %s label", x.Name, model.LabelHeadless)
				}
			}
		}},
		{"other-proxy", func(t *testing.T, s *v1.Service, sl []*discovery.EndpointSlice) {
			if _, ok := s.Labels[model.LabelServiceProxyName]; !ok {
				t.Errorf("want the %s label", model.LabelServiceProxyName)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.service, func(t *testing.T) {
			s := f.services[tc.service]
			if s == nil {
				t.Fatalf("service %s missing", tc.service)
			}
			tc.check(t, s, f.slices[tc.service])
		})
	}
}

// TestExampleThroughModel feeds the example to a dual-stack Tracker as node-a
// and checks what a proxy would get, so the example exercises what it is
// meant to and nothing in it is rejected.
func TestExampleThroughModel(t *testing.T) {
	var invalid []string
	tr := model.NewTracker(model.TrackerOptions{
		Hostname: NodeA,
		Families: []v1.IPFamily{model.IPv4, model.IPv6},
		OnInvalid: func(e *model.InvalidError) {
			invalid = append(invalid, e.Error())
		},
	})
	Objects().Feed(tr)
	if !tr.HasSynced() {
		t.Fatal("Feed did not call Synced")
	}
	u := tr.Take()
	if len(invalid) != 0 {
		t.Errorf("model rejected parts of the example: %v", invalid)
	}
	if u.Node == nil || u.Node.Name != NodeA || u.Node.Zone() != "zone-a" {
		t.Fatalf("node = %+v, want node-a in zone-a", u.Node)
	}

	spn := func(svc, port string, proto v1.Protocol) model.ServicePortName {
		return model.ServicePortName{NamespacedName: types.NamespacedName{Namespace: Namespace, Name: svc}, Port: port, Protocol: proto}
	}
	names := func(fam v1.IPFamily) []string {
		var out []string
		for n, sp := range u.Families[fam].Services {
			if sp != nil {
				out = append(out, n.String())
			}
		}
		sort.Strings(out)
		return out
	}
	wantV4 := []string{
		"demo/affinity:http/TCP", "demo/dns-udp:dns-tcp/TCP", "demo/dns-udp:dns/UDP", "demo/dual-stack:http/TCP",
		"demo/etp-local:http/TCP", "demo/ext-ip:http/TCP", "demo/itp-local:http/TCP", "demo/lb-ranges:https/TCP",
		"demo/no-endpoints:http/TCP", "demo/sctp/SCTP", "demo/terminating-only:http/TCP", "demo/topology:http/TCP",
		"demo/web-clusterip:http/TCP", "demo/web-nodeport:http/TCP",
	}
	if diff := cmp.Diff(wantV4, names(model.IPv4)); diff != "" {
		t.Errorf("IPv4 service ports (-want +got), headless and other-proxy must be absent:\n%s", diff)
	}
	if diff := cmp.Diff([]string{"demo/dual-stack:http/TCP", "demo/ext-ip:http/TCP"}, names(model.IPv6)); diff != "" {
		t.Errorf("IPv6 service ports (-want +got):\n%s", diff)
	}

	v4 := u.Families[model.IPv4]
	sel := func(name model.ServicePortName) model.Selection {
		sp := v4.Services[name]
		if sp == nil {
			t.Fatalf("%s missing", name)
		}
		return model.SelectEndpoints(sp, v4.Endpoints[name], NodeA, "zone-a")
	}
	addrs := func(eps []*model.Endpoint) []string {
		var out []string
		for _, e := range eps {
			out = append(out, e.String())
		}
		return out
	}

	lb := v4.Services[spn("lb-ranges", "https", v1.ProtocolTCP)]
	if len(lb.LoadBalancerSourceRanges) != 2 || len(lb.LoadBalancerIngress) != 2 || len(lb.LoadBalancerVIPs()) != 1 {
		t.Errorf("lb-ranges: ranges %v, ingress %v, VIPs %v; want 2 ranges, 2 ingress IPs of which 1 VIP",
			lb.LoadBalancerSourceRanges, lb.LoadBalancerIngress, lb.LoadBalancerVIPs())
	}
	if sp := v4.Services[spn("affinity", "http", v1.ProtocolTCP)]; sp.StickyMaxAgeSeconds != 600 {
		t.Errorf("affinity: sticky %d s, want 600", sp.StickyMaxAgeSeconds)
	}
	if sp := u.Families[model.IPv6].Services[spn("ext-ip", "http", v1.ProtocolTCP)]; len(sp.ExternalIPs) != 1 || sp.ExternalIPs[0] != netip.MustParseAddr("fd00:19::c8:a") {
		t.Errorf("ext-ip IPv6 external IPs = %v", sp.ExternalIPs)
	}
	etp := spn("etp-local", "http", v1.ProtocolTCP)
	if sp := v4.Services[etp]; !sp.ExternalPolicyLocal || sp.HealthCheckNodePort == 0 {
		t.Errorf("etp-local: %+v", sp)
	}
	if got := addrs(sel(etp).Local); !cmp.Equal(got, []string{"198.18.129.20:8080"}) {
		t.Errorf("etp-local local endpoints on node-a = %v", got)
	}
	if got := addrs(sel(spn("itp-local", "http", v1.ProtocolTCP)).Local); !cmp.Equal(got, []string{"198.18.129.30:8080"}) {
		t.Errorf("itp-local local endpoints on node-a = %v", got)
	}
	if s := sel(spn("terminating-only", "http", v1.ProtocolTCP)); !s.ClusterFallback || len(s.Cluster) != 2 {
		t.Errorf("terminating-only: fallback %v, %d endpoints; want the 2 serving terminating ones", s.ClusterFallback, len(s.Cluster))
	}
	if s := sel(spn("topology", "http", v1.ProtocolTCP)); s.Topology != model.TopologyZone ||
		!cmp.Equal(addrs(s.Cluster), []string{"198.18.129.80:8080", "198.18.129.81:8080"}) {
		t.Errorf("topology on node-a: mode %q, endpoints %v; want zone-a's two", s.Topology, addrs(s.Cluster))
	}
	if eps := v4.Endpoints[spn("no-endpoints", "http", v1.ProtocolTCP)]; len(eps) != 0 {
		t.Errorf("no-endpoints has endpoints %v", addrs(eps))
	}
	if s := sel(spn("dns-udp", "dns", v1.ProtocolUDP)); len(s.Cluster) != 2 {
		t.Errorf("dns-udp UDP endpoints = %v", addrs(s.Cluster))
	}
	if eps := u.Families[model.IPv6].Endpoints[spn("dual-stack", "http", v1.ProtocolTCP)]; !cmp.Equal(addrs(eps), []string{"[fd00:18:1:a::50]:8080", "[fd00:18:1:b::50]:8080"}) {
		t.Errorf("dual-stack IPv6 endpoints = %v", addrs(eps))
	}
}
