package model

// FuzzConvertObjects fuzzes the fields of one Service, one EndpointSlice
// and one Node (the fields kproxy reads: names, labels, addresses, ports,
// protocols, policies, affinity timeouts) and feeds them to a Tracker as a
// source would. Whatever the values, nothing panics, and every object is
// either used, or skipped with a report that names it and gives a
// non-empty reason in one of the fixed categories; what reaches the state
// is within the ranges the renderers rely on. Addresses of the seeds: see
// fixtures_test.go. The seed corpus is f.Add below plus
// testdata/fuzz/FuzzConvertObjects.

import (
	"net/netip"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// categories are the reason labels the metric may carry.
var categories = map[string]bool{
	ReasonInvalidPart: true, ReasonName: true, ReasonNamespace: true, ReasonPortName: true, ReasonLabel: true,
	ReasonServiceNameLabel: true, ReasonAddressType: true, ReasonTooMany: true, ReasonNoPorts: true,
}

func FuzzConvertObjects(f *testing.F) {
	// ns, name, portName, svcType, clusterIP, secondIP, port, nodePort,
	// protocol, externalIP, sourceRange, affinityTimeout, sliceLabel,
	// addressType, endpointIP, endpointPort, endpointPortName, nodeName,
	// nodeIP, podCIDR, zone.
	f.Add("ns", "web", "http", "ClusterIP", "198.19.0.1", "", int32(80), int32(0), "TCP", "", "", int32(0),
		"web", "IPv4", "198.18.1.1", int32(8080), "http", "node-a", "198.18.0.10", "198.18.1.0/24", "zone-a")
	f.Add("ns", "web", "http", "LoadBalancer", "198.19.0.1", "fd00:19::1", int32(443), int32(30080), "UDP", "198.19.1.1",
		"203.0.113.0/24", int32(86400), "web", "IPv6", "fd00:18::1:1", int32(8443), "http", "node-a", "fd00:18::10", "fd00:18:1::/64", "")
	f.Add("ns", "web", "", "NodePort", "198.19.0.300", "198.19.0.2", int32(0), int32(65536), "ICMP", "not-an-ip",
		"203.0.113.0/33", int32(-1), "other", "FQDN", "fd00:18::1:1", int32(0), "", "", "01.02.03.04", "::ffff:1.2.3.0/120", "a\"b")
	f.Add("n\"s", "a\nb", "p\"\n-I X", "ExternalName", "None", "", int32(65535), int32(-5), "SCTP", " ", " ", int32(86401),
		"", "IPv5", "198.18.1.1%eth0", int32(65536), "x y", "node-a", "", "", strings.Repeat("z", 64))
	f.Add("ns", strings.Repeat("s", 64), strings.Repeat("p", 16), "ClusterIP", "fd00:19::1", "198.19.0.1", int32(53), int32(0),
		"udp", "fd00:19:1::1", "2001:db8::/32", int32(10800), strings.Repeat("s", 64), "IPv6", "fd00:18::1:2", int32(53), "dns", "node-b", "198.18.0.11", "198.18.2.0/24", "zone-b")
	f.Fuzz(func(t *testing.T, ns, name, portName, svcType, clusterIP, secondIP string, port, nodePort int32, proto, externalIP,
		sourceRange string, timeout int32, sliceLabel, addressType, epIP string, epPort int32, epPortName, nodeName, nodeIP, podCIDR, zone string) {
		svc := &v1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{}},
			Spec: v1.ServiceSpec{
				Type:      v1.ServiceType(svcType),
				ClusterIP: clusterIP,
				Ports: []v1.ServicePort{{Name: portName, Port: port, NodePort: nodePort, Protocol: v1.Protocol(proto),
					TargetPort: intstr.FromInt32(epPort)}},
				ExternalIPs:              []string{externalIP},
				LoadBalancerSourceRanges: []string{sourceRange},
				SessionAffinity:          v1.ServiceAffinityClientIP,
				SessionAffinityConfig:    &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: &timeout}},
				ExternalTrafficPolicy:    v1.ServiceExternalTrafficPolicyLocal,
				HealthCheckNodePort:      nodePort + 1,
			},
			Status: v1.ServiceStatus{LoadBalancer: v1.LoadBalancerStatus{Ingress: []v1.LoadBalancerIngress{{IP: externalIP}}}},
		}
		if secondIP != "" {
			svc.Spec.ClusterIPs = []string{clusterIP, secondIP}
		}
		if zone != "" {
			svc.Labels[LabelServiceProxyName] = zone // a label value kproxy reads
		}
		ready := true
		hint := []discovery.ForZone{{Name: zone}}
		proto2 := v1.Protocol(proto)
		slice := &discovery.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: name + "-abc", Labels: map[string]string{discovery.LabelServiceName: sliceLabel}},
			AddressType: discovery.AddressType(addressType),
			Endpoints: []discovery.Endpoint{{Addresses: []string{epIP}, NodeName: &nodeName, Zone: &zone,
				Conditions: discovery.EndpointConditions{Ready: &ready}, Hints: &discovery.EndpointHints{ForZones: hint}}},
			Ports: []discovery.EndpointPort{{Name: &epPortName, Port: &epPort, Protocol: &proto2}},
		}
		node := &v1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: nodeName, Labels: map[string]string{v1.LabelTopologyZone: zone}},
			Spec:       v1.NodeSpec{PodCIDR: podCIDR},
			Status:     v1.NodeStatus{Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: nodeIP}}},
		}

		var reports []*InvalidError
		tr := NewTracker(TrackerOptions{Hostname: "node-a", Families: []v1.IPFamily{IPv4, IPv6},
			OnInvalid: func(e *InvalidError) { reports = append(reports, e) }})
		tr.NodeUpdated(node)
		tr.ServiceUpdated(svc)
		tr.EndpointSliceUpdated(slice)
		tr.Synced()
		u := tr.Take()

		reported := map[string]bool{}
		for _, e := range reports {
			if e.Kind == "" || strings.TrimSpace(e.Reason) == "" || !categories[e.Category] {
				t.Errorf("report without kind, reason or a known category: %#v", e)
			}
			if e.Kind != "Node" && e.Object != ns+"/"+name && e.Object != ns+"/"+name+"-abc" {
				t.Errorf("report names %q, not the object", e.Object)
			}
			if e.Error() == "" {
				t.Errorf("empty error text: %#v", e)
			}
			reported[e.Kind] = true
		}
		key := types.NamespacedName{Namespace: ns, Name: name}
		used := false
		for f, d := range u.Families {
			for n, sp := range d.Services {
				if sp == nil {
					continue
				}
				used = true
				if n.NamespacedName != key {
					t.Errorf("a port of another service: %v", n)
				}
				checkPort(t, f, sp)
			}
			for n, eps := range d.Endpoints {
				for _, e := range eps {
					if !e.IP.IsValid() || FamilyOf(e.IP) != f || e.IP.Zone() != "" || e.Port < 1 || e.Port > 65535 {
						t.Errorf("endpoint %v of %v is not a valid %s address and port", e, n, f)
					}
				}
			}
		}
		// Accepted, or skipped for a reason kproxy states: a rule of
		// SkipService, or a report naming the Service.
		if !used && SkipService(svc) == "" && !reported["Service"] {
			t.Errorf("service %s/%s neither used nor reported as skipped", ns, name)
		}
		if used && len(ValidateService(svc)) > 0 {
			t.Errorf("service %s/%s is used although invalid: %v", ns, name, ValidateService(svc))
		}
		if n := tr.Node(); n != nil {
			for _, a := range n.Addresses {
				if !a.IsValid() || a.Zone() != "" {
					t.Errorf("node address %v", a)
				}
			}
			for _, p := range n.PodCIDRs {
				if !p.IsValid() || p.Addr().Zone() != "" {
					t.Errorf("pod CIDR %v", p)
				}
			}
		} else if nodeName == "node-a" && len(ValidateNode(node)) == 0 {
			t.Errorf("node %q is valid but not tracked", nodeName)
		}
	})
}

// checkPort checks what the renderers rely on in a service port.
func checkPort(t *testing.T, f v1.IPFamily, sp *ServicePort) {
	t.Helper()
	valid := func(a netip.Addr) bool { return a.IsValid() && a.Zone() == "" && FamilyOf(a) == f }
	if !valid(sp.ClusterIP) {
		t.Errorf("%v: cluster IP %v", sp.Name, sp.ClusterIP)
	}
	if sp.Port < 1 || sp.Port > 65535 || sp.NodePort < 0 || sp.NodePort > 65535 || sp.HealthCheckNodePort < 0 || sp.HealthCheckNodePort > 65535 {
		t.Errorf("%v: port %d, node port %d, health check node port %d", sp.Name, sp.Port, sp.NodePort, sp.HealthCheckNodePort)
	}
	if sp.Protocol != TCP && sp.Protocol != UDP && sp.Protocol != SCTP {
		t.Errorf("%v: protocol %q", sp.Name, sp.Protocol)
	}
	if sp.StickyMaxAgeSeconds < 0 || sp.StickyMaxAgeSeconds > 86400 {
		t.Errorf("%v: affinity timeout %d", sp.Name, sp.StickyMaxAgeSeconds)
	}
	for _, a := range sp.ExternalIPs {
		if !valid(a) {
			t.Errorf("%v: external IP %v", sp.Name, a)
		}
	}
	for _, in := range sp.LoadBalancerIngress {
		if !valid(in.IP) {
			t.Errorf("%v: ingress IP %v", sp.Name, in.IP)
		}
	}
	for _, p := range sp.LoadBalancerSourceRanges {
		if !p.IsValid() || FamilyOf(p.Addr()) != f {
			t.Errorf("%v: source range %v", sp.Name, p)
		}
	}
}
