package model

// Addresses: 198.18.0.0/16 nodes and pods (198.18.1.x pods on this node,
// 198.18.2.x pods elsewhere), 198.19.0.0/16 service IPs (198.19.0.x cluster
// IPs), fd00::/8 ULAs for IPv6 (fd00:18:: pods, fd00:19:: service IPs).

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// summary is an Update in a form that reads well in a test table.
type summary struct {
	// Services maps "IPv4 ns/svc:port/TCP" to "clusterIP:port", or to
	// "gone" for a removed port.
	Services map[string]string
	// Endpoints maps "IPv4 ns/svc:port/TCP" to its endpoints; a nil list
	// means the port has no endpoints any more.
	Endpoints                       map[string][]string
	ServiceChanges, EndpointChanges int
	// Node is the name of the changed Node, "" if unchanged.
	Node        string
	NodeDeleted bool
	Triggers    map[string]time.Time
	Empty       bool
}

func summarize(u *Update) summary {
	s := summary{
		ServiceChanges: u.ServiceChanges, EndpointChanges: u.EndpointChanges,
		NodeDeleted: u.NodeDeleted, Empty: u.Empty(),
	}
	for f, d := range u.Families {
		for name, sp := range d.Services {
			if s.Services == nil {
				s.Services = map[string]string{}
			}
			v := "gone"
			if sp != nil {
				v = netip.AddrPortFrom(sp.ClusterIP, uint16(sp.Port)).String()
			}
			s.Services[fmt.Sprintf("%s %s", f, name)] = v
		}
		for name, eps := range d.Endpoints {
			if s.Endpoints == nil {
				s.Endpoints = map[string][]string{}
			}
			var list []string
			for _, e := range eps {
				list = append(list, e.String())
			}
			s.Endpoints[fmt.Sprintf("%s %s", f, name)] = list
		}
	}
	if u.Node != nil {
		s.Node = u.Node.Name
	}
	for f, byService := range u.TriggerTimes {
		for k, v := range byService {
			if s.Triggers == nil {
				s.Triggers = map[string]time.Time{}
			}
			s.Triggers[fmt.Sprintf("%s %s", f, k)] = v
		}
	}
	return s
}

// trackerStep is one round: do feeds events, then Take is checked.
type trackerStep struct {
	name string
	do   func(tr *Tracker)
	want summary
	// wantOnChange is how many times OnChange was called during do.
	wantOnChange int
	// wantInvalid are the fields reported to OnInvalid during do and Take.
	wantInvalid []string
	// wantApplied lists, per family, the names that State.Apply reports
	// as changed when the delta is applied to a State kept across steps.
	wantApplied map[v1.IPFamily][]string
}

func runTrackerSteps(t *testing.T, families []v1.IPFamily, steps []trackerStep) *Tracker {
	t.Helper()
	var onChange int
	var invalids []string
	tr := NewTracker(TrackerOptions{
		Hostname: thisNode, Families: families,
		OnChange:  func() { onChange++ },
		OnInvalid: func(e *InvalidError) { invalids = append(invalids, e.Field) },
	})
	states := map[v1.IPFamily]*State{}
	for _, f := range families {
		states[f] = NewState(f)
	}
	for _, st := range steps {
		onChange, invalids = 0, nil
		if st.do != nil {
			st.do(tr)
		}
		if onChange != st.wantOnChange {
			t.Errorf("%s: OnChange called %d times, want %d", st.name, onChange, st.wantOnChange)
		}
		svcs, eps := tr.Pending()
		if svcs != st.want.ServiceChanges || eps != st.want.EndpointChanges {
			t.Errorf("%s: Pending() = %d, %d; want %d, %d", st.name, svcs, eps, st.want.ServiceChanges, st.want.EndpointChanges)
		}
		u := tr.Take()
		if diff := cmp.Diff(st.want, summarize(u)); diff != "" {
			t.Errorf("%s: Take() (-want +got):\n%s", st.name, diff)
		}
		if diff := cmp.Diff(st.wantInvalid, invalids); diff != "" {
			t.Errorf("%s: OnInvalid fields (-want +got):\n%s", st.name, diff)
		}
		if got := sortedFamilies(u); !slices.Equal(got, families) {
			t.Errorf("%s: Update has families %v, want %v", st.name, got, families)
		}
		for _, f := range families {
			changed := states[f].Apply(u.Families[f])
			var names []string
			for n := range changed {
				names = append(names, n.String())
			}
			slices.Sort(names)
			if diff := cmp.Diff(st.wantApplied[f], names); diff != "" {
				t.Errorf("%s: %s State.Apply changed (-want +got):\n%s", st.name, f, diff)
			}
		}
		// Take resets: nothing is left for the next one.
		if s := summarize(tr.Take()); !s.Empty || s.ServiceChanges != 0 || s.EndpointChanges != 0 || s.Triggers != nil {
			t.Errorf("%s: second Take() is not empty: %+v", st.name, s)
		}
	}
	return tr
}

func sortedFamilies(u *Update) []v1.IPFamily {
	var out []v1.IPFamily
	for f := range u.Families {
		out = append(out, f)
	}
	slices.Sort(out) // "IPv4" < "IPv6", the order used in these tests
	return out
}

func TestTrackerServices(t *testing.T) {
	twoPorts := func(s *v1.Service) {
		dualStack(s)
		s.Spec.Ports = append(s.Spec.Ports, v1.ServicePort{Name: "metrics", Port: 9090, Protocol: TCP, TargetPort: intstr.FromInt32(9090)})
	}
	svcA := makeService(testNS, "a", twoPorts)
	const (
		v4HTTP    = "IPv4 ns/a:http/TCP"
		v4Metrics = "IPv4 ns/a:metrics/TCP"
		v6HTTP    = "IPv6 ns/a:http/TCP"
		v6Metrics = "IPv6 ns/a:metrics/TCP"
	)
	steps := []trackerStep{{
		name:         "add a dual-stack service with two ports",
		do:           func(tr *Tracker) { tr.ServiceUpdated(svcA) },
		wantOnChange: 1,
		want: summary{ServiceChanges: 1, Services: map[string]string{
			v4HTTP: "198.19.0.1:80", v4Metrics: "198.19.0.1:9090",
			v6HTTP: "[fd00:19::1]:80", v6Metrics: "[fd00:19::1]:9090",
		}},
		wantApplied: map[v1.IPFamily][]string{
			IPv4: {"ns/a:http/TCP", "ns/a:metrics/TCP"}, IPv6: {"ns/a:http/TCP", "ns/a:metrics/TCP"},
		},
	}, {
		name: "no event, nothing to take",
		want: summary{Empty: true},
	}, {
		// The tracker sends the service again; the State sees nothing new.
		name:         "update that changes nothing",
		do:           func(tr *Tracker) { tr.ServiceUpdated(makeService(testNS, "a", twoPorts)) },
		wantOnChange: 1,
		want: summary{ServiceChanges: 1, Services: map[string]string{
			v4HTTP: "198.19.0.1:80", v4Metrics: "198.19.0.1:9090",
			v6HTTP: "[fd00:19::1]:80", v6Metrics: "[fd00:19::1]:9090",
		}},
	}, {
		name:         "a port removed from the service appears as gone",
		do:           func(tr *Tracker) { tr.ServiceUpdated(makeService(testNS, "a", dualStack)) },
		wantOnChange: 1,
		want: summary{ServiceChanges: 1, Services: map[string]string{
			v4HTTP: "198.19.0.1:80", v4Metrics: "gone", v6HTTP: "[fd00:19::1]:80", v6Metrics: "gone",
		}},
		wantApplied: map[v1.IPFamily][]string{IPv4: {"ns/a:metrics/TCP"}, IPv6: {"ns/a:metrics/TCP"}},
	}, {
		name: "two updates fold into one delta with the last state",
		do: func(tr *Tracker) {
			tr.ServiceUpdated(makeService(testNS, "a", func(s *v1.Service) { dualStack(s); s.Spec.Ports[0].Port = 81 }))
			tr.ServiceUpdated(makeService(testNS, "a", func(s *v1.Service) { dualStack(s); s.Spec.Ports[0].Port = 82 }))
		},
		wantOnChange: 2,
		want: summary{ServiceChanges: 2, Services: map[string]string{
			v4HTTP: "198.19.0.1:82", v6HTTP: "[fd00:19::1]:82",
		}},
		wantApplied: map[v1.IPFamily][]string{IPv4: {"ns/a:http/TCP"}, IPv6: {"ns/a:http/TCP"}},
	}, {
		name:         "becoming IPv4 single-stack removes the IPv6 port",
		do:           func(tr *Tracker) { tr.ServiceUpdated(makeService(testNS, "a", nil)) },
		wantOnChange: 1,
		want: summary{ServiceChanges: 1, Services: map[string]string{
			v4HTTP: "198.19.0.1:80", v6HTTP: "gone",
		}},
		wantApplied: map[v1.IPFamily][]string{IPv4: {"ns/a:http/TCP"}, IPv6: {"ns/a:http/TCP"}},
	}, {
		name: "an invalid cluster IP removes the whole service",
		do: func(tr *Tracker) {
			tr.ServiceUpdated(makeService(testNS, "a", func(s *v1.Service) { s.Spec.ClusterIPs = []string{"198.19.0.300"} }))
		},
		wantOnChange: 1,
		wantInvalid:  []string{"spec.clusterIPs[0]"},
		want:         summary{ServiceChanges: 1, Services: map[string]string{v4HTTP: "gone"}},
		wantApplied:  map[v1.IPFamily][]string{IPv4: {"ns/a:http/TCP"}},
	}, {
		name:         "fixed again",
		do:           func(tr *Tracker) { tr.ServiceUpdated(makeService(testNS, "a", nil)) },
		wantOnChange: 1,
		want:         summary{ServiceChanges: 1, Services: map[string]string{v4HTTP: "198.19.0.1:80"}},
		wantApplied:  map[v1.IPFamily][]string{IPv4: {"ns/a:http/TCP"}},
	}, {
		name: "added then deleted before a Take: the consumer never saw it",
		do: func(tr *Tracker) {
			b := makeService(testNS, "b", func(s *v1.Service) { s.Spec.ClusterIPs = []string{"198.19.0.2"} })
			tr.ServiceUpdated(b)
			tr.ServiceDeleted(b)
		},
		wantOnChange: 2,
		want:         summary{ServiceChanges: 2, Empty: true},
	}, {
		name:         "deleted service appears as gone",
		do:           func(tr *Tracker) { tr.ServiceDeleted(makeService(testNS, "a", nil)) },
		wantOnChange: 1,
		want:         summary{ServiceChanges: 1, Services: map[string]string{v4HTTP: "gone"}},
		wantApplied:  map[v1.IPFamily][]string{IPv4: {"ns/a:http/TCP"}},
	}, {
		name:         "deleting it again sends nothing",
		do:           func(tr *Tracker) { tr.ServiceDeleted(makeService(testNS, "a", nil)) },
		wantOnChange: 1,
		want:         summary{ServiceChanges: 1, Empty: true},
	}, {
		name: "headless and ExternalName services send nothing",
		do: func(tr *Tracker) {
			tr.ServiceUpdated(makeService(testNS, "h", func(s *v1.Service) {
				s.Spec.ClusterIP, s.Spec.ClusterIPs = v1.ClusterIPNone, []string{v1.ClusterIPNone}
			}))
			tr.ServiceUpdated(makeService(testNS, "x", func(s *v1.Service) { s.Spec.Type = v1.ServiceTypeExternalName }))
		},
		wantOnChange: 2,
		want:         summary{ServiceChanges: 2, Empty: true},
	}, {
		name:         "added again",
		do:           func(tr *Tracker) { tr.ServiceUpdated(makeService(testNS, "a", nil)) },
		wantOnChange: 1,
		want:         summary{ServiceChanges: 1, Services: map[string]string{v4HTTP: "198.19.0.1:80"}},
		wantApplied:  map[v1.IPFamily][]string{IPv4: {"ns/a:http/TCP"}},
	}, {
		name: "a service handed to another proxy is removed",
		do: func(tr *Tracker) {
			tr.ServiceUpdated(makeService(testNS, "a", func(s *v1.Service) {
				s.Labels = map[string]string{LabelServiceProxyName: "other"}
			}))
		},
		wantOnChange: 1,
		want:         summary{ServiceChanges: 1, Services: map[string]string{v4HTTP: "gone"}},
		wantApplied:  map[v1.IPFamily][]string{IPv4: {"ns/a:http/TCP"}},
	}}
	runTrackerSteps(t, dualNode, steps)
}

func TestTrackerEndpointSlices(t *testing.T) {
	v4 := discovery.AddressTypeIPv4
	sliceA1 := func(tweak func(*discovery.EndpointSlice)) *discovery.EndpointSlice {
		return makeSlice(testNS, "a", "a-1", v4, func(s *discovery.EndpointSlice) {
			s.Endpoints = []discovery.Endpoint{sliceEP("198.18.1.1", onNode(thisNode)), sliceEP("198.18.2.2", onNode("node-b"))}
			if tweak != nil {
				tweak(s)
			}
		})
	}
	sliceA2 := makeSlice(testNS, "a", "a-2", v4, func(s *discovery.EndpointSlice) {
		s.Endpoints = []discovery.Endpoint{sliceEP("198.18.2.1", onNode("node-b"))}
	})
	const (
		http    = "IPv4 ns/a:http/TCP"
		metrics = "IPv4 ns/a:metrics/TCP"
	)
	steps := []trackerStep{{
		name:         "first slice",
		do:           func(tr *Tracker) { tr.EndpointSliceUpdated(sliceA1(nil)) },
		wantOnChange: 1,
		want:         summary{EndpointChanges: 1, Endpoints: map[string][]string{http: {"198.18.1.1:8080", "198.18.2.2:8080"}}},
		wantApplied:  map[v1.IPFamily][]string{IPv4: {"ns/a:http/TCP"}},
	}, {
		name:         "second slice of the same service is merged",
		do:           func(tr *Tracker) { tr.EndpointSliceUpdated(sliceA2) },
		wantOnChange: 1,
		want:         summary{EndpointChanges: 1, Endpoints: map[string][]string{http: {"198.18.1.1:8080", "198.18.2.1:8080", "198.18.2.2:8080"}}},
		wantApplied:  map[v1.IPFamily][]string{IPv4: {"ns/a:http/TCP"}},
	}, {
		name:         "update that changes nothing",
		do:           func(tr *Tracker) { tr.EndpointSliceUpdated(sliceA1(nil)) },
		wantOnChange: 1,
		want:         summary{EndpointChanges: 1, Endpoints: map[string][]string{http: {"198.18.1.1:8080", "198.18.2.1:8080", "198.18.2.2:8080"}}},
	}, {
		name: "endpoint removed, port added",
		do: func(tr *Tracker) {
			tr.EndpointSliceUpdated(sliceA1(func(s *discovery.EndpointSlice) {
				s.Endpoints = s.Endpoints[:1]
				s.Ports = append(s.Ports, epPort("metrics", 9090, TCP))
			}))
		},
		wantOnChange: 1,
		want: summary{EndpointChanges: 1, Endpoints: map[string][]string{
			http: {"198.18.1.1:8080", "198.18.2.1:8080"}, metrics: {"198.18.1.1:9090"},
		}},
		wantApplied: map[v1.IPFamily][]string{IPv4: {"ns/a:http/TCP", "ns/a:metrics/TCP"}},
	}, {
		name: "port removed from the slice: its endpoints are gone",
		do: func(tr *Tracker) {
			tr.EndpointSliceUpdated(sliceA1(func(s *discovery.EndpointSlice) { s.Endpoints = s.Endpoints[:1] }))
		},
		wantOnChange: 1,
		want: summary{EndpointChanges: 1, Endpoints: map[string][]string{
			http: {"198.18.1.1:8080", "198.18.2.1:8080"}, metrics: nil,
		}},
		wantApplied: map[v1.IPFamily][]string{IPv4: {"ns/a:metrics/TCP"}},
	}, {
		name:         "one slice deleted",
		do:           func(tr *Tracker) { tr.EndpointSliceDeleted(sliceA1(nil)) },
		wantOnChange: 1,
		want:         summary{EndpointChanges: 1, Endpoints: map[string][]string{http: {"198.18.2.1:8080"}}},
		wantApplied:  map[v1.IPFamily][]string{IPv4: {"ns/a:http/TCP"}},
	}, {
		name:         "last slice deleted: no endpoints",
		do:           func(tr *Tracker) { tr.EndpointSliceDeleted(sliceA2) },
		wantOnChange: 1,
		want:         summary{EndpointChanges: 1, Endpoints: map[string][]string{http: nil}},
		wantApplied:  map[v1.IPFamily][]string{IPv4: {"ns/a:http/TCP"}},
	}, {
		name:         "deleting it again sends nothing",
		do:           func(tr *Tracker) { tr.EndpointSliceDeleted(sliceA2) },
		wantOnChange: 1,
		want:         summary{EndpointChanges: 1, Empty: true},
	}, {
		name: "slice without the service-name label is reported and ignored",
		do: func(tr *Tracker) {
			tr.EndpointSliceUpdated(makeSlice(testNS, "a", "orphan", v4, func(s *discovery.EndpointSlice) {
				s.Labels = nil
				s.Endpoints = []discovery.Endpoint{sliceEP("198.18.1.9")}
			}))
			tr.EndpointSliceDeleted(makeSlice(testNS, "a", "orphan", v4, func(s *discovery.EndpointSlice) { s.Labels = nil }))
		},
		wantInvalid: []string{"metadata.labels"},
		want:        summary{Empty: true},
	}, {
		// Upstream ignores such slices before counting them.
		name: "FQDN slices are ignored",
		do: func(tr *Tracker) {
			s := makeSlice(testNS, "a", "fqdn", discovery.AddressTypeFQDN, func(s *discovery.EndpointSlice) {
				s.Endpoints = []discovery.Endpoint{sliceEP("db.example.com")}
			})
			tr.EndpointSliceUpdated(s)
			tr.EndpointSliceDeleted(s)
		},
		want: summary{Empty: true},
	}, {
		name: "invalid endpoint is reported at Take",
		do: func(tr *Tracker) {
			tr.EndpointSliceUpdated(makeSlice(testNS, "a", "a-3", v4, func(s *discovery.EndpointSlice) {
				s.Endpoints = []discovery.Endpoint{sliceEP("198.18.1.300"), sliceEP("198.18.1.3")}
			}))
		},
		wantOnChange: 1,
		wantInvalid:  []string{"endpoints[0].addresses[0]"},
		want:         summary{EndpointChanges: 1, Endpoints: map[string][]string{http: {"198.18.1.3:8080"}}},
		wantApplied:  map[v1.IPFamily][]string{IPv4: {"ns/a:http/TCP"}},
	}, {
		// Upstream's informers select only slices without these labels; a
		// slice that gains one is gone for the proxy.
		name: "slice that gains the service-proxy-name label is removed",
		do: func(tr *Tracker) {
			tr.EndpointSliceUpdated(makeSlice(testNS, "a", "a-3", v4, func(s *discovery.EndpointSlice) {
				s.Labels[LabelServiceProxyName] = "other"
				s.Endpoints = []discovery.Endpoint{sliceEP("198.18.1.3")}
			}))
		},
		wantOnChange: 1,
		want:         summary{EndpointChanges: 1, Endpoints: map[string][]string{http: nil}},
		wantApplied:  map[v1.IPFamily][]string{IPv4: {"ns/a:http/TCP"}},
	}, {
		name: "slices of headless services are ignored",
		do: func(tr *Tracker) {
			tr.EndpointSliceUpdated(makeSlice(testNS, "h", "h-1", v4, func(s *discovery.EndpointSlice) {
				s.Labels[LabelHeadless] = ""
				s.Endpoints = []discovery.Endpoint{sliceEP("198.18.1.4")}
			}))
		},
		want: summary{Empty: true},
	}, {
		name: "IPv6 slice on an IPv4 node: counted, nothing sent",
		do: func(tr *Tracker) {
			tr.EndpointSliceUpdated(makeSlice(testNS, "a", "a-6", discovery.AddressTypeIPv6, func(s *discovery.EndpointSlice) {
				s.Endpoints = []discovery.Endpoint{sliceEP("fd00:18:1::1")}
			}))
		},
		wantOnChange: 1,
		want:         summary{EndpointChanges: 1, Empty: true},
	}}
	runTrackerSteps(t, v4Only, steps)
}
