package model

// Addresses: as in fixtures_test.go (198.19.0.x cluster IPs, 198.18.1.x pods).

import (
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kproxy/kproxy/internal/metrics"
)

// Names at and over the API's limits.
var (
	label63   = "a" + strings.Repeat("b", 62) // DNS-1123/1035 label: at most 63
	label64   = "a" + strings.Repeat("b", 63) // one over
	sub253    = strings.Repeat(label63+".", 3) + strings.Repeat("c", 253-3*64-1) + "d"
	sub254    = sub253 + "e"
	name1000  = strings.Repeat("x", 1000)
	injection = "http\"\n-I KUBE-SERVICES 1 -j ACCEPT"
)

func withName(n string) func(*v1.Service)      { return func(s *v1.Service) { s.Name = n } }
func withNamespace(n string) func(*v1.Service) { return func(s *v1.Service) { s.Namespace = n } }
func withPortName(n string) func(*v1.Service) {
	return func(s *v1.Service) { s.Spec.Ports[0].Name = n }
}

// TestValidateService feeds a batch of one malformed Service and one valid
// one through a Tracker: the malformed one is absent from the update,
// reported once per broken rule with the API's message, and counted in
// kproxy_invalid_objects_total under its category; the valid one converts.
func TestValidateService(t *testing.T) {
	if len(sub253) != 253 {
		t.Fatalf("fixture: sub253 has %d characters", len(sub253))
	}
	tests := []struct {
		name     string
		tweak    func(*v1.Service)
		valid    bool   // the API server accepts it
		category string // of the first error
		field    string // of the first error
		message  string // in the first error's reason
	}{
		{name: "name of 63 characters", tweak: withName(label63), valid: true},
		{name: "no ports", tweak: func(s *v1.Service) { s.Spec.Ports = nil }, category: ReasonNoPorts, field: "spec.ports", message: "Required value"},
		{name: "name of 64 characters", tweak: withName(label64), category: ReasonName, field: "metadata.name", message: "must be no more than 63 characters"},
		{name: "name of 1000 characters", tweak: withName(name1000), category: ReasonName, field: "metadata.name", message: "must be no more than 63 characters"},
		{name: "empty name", tweak: withName(""), category: ReasonName, field: "metadata.name", message: "Required value"},
		{name: "uppercase name", tweak: withName("Web"), category: ReasonName, field: "metadata.name", message: "a lowercase RFC 1123 label must consist of lower case alphanumeric characters"},
		{name: "name starting with a digit", tweak: withName("1web"), valid: true},
		{name: "name with a dot", tweak: withName("web.shop"), category: ReasonName, field: "metadata.name", message: "must not contain dots"},
		{name: "name with a quote", tweak: withName(`we"b`), category: ReasonName, field: "metadata.name", message: "RFC 1123"},
		{name: "name with a newline", tweak: withName("web\n"), category: ReasonName, field: "metadata.name", message: "RFC 1123"},
		{name: "non-ASCII name", tweak: withName("wéb"), category: ReasonName, field: "metadata.name", message: "RFC 1123"},
		{name: "name ending in a dash", tweak: withName("web-"), category: ReasonName, field: "metadata.name", message: "RFC 1123"},
		{name: "namespace of 63 characters", tweak: withNamespace(label63), valid: true},
		{name: "namespace of 64 characters", tweak: withNamespace(label64), category: ReasonNamespace, field: "metadata.namespace", message: "must be no more than 63 characters"},
		{name: "empty namespace", tweak: withNamespace(""), category: ReasonNamespace, field: "metadata.namespace", message: "Required value"},
		{name: "namespace with a slash", tweak: withNamespace("a/b"), category: ReasonNamespace, field: "metadata.namespace", message: "a lowercase RFC 1123 label must consist of"},
		{name: "namespace with a space", tweak: withNamespace("a b"), category: ReasonNamespace, field: "metadata.namespace", message: "RFC 1123"},
		{name: "uppercase namespace", tweak: withNamespace("Shop"), category: ReasonNamespace, field: "metadata.namespace", message: "RFC 1123"},
		{name: "port name of 63 characters", tweak: withPortName(label63), valid: true},
		{name: "port name of 64 characters", tweak: withPortName(label64), category: ReasonPortName, field: "spec.ports[0].name", message: "must be no more than 63 characters"},
		{name: "port name with quotes and a newline", tweak: withPortName(injection), category: ReasonPortName, field: "spec.ports[0].name", message: "RFC 1123"},
		{name: "port name with a space", tweak: withPortName("h ttp"), category: ReasonPortName, field: "spec.ports[0].name", message: "RFC 1123"},
		{name: "uppercase port name", tweak: withPortName("HTTP"), category: ReasonPortName, field: "spec.ports[0].name", message: "RFC 1123"},
		{name: "non-ASCII port name", tweak: withPortName("hüttp"), category: ReasonPortName, field: "spec.ports[0].name", message: "RFC 1123"},
		{name: "single unnamed port", tweak: withPortName(""), valid: true},
		{name: "two ports, one unnamed", tweak: func(s *v1.Service) {
			s.Spec.Ports = append(s.Spec.Ports, v1.ServicePort{Port: 81, Protocol: TCP})
		}, category: ReasonPortName, field: "spec.ports[1].name", message: "Required value"},
		{name: "two ports with the same name and protocols", tweak: func(s *v1.Service) {
			s.Spec.Ports = append(s.Spec.Ports, v1.ServicePort{Name: "http", Port: 81, Protocol: UDP})
		}, category: ReasonPortName, field: "spec.ports[1].name", message: `Duplicate value: "http"`},
		{name: "service-proxy-name label with a newline", tweak: func(s *v1.Service) {
			s.Labels = map[string]string{LabelServiceProxyName: "other\nproxy"}
		}, category: ReasonLabel, field: "metadata.labels[service.kubernetes.io/service-proxy-name]", message: "a valid label must be"},
		{name: "valid ports and names together", tweak: func(s *v1.Service) {
			s.Name, s.Namespace = "w-1", "n-2"
			s.Spec.Ports = append(s.Spec.Ports, v1.ServicePort{Name: "dns-tcp", Port: 53, Protocol: TCP})
		}, valid: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			bad := makeService(testNS, "bad", tc.tweak)
			good := makeService(testNS, "good", func(s *v1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "198.19.0.2", []string{"198.19.0.2"} })
			var got []*InvalidError
			tr := NewTracker(TrackerOptions{Hostname: thisNode, Families: v4Only, OnInvalid: func(e *InvalidError) { got = append(got, e) }})
			counter := metrics.InvalidObjectsTotal.WithLabelValues("Service", tc.category)
			before := testutil.ToFloat64(counter)
			tr.ServiceUpdated(bad)
			tr.ServiceUpdated(good)
			u := tr.Take()
			svcs := u.Families[IPv4].Services
			if svcs[spn("good", "http", TCP)] == nil {
				t.Errorf("the valid service of the batch was not converted: %v", svcs)
			}
			badKey := bad.Namespace + "/" + bad.Name
			badPorts := 0
			for n, p := range svcs {
				if n.Namespace == bad.Namespace && n.Name == bad.Name && p != nil {
					badPorts++
				}
			}
			if tc.valid {
				if len(got) != 0 || badPorts == 0 {
					t.Fatalf("valid service: %d ports, errors %v", badPorts, got)
				}
				return
			}
			if badPorts != 0 {
				t.Errorf("invalid service has %d ports in the update, want none", badPorts)
			}
			if len(got) == 0 {
				t.Fatalf("no error reported")
			}
			e := got[0]
			if e.Kind != "Service" || e.Object != badKey || !e.Whole || e.Category != tc.category || e.Field != tc.field || !strings.Contains(e.Reason, tc.message) {
				t.Errorf("error = %+v, want Service %q whole, category %s, field %s, reason containing %q", e, badKey, tc.category, tc.field, tc.message)
			}
			if d := testutil.ToFloat64(counter) - before; d != float64(len(got)) {
				t.Errorf("kproxy_invalid_objects_total{kind=Service,reason=%s} grew by %v, want %d", tc.category, d, len(got))
			}
		})
	}
}

// TestValidateEndpointSlice does the same for EndpointSlices: a malformed
// slice gives no endpoints, a valid slice of the same service does.
func TestValidateEndpointSlice(t *testing.T) {
	sliceName := func(n string) func(*discovery.EndpointSlice) {
		return func(s *discovery.EndpointSlice) { s.Name = n }
	}
	svcLabel := func(v string) func(*discovery.EndpointSlice) {
		return func(s *discovery.EndpointSlice) { s.Labels[discovery.LabelServiceName] = v }
	}
	portName := func(n string) func(*discovery.EndpointSlice) {
		return func(s *discovery.EndpointSlice) { s.Ports[0].Name = &n }
	}
	tests := []struct {
		name     string
		tweak    func(*discovery.EndpointSlice)
		valid    bool
		category string
		field    string
		message  string
	}{
		{name: "name of 253 characters", tweak: sliceName(sub253), valid: true},
		{name: "name of 254 characters", tweak: sliceName(sub254), category: ReasonName, field: "metadata.name", message: "must be no more than 253 characters"},
		{name: "name of 1000 characters", tweak: sliceName(name1000), category: ReasonName, field: "metadata.name", message: "must be no more than 253 characters"},
		{name: "empty name", tweak: sliceName(""), category: ReasonName, field: "metadata.name", message: "Required value"},
		{name: "name with a quote", tweak: sliceName(`s"1`), category: ReasonName, field: "metadata.name", message: "RFC 1123 subdomain"},
		{name: "uppercase name", tweak: sliceName("S1"), category: ReasonName, field: "metadata.name", message: "RFC 1123 subdomain"},
		{name: "non-ASCII name", tweak: sliceName("s→1"), category: ReasonName, field: "metadata.name", message: "RFC 1123 subdomain"},
		{name: "namespace with a newline", tweak: func(s *discovery.EndpointSlice) { s.Namespace = "ns\nx" }, category: ReasonNamespace, field: "metadata.namespace", message: "RFC 1123"},
		{name: "service-name label of 63 characters", tweak: svcLabel(label63), valid: true},
		{name: "service-name label of 64 characters", tweak: svcLabel(label64), category: ReasonServiceNameLabel, field: "metadata.labels[kubernetes.io/service-name]", message: "must be no more than 63 bytes"},
		{name: "service-name label with a newline", tweak: svcLabel("svc\n"), category: ReasonServiceNameLabel, field: "metadata.labels[kubernetes.io/service-name]", message: "a valid label must be"},
		{name: "service-name label with a quote", tweak: svcLabel(`sv"c`), category: ReasonServiceNameLabel, field: "metadata.labels[kubernetes.io/service-name]", message: "a valid label must be"},
		{name: "no service-name label", tweak: func(s *discovery.EndpointSlice) { delete(s.Labels, discovery.LabelServiceName) }, category: ReasonServiceNameLabel, field: "metadata.labels", message: "no kubernetes.io/service-name label"},
		{name: "unknown address type", tweak: func(s *discovery.EndpointSlice) { s.AddressType = "IPv5" }, category: ReasonAddressType, field: "addressType", message: `Unsupported value: "IPv5"`},
		{name: "empty address type", tweak: func(s *discovery.EndpointSlice) { s.AddressType = "" }, category: ReasonAddressType, field: "addressType", message: "Required value"},
		{name: "port name of 63 characters", tweak: portName(label63), valid: true},
		{name: "port name of 64 characters", tweak: portName(label64), category: ReasonPortName, field: "ports[0].name", message: "must be no more than 63 characters"},
		{name: "port name with quotes and a newline", tweak: portName(injection), category: ReasonPortName, field: "ports[0].name", message: "RFC 1123"},
		{name: "uppercase port name", tweak: portName("HTTP"), category: ReasonPortName, field: "ports[0].name", message: "RFC 1123"},
		{name: "duplicate port names", tweak: func(s *discovery.EndpointSlice) {
			s.Ports = append(s.Ports, epPort("http", 8081, UDP))
		}, category: ReasonPortName, field: "ports[1].name", message: `Duplicate value: "http"`},
		{name: "1000 endpoints", tweak: func(s *discovery.EndpointSlice) { s.Endpoints = manyEndpoints(1000) }, valid: true},
		{name: "1001 endpoints", tweak: func(s *discovery.EndpointSlice) { s.Endpoints = manyEndpoints(1001) }, category: ReasonTooMany, field: "endpoints", message: "must have at most 1000 items"},
		{name: "20001 ports", tweak: func(s *discovery.EndpointSlice) {
			s.Ports = nil
			for i := range 20001 {
				s.Ports = append(s.Ports, epPort("p"+itoa(i), 1+int32(i%65535), TCP))
			}
		}, category: ReasonTooMany, field: "ports", message: "must have at most 20000 items"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			bad := makeSlice(testNS, "svc", "bad", discovery.AddressTypeIPv4, func(s *discovery.EndpointSlice) {
				s.Endpoints = []discovery.Endpoint{sliceEP("198.18.1.1")}
				tc.tweak(s)
			})
			good := makeSlice(testNS, "svc", "good", discovery.AddressTypeIPv4, func(s *discovery.EndpointSlice) {
				s.Endpoints = []discovery.Endpoint{sliceEP("198.18.2.1")}
			})
			var got []*InvalidError
			tr := NewTracker(TrackerOptions{Hostname: thisNode, Families: v4Only, OnInvalid: func(e *InvalidError) { got = append(got, e) }})
			counter := metrics.InvalidObjectsTotal.WithLabelValues("EndpointSlice", tc.category)
			before := testutil.ToFloat64(counter)
			tr.EndpointSliceUpdated(bad)
			tr.EndpointSliceUpdated(good)
			u := tr.Take()
			var goodSeen, badEps int
			for _, eps := range u.Families[IPv4].Endpoints {
				for _, e := range eps {
					if e.IP == addr("198.18.2.1") {
						goodSeen++
					} else {
						badEps++
					}
				}
			}
			if goodSeen == 0 {
				t.Errorf("the valid slice of the batch gave no endpoint")
			}
			if tc.valid {
				if len(got) != 0 || badEps == 0 {
					t.Fatalf("valid slice: %d endpoints, errors %v", badEps, got)
				}
				return
			}
			if badEps != 0 {
				t.Errorf("invalid slice gave %d endpoints, want none", badEps)
			}
			if len(got) == 0 {
				t.Fatalf("no error reported")
			}
			e := got[0]
			if e.Kind != "EndpointSlice" || e.Object != bad.Namespace+"/"+bad.Name || !e.Whole || e.Category != tc.category || e.Field != tc.field || !strings.Contains(e.Reason, tc.message) {
				t.Errorf("error = %+v, want EndpointSlice whole, category %s, field %s, reason containing %q", e, tc.category, tc.field, tc.message)
			}
			if d := testutil.ToFloat64(counter) - before; d != float64(len(got)) {
				t.Errorf("kproxy_invalid_objects_total{kind=EndpointSlice,reason=%s} grew by %v, want %d", tc.category, d, len(got))
			}
		})
	}
}

// TestValidateNode: an invalid Node of this host is as absent.
func TestValidateNode(t *testing.T) {
	tests := []struct {
		name     string
		tweak    func(*v1.Node)
		valid    bool
		category string
		field    string
	}{
		{name: "valid zone", tweak: func(n *v1.Node) { n.Labels = map[string]string{v1.LabelTopologyZone: "zone-a"} }, valid: true},
		{name: "zone with a newline", tweak: func(n *v1.Node) { n.Labels = map[string]string{v1.LabelTopologyZone: "zone\na"} }, category: ReasonLabel, field: "metadata.labels[topology.kubernetes.io/zone]"},
		{name: "zone of 64 characters", tweak: func(n *v1.Node) { n.Labels = map[string]string{v1.LabelTopologyZone: label64} }, category: ReasonLabel, field: "metadata.labels[topology.kubernetes.io/zone]"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got []*InvalidError
			tr := NewTracker(TrackerOptions{Hostname: thisNode, Families: v4Only, OnInvalid: func(e *InvalidError) { got = append(got, e) }})
			tr.NodeUpdated(makeNode(thisNode, nil)) // known and valid first
			tr.Take()
			tr.NodeUpdated(makeNode(thisNode, tc.tweak))
			u := tr.Take()
			if tc.valid {
				if u.Node == nil || len(got) != 0 {
					t.Fatalf("valid node: %+v, errors %v", u.Node, got)
				}
				return
			}
			if u.Node != nil || !u.NodeDeleted || tr.Node() != nil {
				t.Errorf("invalid node: update node %v deleted %v, tracker node %v; want it absent", u.Node, u.NodeDeleted, tr.Node())
			}
			if len(got) != 1 || got[0].Category != tc.category || got[0].Field != tc.field || !got[0].Whole {
				t.Errorf("errors = %v, want one whole %s on %s", got, tc.category, tc.field)
			}
		})
	}
	// A node name that is not a DNS subdomain (the hostname is taken as
	// given, so it can be one).
	if errs := ValidateNode(makeNode("Node_A", nil)); len(errs) != 1 || errs[0].Category != ReasonName {
		t.Errorf("ValidateNode(Node_A) = %v, want one %s", errs, ReasonName)
	}
}

// TestInvalidUpdateIsAbsent: an update that makes a known object invalid
// removes it, and the result is the same as feeding the invalid object to
// a fresh tracker.
func TestInvalidUpdateIsAbsent(t *testing.T) {
	svc := makeService(testNS, "svc", nil)
	badSvc := makeService(testNS, "svc", withPortName(injection))
	slice := makeSlice(testNS, "svc", "s1", discovery.AddressTypeIPv4, func(s *discovery.EndpointSlice) {
		s.Endpoints = []discovery.Endpoint{sliceEP("198.18.1.1")}
	})
	// The service-name label itself becomes invalid: the slice was kept
	// under the old service, and must go from there.
	badSlice := slice.DeepCopy()
	badSlice.Labels[discovery.LabelServiceName] = "svc\n"

	running := NewTracker(TrackerOptions{Hostname: thisNode, Families: v4Only})
	running.ServiceUpdated(svc)
	running.EndpointSliceUpdated(slice)
	u := running.Take()
	if u.Families[IPv4].Services[spn("svc", "http", TCP)] == nil || len(u.Families[IPv4].Endpoints[spn("svc", "http", TCP)]) != 1 {
		t.Fatalf("valid objects not converted: %+v", u.Families[IPv4])
	}
	running.ServiceUpdated(badSvc)
	running.EndpointSliceUpdated(badSlice)
	u = running.Take()
	svcs, eps := u.Families[IPv4].Services, u.Families[IPv4].Endpoints
	if p, ok := svcs[spn("svc", "http", TCP)]; !ok || p != nil {
		t.Errorf("service port after the invalid update: %v (present %v), want a deletion", p, ok)
	}
	if e, ok := eps[spn("svc", "http", TCP)]; !ok || e != nil {
		t.Errorf("endpoints after the invalid update: %v (present %v), want a deletion", e, ok)
	}

	fresh := NewTracker(TrackerOptions{Hostname: thisNode, Families: v4Only})
	fresh.ServiceUpdated(badSvc)
	fresh.EndpointSliceUpdated(badSlice)
	u = fresh.Take()
	if len(u.Families[IPv4].Services) != 0 || len(u.Families[IPv4].Endpoints) != 0 {
		t.Errorf("fresh tracker with invalid objects: %+v, want nothing", u.Families[IPv4])
	}
	// Both now hold no slice at all.
	for name, tr := range map[string]*Tracker{"running": running, "fresh": fresh} {
		if len(tr.slices) != 0 {
			t.Errorf("%s tracker still holds slices: %v", name, tr.slices)
		}
	}
}

func manyEndpoints(n int) []discovery.Endpoint {
	out := make([]discovery.Endpoint, 0, n)
	for i := range n {
		out = append(out, sliceEP("198.18."+itoa(1+i/250)+"."+itoa(1+i%250)))
	}
	return out
}

func itoa(i int) string { return strconv.Itoa(i) }

// TestReportClipped: a name or value of megabytes (a file can hold one)
// is reported with its first bytes and its length, not whole.
func TestReportClipped(t *testing.T) {
	huge := strings.Repeat("x", 1<<20)
	svc := makeService(testNS, "web", func(s *v1.Service) {
		s.Labels = map[string]string{LabelServiceProxyName: huge}
		s.Spec.ClusterIP, s.Spec.ClusterIPs = huge, nil
	})
	_, errs := ConvertService(svc, []v1.IPFamily{IPv4})
	if len(errs) == 0 {
		t.Fatal("no error")
	}
	for _, e := range errs {
		if len(e.Error()) > 2*maxReportText || !strings.Contains(e.Error(), "(1048576 bytes in all)") {
			t.Errorf("report of %d bytes, or without the length: %.200s", len(e.Error()), e.Error())
		}
	}
	_, errs = ConvertService(makeService(testNS, "web", func(s *v1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = huge, nil }), []v1.IPFamily{IPv4})
	if len(errs) != 1 || len(errs[0].Error()) > 2*maxReportText {
		t.Errorf("invalid cluster IP report: %d errors, %d bytes", len(errs), len(errs[0].Error()))
	}
}

// TestValidateServiceNoPortsAllowed: headless and ExternalName services
// may have no ports (the API server allows it); they are skipped, not
// reported.
func TestValidateServiceNoPortsAllowed(t *testing.T) {
	for _, spec := range []v1.ServiceSpec{
		{ClusterIP: v1.ClusterIPNone},
		{Type: v1.ServiceTypeExternalName, ExternalName: "example.com"},
	} {
		svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Name: "a", Namespace: "ns"}, Spec: spec}
		if errs := ValidateService(svc); len(errs) != 0 {
			t.Errorf("%+v: %v", spec, errs)
		}
		if SkipService(svc) == "" {
			t.Errorf("%+v: not skipped", spec)
		}
	}
}
