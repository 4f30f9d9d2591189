package model

// Addresses: 198.18.0.0/16 nodes and pods (198.18.1.x and 198.18.2.x pods),
// 198.19.0.0/16 service IPs, fd00::/8 ULAs for IPv6 (fd00:18:: pods).

import (
	"reflect"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
)

type epsByFamily = map[v1.IPFamily]map[ServicePortName][]*Endpoint

// wantEP is a ready, serving endpoint on port 8080 with no node, edited by tweak.
func wantEP(ip string, tweak func(*Endpoint)) *Endpoint {
	e := &Endpoint{IP: addr(ip), Port: 8080, Ready: true, Serving: true}
	if tweak != nil {
		tweak(e)
	}
	return e
}

func v4HTTP(eps ...*Endpoint) epsByFamily {
	return epsByFamily{IPv4: {httpName: eps}}
}

func TestConvertEndpointSlices(t *testing.T) {
	v4 := discovery.AddressTypeIPv4
	withEPs := func(eps ...discovery.Endpoint) func(*discovery.EndpointSlice) {
		return func(s *discovery.EndpointSlice) { s.Endpoints = eps }
	}
	tests := []struct {
		name     string
		slices   []*discovery.EndpointSlice
		families []v1.IPFamily
		want     epsByFamily
		// wantErrs are the field paths of the reported problems, in order;
		// all of slice wantErrObject.
		wantErrs      []string
		wantErrObject string
	}{{
		name: "conditions: all nil means ready and serving, not terminating",
		slices: []*discovery.EndpointSlice{makeSlice(testNS, "svc", "s1", v4, withEPs(
			sliceEP("198.18.1.1"),
		))},
		want: v4HTTP(wantEP("198.18.1.1", nil)),
	}, {
		// The API says a nil serving condition means true; upstream reads it
		// so whatever ready says.
		name: "conditions: not ready, serving unset, terminating",
		slices: []*discovery.EndpointSlice{makeSlice(testNS, "svc", "s1", v4, withEPs(
			sliceEP("198.18.1.1", conditions(ptr(false), nil, ptr(true))),
			sliceEP("198.18.1.2", conditions(ptr(false), nil, nil)),
		))},
		want: v4HTTP(
			wantEP("198.18.1.1", func(e *Endpoint) { e.Ready, e.Serving, e.Terminating = false, true, true }),
			wantEP("198.18.1.2", func(e *Endpoint) { e.Ready, e.Serving = false, true }),
		),
	}, {
		name: "conditions: explicit values are kept",
		slices: []*discovery.EndpointSlice{makeSlice(testNS, "svc", "s1", v4, withEPs(
			sliceEP("198.18.1.1", conditions(ptr(true), ptr(true), ptr(false))),
			sliceEP("198.18.1.2", terminatingEP),
			sliceEP("198.18.1.3", conditions(ptr(false), ptr(false), ptr(true))),
			sliceEP("198.18.1.4", unreadyEP),
		))},
		want: v4HTTP(
			wantEP("198.18.1.1", nil),
			wantEP("198.18.1.2", func(e *Endpoint) { e.Ready, e.Serving, e.Terminating = false, true, true }),
			wantEP("198.18.1.3", func(e *Endpoint) { e.Ready, e.Serving, e.Terminating = false, false, true }),
			wantEP("198.18.1.4", func(e *Endpoint) { e.Ready, e.Serving = false, false }),
		),
	}, {
		name: "node, zone and hints; local only for this node",
		slices: []*discovery.EndpointSlice{makeSlice(testNS, "svc", "s1", v4, withEPs(
			sliceEP("198.18.1.1", onNode(thisNode), inZone("zone-a"), hints([]string{"zone-a", "zone-b"}, []string{thisNode})),
			sliceEP("198.18.1.2", onNode("node-b"), inZone("zone-b"), hints([]string{"zone-b"}, nil)),
			sliceEP("198.18.1.3", hints(nil, nil)), // empty hints are no hints
		))},
		want: v4HTTP(
			wantEP("198.18.1.1", func(e *Endpoint) {
				e.NodeName, e.Zone, e.Local = thisNode, "zone-a", true
				e.ZoneHints, e.NodeHints = sets.New("zone-a", "zone-b"), sets.New(thisNode)
			}),
			wantEP("198.18.1.2", func(e *Endpoint) {
				e.NodeName, e.Zone, e.ZoneHints = "node-b", "zone-b", sets.New("zone-b")
			}),
			wantEP("198.18.1.3", nil),
		),
	}, {
		name: "FQDN slices are not proxied",
		slices: []*discovery.EndpointSlice{makeSlice(testNS, "svc", "s1", discovery.AddressTypeFQDN, withEPs(
			sliceEP("db.example.com"),
		))},
		want: epsByFamily{},
	}, {
		name: "IPv6 slice on an IPv4 node is ignored",
		slices: []*discovery.EndpointSlice{makeSlice(testNS, "svc", "s1", discovery.AddressTypeIPv6, withEPs(
			sliceEP("fd00:18:1::1"),
		))},
		want: epsByFamily{},
	}, {
		name: "dual-stack: one slice per family",
		slices: []*discovery.EndpointSlice{
			makeSlice(testNS, "svc", "s4", v4, withEPs(sliceEP("198.18.1.1"))),
			makeSlice(testNS, "svc", "s6", discovery.AddressTypeIPv6, withEPs(sliceEP("fd00:18:1::1"))),
		},
		families: dualNode,
		want: epsByFamily{
			IPv4: {httpName: {wantEP("198.18.1.1", nil)}},
			IPv6: {httpName: {wantEP("fd00:18:1::1", nil)}},
		},
	}, {
		name: "address of the wrong family is skipped",
		slices: []*discovery.EndpointSlice{makeSlice(testNS, "svc", "s1", v4, withEPs(
			sliceEP("fd00:18:1::1"), sliceEP("198.18.1.1"),
		))},
		want:     v4HTTP(wantEP("198.18.1.1", nil)),
		wantErrs: []string{"endpoints[0].addresses[0]"}, wantErrObject: "ns/s1",
	}, {
		name: "invalid, zoned and missing addresses are skipped",
		slices: []*discovery.EndpointSlice{makeSlice(testNS, "svc", "s1", discovery.AddressTypeIPv6, withEPs(
			sliceEP("fd00:18:1::1"),
			sliceEP("fd00:18:1::zz"),
			sliceEP("fe80::1%eth0"),
			discovery.Endpoint{},
		))},
		families:      v6Only,
		want:          epsByFamily{IPv6: {httpName: {wantEP("fd00:18:1::1", nil)}}},
		wantErrs:      []string{"endpoints[1].addresses[0]", "endpoints[2].addresses[0]", "endpoints[3].addresses"},
		wantErrObject: "ns/s1",
	}, {
		name: "IPv4 with leading zeros is read like upstream (sloppy parse)",
		slices: []*discovery.EndpointSlice{makeSlice(testNS, "svc", "s1", v4, withEPs(
			sliceEP("198.018.001.001"),
		))},
		want: v4HTTP(wantEP("198.18.1.1", nil)),
	}, {
		name: "only the first address of an endpoint is used",
		slices: []*discovery.EndpointSlice{makeSlice(testNS, "svc", "s1", v4, withEPs(
			discovery.Endpoint{Addresses: []string{"198.18.1.1", "198.18.1.2"}},
		))},
		want: v4HTTP(wantEP("198.18.1.1", nil)),
	}, {
		name: "bad ports are skipped, good ones kept",
		slices: []*discovery.EndpointSlice{makeSlice(testNS, "svc", "s1", v4, func(s *discovery.EndpointSlice) {
			name := "nameless-port"
			s.Ports = []discovery.EndpointPort{
				{Name: &name, Protocol: ptr(TCP)}, // no port number
				epPort("zero", 0, TCP),
				epPort("big", 65536, TCP),
				epPort("ping", 7, "ICMP"),
				{Port: ptr[int32](9), Protocol: ptr(TCP)}, // no name: upstream skips it
				epPort("http", 8080, TCP),
			}
			s.Endpoints = []discovery.Endpoint{sliceEP("198.18.1.1")}
		})},
		want:          v4HTTP(wantEP("198.18.1.1", nil)),
		wantErrs:      []string{"ports[0].port", "ports[1].port", "ports[2].port", "ports[3].protocol", "ports[4].name"},
		wantErrObject: "ns/s1",
	}, {
		name: "missing protocol means TCP",
		slices: []*discovery.EndpointSlice{makeSlice(testNS, "svc", "s1", v4, func(s *discovery.EndpointSlice) {
			s.Ports[0].Protocol = nil
			s.Endpoints = []discovery.Endpoint{sliceEP("198.18.1.1")}
		})},
		want: v4HTTP(wantEP("198.18.1.1", nil)),
	}, {
		name: "slice without the service-name label is skipped",
		slices: []*discovery.EndpointSlice{makeSlice(testNS, "svc", "s1", v4, func(s *discovery.EndpointSlice) {
			s.Labels = nil
			s.Endpoints = []discovery.Endpoint{sliceEP("198.18.1.1")}
		})},
		want:     epsByFamily{},
		wantErrs: []string{"metadata.labels"}, wantErrObject: "ns/s1",
	}, {
		name: "unknown address type is skipped",
		slices: []*discovery.EndpointSlice{makeSlice(testNS, "svc", "s1", "IPX", withEPs(
			sliceEP("198.18.1.1"),
		))},
		want:     epsByFamily{},
		wantErrs: []string{"addressType"}, wantErrObject: "ns/s1",
	}, {
		// Upstream's order (endpointslicecache.go, byEndpoint): by the
		// "ip:port" text: "198.18.1.100:8080" < "198.18.1.10:8080"
		// ('0' < ':') < "198.18.1.9:8080".
		name: "several slices are merged and sorted by ip:port text",
		slices: []*discovery.EndpointSlice{
			makeSlice(testNS, "svc", "s2", v4, withEPs(sliceEP("198.18.1.100"), sliceEP("198.18.2.1"))),
			makeSlice(testNS, "svc", "s1", v4, withEPs(sliceEP("198.18.1.10"), sliceEP("198.18.1.9"))),
		},
		want: v4HTTP(
			wantEP("198.18.1.100", nil), wantEP("198.18.1.10", nil),
			wantEP("198.18.1.9", nil), wantEP("198.18.2.1", nil),
		),
	}, {
		name: "several ports: one list per service port",
		slices: []*discovery.EndpointSlice{makeSlice(testNS, "svc", "s1", v4, func(s *discovery.EndpointSlice) {
			s.Ports = append(s.Ports, epPort("metrics", 9090, TCP), epPort("dns", 5353, UDP))
			s.Endpoints = []discovery.Endpoint{sliceEP("198.18.1.1")}
		})},
		want: epsByFamily{IPv4: {
			httpName:                   {wantEP("198.18.1.1", nil)},
			spn("svc", "metrics", TCP): {wantEP("198.18.1.1", func(e *Endpoint) { e.Port = 9090 })},
			spn("svc", "dns", UDP):     {wantEP("198.18.1.1", func(e *Endpoint) { e.Port = 5353 })},
		}},
	}, {
		name: "slices that differ in ports give a port only their endpoints",
		slices: []*discovery.EndpointSlice{
			makeSlice(testNS, "svc", "s1", v4, withEPs(sliceEP("198.18.1.1"))),
			makeSlice(testNS, "svc", "s2", v4, func(s *discovery.EndpointSlice) {
				s.Ports = []discovery.EndpointPort{epPort("http", 8081, TCP)}
				s.Endpoints = []discovery.Endpoint{sliceEP("198.18.1.2")}
			}),
		},
		want: v4HTTP(wantEP("198.18.1.1", nil), wantEP("198.18.1.2", func(e *Endpoint) { e.Port = 8081 })),
	}, {
		name: "slice with no ports gives no endpoints",
		slices: []*discovery.EndpointSlice{makeSlice(testNS, "svc", "s1", v4, func(s *discovery.EndpointSlice) {
			s.Ports = nil
			s.Endpoints = []discovery.Endpoint{sliceEP("198.18.1.1")}
		})},
		want: epsByFamily{},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fams := tc.families
			if fams == nil {
				fams = v4Only
			}
			got, errs := ConvertEndpointSlices(tc.slices, thisNode, fams)
			if diff := cmp.Diff(endpointValues(tc.want), endpointValues(got), netipComparers); diff != "" {
				t.Errorf("endpoints (-want +got):\n%s", diff)
			}
			checkErrs(t, errs, "EndpointSlice", tc.wantErrObject, tc.wantErrs)
		})
	}
}

// TestConvertEndpointSlicesDuplicates covers an address that two slices
// list, as while an endpoint moves between slices or a new pod reuses the
// IP of a terminating one. The result must not depend on the order of the
// slices.
func TestConvertEndpointSlicesDuplicates(t *testing.T) {
	v4 := discovery.AddressTypeIPv4
	tests := []struct {
		name   string
		s1, s2 discovery.Endpoint
		want   *Endpoint
	}{{
		name: "ready copy wins over an unready one",
		s1:   sliceEP("198.18.1.1", onNode("node-b"), unreadyEP),
		s2:   sliceEP("198.18.1.1", onNode("node-c")),
		want: wantEP("198.18.1.1", func(e *Endpoint) { e.NodeName = "node-c" }),
	}, {
		name: "ready copy wins over a terminating one",
		s1:   sliceEP("198.18.1.1", onNode("node-b"), terminatingEP),
		s2:   sliceEP("198.18.1.1", onNode("node-c")),
		want: wantEP("198.18.1.1", func(e *Endpoint) { e.NodeName = "node-c" }),
	}, {
		// Upstream: a new pod that reuses the IP of a terminating one wins.
		name: "non-terminating copy wins over a terminating one, even if not ready",
		s1:   sliceEP("198.18.1.1", onNode("node-b"), terminatingEP),
		s2:   sliceEP("198.18.1.1", onNode("node-c"), unreadyEP),
		want: wantEP("198.18.1.1", func(e *Endpoint) { e.NodeName, e.Ready, e.Serving = "node-c", false, false }),
	}, {
		name: "two ready copies: the one from the first slice by name wins",
		s1:   sliceEP("198.18.1.1", onNode("node-b")),
		s2:   sliceEP("198.18.1.1", onNode(thisNode)),
		want: wantEP("198.18.1.1", func(e *Endpoint) { e.NodeName = "node-b" }),
	}, {
		name: "two terminating copies: the one from the first slice by name wins",
		s1:   sliceEP("198.18.1.1", onNode("node-b"), terminatingEP),
		s2:   sliceEP("198.18.1.1", onNode("node-c"), terminatingEP),
		want: wantEP("198.18.1.1", func(e *Endpoint) { e.NodeName, e.Ready, e.Terminating = "node-b", false, true }),
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := makeSlice(testNS, "svc", "svc-a", v4, func(s *discovery.EndpointSlice) {
				s.Endpoints = []discovery.Endpoint{tc.s1, sliceEP("198.18.1.2")}
			})
			b := makeSlice(testNS, "svc", "svc-b", v4, func(s *discovery.EndpointSlice) {
				s.Endpoints = []discovery.Endpoint{tc.s2}
			})
			want := v4HTTP(tc.want, wantEP("198.18.1.2", nil))
			for _, order := range [][]*discovery.EndpointSlice{{a, b}, {b, a}} {
				got, errs := ConvertEndpointSlices(order, thisNode, v4Only)
				if len(errs) != 0 {
					t.Errorf("unexpected errors: %v", errs)
				}
				if diff := cmp.Diff(endpointValues(want), endpointValues(got), netipComparers); diff != "" {
					t.Errorf("slices %s, %s: endpoints (-want +got):\n%s", order[0].Name, order[1].Name, diff)
				}
			}
		})
	}
}

func TestConvertEndpointSlicesLocal(t *testing.T) {
	s := makeSlice(testNS, "svc", "s1", discovery.AddressTypeIPv4, func(s *discovery.EndpointSlice) {
		s.Endpoints = []discovery.Endpoint{sliceEP("198.18.1.1", onNode(thisNode)), sliceEP("198.18.1.2")}
	})
	tests := []struct {
		hostname  string
		wantLocal []bool
	}{
		{hostname: thisNode, wantLocal: []bool{true, false}},
		{hostname: "node-b", wantLocal: []bool{false, false}},
		// An endpoint without a node is never local, even with no hostname.
		{hostname: "", wantLocal: []bool{false, false}},
	}
	for _, tc := range tests {
		got, _ := ConvertEndpointSlices([]*discovery.EndpointSlice{s}, tc.hostname, v4Only)
		var local []bool
		for _, e := range got[IPv4][httpName] {
			local = append(local, e.Local)
		}
		if diff := cmp.Diff(tc.wantLocal, local); diff != "" {
			t.Errorf("hostname %q: Local (-want +got):\n%s", tc.hostname, diff)
		}
	}
}

func TestServiceKeyOfSlice(t *testing.T) {
	tests := []struct {
		labels map[string]string
		want   types.NamespacedName
		ok     bool
	}{
		{labels: map[string]string{discovery.LabelServiceName: "svc"}, want: types.NamespacedName{Namespace: testNS, Name: "svc"}, ok: true},
		{labels: map[string]string{discovery.LabelServiceName: ""}, want: types.NamespacedName{Namespace: testNS}},
		{labels: nil, want: types.NamespacedName{Namespace: testNS}},
	}
	for _, tc := range tests {
		s := makeSlice(testNS, "x", "s1", discovery.AddressTypeIPv4, func(s *discovery.EndpointSlice) { s.Labels = tc.labels })
		got, ok := ServiceKeyOfSlice(s)
		if got != tc.want || ok != tc.ok {
			t.Errorf("labels %v: got %v, %v; want %v, %v", tc.labels, got, ok, tc.want, tc.ok)
		}
	}
}

func TestTriggerTime(t *testing.T) {
	tests := []struct {
		annotation *string
		want       time.Time
		ok         bool
	}{
		{annotation: ptr("2026-01-02T03:04:05Z"), want: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), ok: true},
		{annotation: ptr("2026-01-02T03:04:05.5+01:00"), want: time.Date(2026, 1, 2, 2, 4, 5, 5e8, time.UTC), ok: true},
		{annotation: ptr("yesterday")},
		{annotation: ptr("")},
		{annotation: nil},
	}
	for _, tc := range tests {
		s := makeSlice(testNS, "svc", "s1", discovery.AddressTypeIPv4, func(s *discovery.EndpointSlice) {
			if tc.annotation != nil {
				s.Annotations = map[string]string{AnnotationTriggerTime: *tc.annotation}
			}
		})
		got, ok := TriggerTime(s)
		if !got.Equal(tc.want) || ok != tc.ok {
			t.Errorf("annotation %v: got %v, %v; want %v, %v", tc.annotation, got, ok, tc.want, tc.ok)
		}
	}
}

func TestEndpointMethods(t *testing.T) {
	tests := []struct {
		e    *Endpoint
		want string
	}{
		{e: wantEP("198.18.1.1", nil), want: "198.18.1.1:8080"},
		{e: &Endpoint{IP: addr("fd00:18:1::1"), Port: 443}, want: "[fd00:18:1::1]:443"},
	}
	for _, tc := range tests {
		if got := tc.e.String(); got != tc.want {
			t.Errorf("String() = %q, want %q", got, tc.want)
		}
		if got := tc.e.AddrPort().String(); got != tc.want {
			t.Errorf("AddrPort() = %q, want %q", got, tc.want)
		}
	}
}

// TestEndpointEqual changes each field in turn; Equal must notice every one.
func TestEndpointEqual(t *testing.T) {
	base := func() *Endpoint {
		return wantEP("198.18.1.1", func(e *Endpoint) {
			e.NodeName, e.Zone, e.ZoneHints, e.NodeHints = "node-b", "zone-a", sets.New("zone-a"), sets.New("node-b")
		})
	}
	tweaks := map[string]func(*Endpoint){
		"IP":          func(e *Endpoint) { e.IP = addr("198.18.1.2") },
		"Port":        func(e *Endpoint) { e.Port = 8081 },
		"Ready":       func(e *Endpoint) { e.Ready = false },
		"Serving":     func(e *Endpoint) { e.Serving = false },
		"Terminating": func(e *Endpoint) { e.Terminating = true },
		"NodeName":    func(e *Endpoint) { e.NodeName = "node-c" },
		"Zone":        func(e *Endpoint) { e.Zone = "zone-b" },
		"Local":       func(e *Endpoint) { e.Local = true },
		"ZoneHints":   func(e *Endpoint) { e.ZoneHints = sets.New("zone-b") },
		"NodeHints":   func(e *Endpoint) { e.NodeHints = nil },
	}
	typ := reflect.TypeOf(Endpoint{})
	for i := 0; i < typ.NumField(); i++ {
		if _, ok := tweaks[typ.Field(i).Name]; !ok {
			t.Errorf("field %s is not covered by this test", typ.Field(i).Name)
		}
	}
	if !base().Equal(base()) {
		t.Fatalf("equal endpoints compare unequal")
	}
	for field, tweak := range tweaks {
		changed := base()
		tweak(changed)
		if base().Equal(changed) || changed.Equal(base()) {
			t.Errorf("Equal does not notice a change of %s", field)
		}
	}
	// No hints and an empty set of hints mean the same.
	a, b := base(), base()
	a.ZoneHints, b.ZoneHints = nil, sets.New[string]()
	if !a.Equal(b) {
		t.Errorf("nil and empty hint sets compare unequal")
	}
	var nilEP *Endpoint
	if !nilEP.Equal(nil) || nilEP.Equal(base()) || base().Equal(nil) {
		t.Errorf("Equal mishandles nil")
	}
	if !endpointsEqual([]*Endpoint{base()}, []*Endpoint{base()}) || endpointsEqual([]*Endpoint{base()}, nil) {
		t.Errorf("endpointsEqual is wrong")
	}
}
