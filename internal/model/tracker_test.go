package model

// Addresses: 198.18.0.0/16 nodes and pods (198.18.1.x pods on this node,
// 198.18.2.x pods elsewhere), 198.19.0.0/16 service IPs (198.19.0.x cluster
// IPs), fd00::/8 ULAs for IPv6 (fd00:18:: pods, fd00:19:: service IPs).

import (
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/sets"
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

func TestTrackerTriggerTimes(t *testing.T) {
	v4 := discovery.AddressTypeIPv4
	// The tracker is made by runTrackerSteps after this; times before it
	// are from before the proxy started and must not count (upstream does
	// the same, or the first sync would report hours of latency).
	start := time.Now()
	t1, t2 := start.Add(time.Hour).UTC().Truncate(time.Second), start.Add(2*time.Hour).UTC().Truncate(time.Second)
	old := start.Add(-time.Hour).UTC()
	slice := func(svc, name string, tt *time.Time) *discovery.EndpointSlice {
		return makeSlice(testNS, svc, name, v4, func(s *discovery.EndpointSlice) {
			if tt != nil {
				s.Annotations = map[string]string{AnnotationTriggerTime: tt.Format(time.RFC3339Nano)}
			}
			s.Endpoints = []discovery.Endpoint{sliceEP("198.18.1.1")}
		})
	}
	steps := []trackerStep{{
		name: "earliest time per service is kept",
		do: func(tr *Tracker) {
			tr.EndpointSliceUpdated(slice("a", "a-1", &t2))
			tr.EndpointSliceUpdated(slice("a", "a-2", &t1))
			tr.EndpointSliceUpdated(slice("a", "a-1", &t2))
			tr.EndpointSliceUpdated(slice("b", "b-1", &t2))
		},
		wantOnChange: 4,
		want: summary{
			EndpointChanges: 4,
			Endpoints:       map[string][]string{"IPv4 ns/a:http/TCP": {"198.18.1.1:8080"}, "IPv4 ns/b:http/TCP": {"198.18.1.1:8080"}},
			Triggers:        map[string]time.Time{"IPv4 ns/a": t1, "IPv4 ns/b": t2},
		},
		wantApplied: map[v1.IPFamily][]string{IPv4: {"ns/a:http/TCP", "ns/b:http/TCP"}},
	}, {
		name:         "times are reset by Take",
		do:           func(tr *Tracker) { tr.EndpointSliceUpdated(slice("a", "a-1", &t2)) },
		wantOnChange: 1,
		want: summary{
			EndpointChanges: 1,
			Endpoints:       map[string][]string{"IPv4 ns/a:http/TCP": {"198.18.1.1:8080"}},
			Triggers:        map[string]time.Time{"IPv4 ns/a": t2},
		},
	}, {
		name: "times from before the tracker started and missing times are ignored",
		do: func(tr *Tracker) {
			tr.EndpointSliceUpdated(slice("a", "a-1", &old))
			tr.EndpointSliceUpdated(slice("b", "b-1", nil))
		},
		wantOnChange: 2,
		want: summary{
			EndpointChanges: 2,
			Endpoints:       map[string][]string{"IPv4 ns/a:http/TCP": {"198.18.1.1:8080"}, "IPv4 ns/b:http/TCP": {"198.18.1.1:8080"}},
		},
	}, {
		// A deleted slice's annotation tells when it was last written, not
		// when it was deleted: upstream drops the service's times then.
		name: "deleting a slice drops the service's times",
		do: func(tr *Tracker) {
			tr.EndpointSliceUpdated(slice("a", "a-1", &t1))
			tr.EndpointSliceDeleted(slice("a", "a-2", &t1))
			tr.EndpointSliceUpdated(slice("b", "b-1", &t1))
		},
		wantOnChange: 3,
		want: summary{
			EndpointChanges: 3,
			Endpoints:       map[string][]string{"IPv4 ns/a:http/TCP": {"198.18.1.1:8080"}, "IPv4 ns/b:http/TCP": {"198.18.1.1:8080"}},
			Triggers:        map[string]time.Time{"IPv4 ns/b": t1},
		},
	}}
	runTrackerSteps(t, v4Only, steps)
}

// TestTrackerTriggerTimesPerFamily: a slice's trigger time counts in the
// family of its address type only, and deleting a slice of one family
// keeps the other family's time (upstream's change tracker per family).
func TestTrackerTriggerTimesPerFamily(t *testing.T) {
	t1 := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	slice := func(name string, at discovery.AddressType, addr string) *discovery.EndpointSlice {
		return makeSlice(testNS, "a", name, at, func(s *discovery.EndpointSlice) {
			s.Annotations = map[string]string{AnnotationTriggerTime: t1.Format(time.RFC3339Nano)}
			s.Endpoints = []discovery.Endpoint{sliceEP(addr)}
		})
	}
	v4, v6 := slice("a-4", discovery.AddressTypeIPv4, "198.18.1.1"), slice("a-6", discovery.AddressTypeIPv6, "fd00:18::1")
	eps := func(f v1.IPFamily) map[string][]string {
		if f == IPv4 {
			return map[string][]string{"IPv4 ns/a:http/TCP": {"198.18.1.1:8080"}}
		}
		return map[string][]string{"IPv6 ns/a:http/TCP": {"[fd00:18::1]:8080"}}
	}
	steps := []trackerStep{{
		name:         "IPv4 slice: IPv4 only",
		do:           func(tr *Tracker) { tr.EndpointSliceUpdated(v4) },
		wantOnChange: 1,
		want:         summary{EndpointChanges: 1, Endpoints: eps(IPv4), Triggers: map[string]time.Time{"IPv4 ns/a": t1}},
		wantApplied:  map[v1.IPFamily][]string{IPv4: {"ns/a:http/TCP"}},
	}, {
		name:         "IPv6 slice: IPv6 only",
		do:           func(tr *Tracker) { tr.EndpointSliceUpdated(v6) },
		wantOnChange: 1,
		want:         summary{EndpointChanges: 1, Endpoints: merge(eps(IPv4), eps(IPv6)), Triggers: map[string]time.Time{"IPv6 ns/a": t1}},
		wantApplied:  map[v1.IPFamily][]string{IPv6: {"ns/a:http/TCP"}},
	}, {
		name: "deleting the IPv6 slice keeps the IPv4 time",
		do: func(tr *Tracker) {
			tr.EndpointSliceUpdated(v4)
			tr.EndpointSliceDeleted(v6)
		},
		wantOnChange: 2,
		want:         summary{EndpointChanges: 2, Endpoints: merge(eps(IPv4), map[string][]string{"IPv6 ns/a:http/TCP": nil}), Triggers: map[string]time.Time{"IPv4 ns/a": t1}},
		wantApplied:  map[v1.IPFamily][]string{IPv6: {"ns/a:http/TCP"}},
	}}
	runTrackerSteps(t, dualNode, steps)
}

// merge returns the union of two endpoint summaries.
func merge(a, b map[string][]string) map[string][]string {
	out := map[string][]string{}
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		out[k] = v
	}
	return out
}

func TestTrackerNode(t *testing.T) {
	labelled := func(zone string) *v1.Node {
		return makeNode(thisNode, func(n *v1.Node) { n.Labels = map[string]string{v1.LabelTopologyZone: zone} })
	}
	steps := []trackerStep{{
		name: "another node is ignored",
		do: func(tr *Tracker) {
			tr.NodeUpdated(makeNode("node-b", nil))
			tr.NodeDeleted(makeNode("node-b", nil))
		},
		want: summary{Empty: true},
	}, {
		name:         "this node added",
		do:           func(tr *Tracker) { tr.NodeUpdated(labelled("zone-a")) },
		wantOnChange: 1,
		want:         summary{Node: thisNode},
	}, {
		name: "this node updated twice: the last one is sent",
		do: func(tr *Tracker) {
			tr.NodeUpdated(labelled("zone-b"))
			tr.NodeUpdated(labelled("zone-c"))
		},
		wantOnChange: 2,
		want:         summary{Node: thisNode},
	}, {
		name:         "this node deleted",
		do:           func(tr *Tracker) { tr.NodeDeleted(labelled("zone-c")) },
		wantOnChange: 1,
		want:         summary{NodeDeleted: true},
	}, {
		name: "deleted and created again before a Take",
		do: func(tr *Tracker) {
			tr.NodeDeleted(labelled("zone-c"))
			tr.NodeUpdated(labelled("zone-d"))
		},
		wantOnChange: 2,
		want:         summary{Node: thisNode},
	}, {
		name: "created and deleted before a Take",
		do: func(tr *Tracker) {
			tr.NodeUpdated(labelled("zone-e"))
			tr.NodeDeleted(labelled("zone-e"))
		},
		wantOnChange: 2,
		want:         summary{NodeDeleted: true},
	}, {
		name: "invalid parts are reported",
		do: func(tr *Tracker) {
			tr.NodeUpdated(makeNode(thisNode, func(n *v1.Node) { n.Spec.PodCIDRs = []string{"x"} }))
		},
		wantOnChange: 1,
		wantInvalid:  []string{"spec.podCIDRs[0]"},
		want:         summary{Node: thisNode},
	}}
	tr := runTrackerSteps(t, v4Only, steps)
	if n := tr.Node(); n == nil || n.Name != thisNode || len(n.PodCIDRs) != 0 {
		t.Errorf("Node() = %+v, want the last one seen", n)
	}
}

func TestTrackerNodeValue(t *testing.T) {
	tr := NewTracker(TrackerOptions{Hostname: thisNode})
	if tr.Node() != nil {
		t.Fatalf("Node() before any event = %v, want nil", tr.Node())
	}
	tr.NodeUpdated(makeNode(thisNode, func(n *v1.Node) { n.Labels = map[string]string{v1.LabelTopologyZone: "zone-a"} }))
	if z := tr.Take().Node.Zone(); z != "zone-a" {
		t.Errorf("Take().Node.Zone() = %q, want zone-a", z)
	}
	if z := tr.Node().Zone(); z != "zone-a" {
		t.Errorf("Node().Zone() = %q, want zone-a", z)
	}
	tr.NodeDeleted(makeNode(thisNode, nil))
	if tr.Node() != nil {
		t.Errorf("Node() after deletion = %v, want nil", tr.Node())
	}
}

func TestTrackerSynced(t *testing.T) {
	changes := 0
	tr := NewTracker(TrackerOptions{OnChange: func() { changes++ }})
	if tr.HasSynced() {
		t.Errorf("HasSynced() before Synced = true")
	}
	tr.Synced()
	if !tr.HasSynced() {
		t.Errorf("HasSynced() after Synced = false")
	}
	if changes != 1 {
		t.Errorf("Synced called OnChange %d times, want 1", changes)
	}
	if !tr.Take().Empty() {
		t.Errorf("Synced alone is a change")
	}
	if got := tr.Families(); !slices.Equal(got, []v1.IPFamily{IPv4}) {
		t.Errorf("default Families() = %v, want [IPv4]", got)
	}
}

// TestTrackerCallbacksMayCallBack checks that the callbacks run without the
// tracker's lock: a callback that asks the tracker something must not hang.
func TestTrackerCallbacksMayCallBack(t *testing.T) {
	var tr *Tracker
	calls := 0
	callBack := func() {
		calls++
		tr.Pending()
		tr.HasSynced()
	}
	tr = NewTracker(TrackerOptions{
		Hostname:  thisNode,
		OnChange:  callBack,
		OnInvalid: func(*InvalidError) { callBack() },
	})
	done := make(chan struct{})
	go func() {
		defer close(done)
		tr.ServiceUpdated(makeService(testNS, "a", func(s *v1.Service) { s.Spec.ExternalIPs = []string{"bad"} }))
		tr.EndpointSliceUpdated(makeSlice(testNS, "a", "a-1", discovery.AddressTypeIPv4, func(s *discovery.EndpointSlice) {
			s.Endpoints = []discovery.Endpoint{sliceEP("bad")}
		}))
		tr.NodeUpdated(makeNode(thisNode, func(n *v1.Node) { n.Spec.PodCIDRs = []string{"bad"} }))
		tr.Synced()
		tr.Take()
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("a callback that calls the tracker deadlocked (after %d calls)", calls)
	}
	// OnChange for each of the 4 events; OnInvalid for the service, the
	// node and (at Take) the slice.
	if calls != 7 {
		t.Errorf("callbacks called %d times, want 7", calls)
	}
}

// TestTrackerConcurrent feeds events from several goroutines while another
// takes updates; run with -race. In the end every service and endpoint must
// have reached the consumer exactly as last sent.
func TestTrackerConcurrent(t *testing.T) {
	tr := NewTracker(TrackerOptions{Hostname: thisNode, OnChange: func() {}})
	state := NewState(IPv4)
	const workers, services = 4, 25
	stop := make(chan struct{})
	taken := make(chan struct{})
	go func() {
		defer close(taken)
		for {
			select {
			case <-stop:
				state.Apply(tr.Take().Families[IPv4])
				return
			default:
				state.Apply(tr.Take().Families[IPv4])
			}
		}
	}()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range services {
				name := fmt.Sprintf("w%d-s%d", w, i)
				ip := fmt.Sprintf("198.19.%d.%d", w, i+1)
				tr.ServiceUpdated(makeService(testNS, name, func(s *v1.Service) { s.Spec.ClusterIPs = []string{ip} }))
				tr.EndpointSliceUpdated(makeSlice(testNS, name, name+"-1", discovery.AddressTypeIPv4, func(s *discovery.EndpointSlice) {
					s.Endpoints = []discovery.Endpoint{sliceEP(fmt.Sprintf("198.18.%d.%d", w+1, i+1))}
				}))
				if i%5 == 0 {
					tr.ServiceDeleted(makeService(testNS, name, nil))
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	<-taken
	var wantServices, gotServices []string
	for w := range workers {
		for i := range services {
			if i%5 != 0 {
				wantServices = append(wantServices, fmt.Sprintf("ns/w%d-s%d:http/TCP 198.19.%d.%d", w, i, w, i+1))
			}
		}
	}
	for n, sp := range state.Services {
		gotServices = append(gotServices, fmt.Sprintf("%s %s", n, sp.ClusterIP))
	}
	slices.Sort(wantServices)
	slices.Sort(gotServices)
	if diff := cmp.Diff(wantServices, gotServices); diff != "" {
		t.Errorf("services after all updates (-want +got):\n%s", diff)
	}
	if got, want := len(state.Endpoints), workers*services; got != want {
		t.Errorf("%d ports with endpoints, want %d", got, want)
	}
}

func TestStateApply(t *testing.T) {
	port := func(n ServicePortName, p int32) *ServicePort {
		return &ServicePort{Name: n, Family: IPv4, ClusterIP: clusterV4, Port: p, Protocol: TCP}
	}
	a, b := spn("a", "http", TCP), spn("b", "http", TCP)
	initial := func() *State {
		s := NewState(IPv4)
		s.Services[a] = port(a, 80)
		s.Endpoints[a] = []*Endpoint{wantEP("198.18.1.1", nil)}
		return s
	}
	tests := []struct {
		name        string
		delta       *FamilyDelta
		wantChanged []ServicePortName
		wantPorts   map[ServicePortName]int32 // port number per remaining service
		wantEPs     map[ServicePortName][]string
	}{{
		name:      "nil delta",
		delta:     nil,
		wantPorts: map[ServicePortName]int32{a: 80}, wantEPs: map[ServicePortName][]string{a: {"198.18.1.1:8080"}},
	}, {
		name:      "equal service and endpoints in new objects: no change",
		delta:     &FamilyDelta{Services: map[ServicePortName]*ServicePort{a: port(a, 80)}, Endpoints: map[ServicePortName][]*Endpoint{a: {wantEP("198.18.1.1", nil)}}},
		wantPorts: map[ServicePortName]int32{a: 80}, wantEPs: map[ServicePortName][]string{a: {"198.18.1.1:8080"}},
	}, {
		name:        "service changed",
		delta:       &FamilyDelta{Services: map[ServicePortName]*ServicePort{a: port(a, 81)}},
		wantChanged: []ServicePortName{a},
		wantPorts:   map[ServicePortName]int32{a: 81}, wantEPs: map[ServicePortName][]string{a: {"198.18.1.1:8080"}},
	}, {
		name:        "service added",
		delta:       &FamilyDelta{Services: map[ServicePortName]*ServicePort{b: port(b, 80)}},
		wantChanged: []ServicePortName{b},
		wantPorts:   map[ServicePortName]int32{a: 80, b: 80}, wantEPs: map[ServicePortName][]string{a: {"198.18.1.1:8080"}},
	}, {
		name:        "service removed",
		delta:       &FamilyDelta{Services: map[ServicePortName]*ServicePort{a: nil}},
		wantChanged: []ServicePortName{a},
		wantPorts:   map[ServicePortName]int32{}, wantEPs: map[ServicePortName][]string{a: {"198.18.1.1:8080"}},
	}, {
		name:      "unknown service removed: no change",
		delta:     &FamilyDelta{Services: map[ServicePortName]*ServicePort{b: nil}},
		wantPorts: map[ServicePortName]int32{a: 80}, wantEPs: map[ServicePortName][]string{a: {"198.18.1.1:8080"}},
	}, {
		name:        "endpoint condition changed",
		delta:       &FamilyDelta{Endpoints: map[ServicePortName][]*Endpoint{a: {wantEP("198.18.1.1", func(e *Endpoint) { e.Ready = false })}}},
		wantChanged: []ServicePortName{a},
		wantPorts:   map[ServicePortName]int32{a: 80}, wantEPs: map[ServicePortName][]string{a: {"198.18.1.1:8080"}},
	}, {
		name:        "endpoints removed",
		delta:       &FamilyDelta{Endpoints: map[ServicePortName][]*Endpoint{a: nil}},
		wantChanged: []ServicePortName{a},
		wantPorts:   map[ServicePortName]int32{a: 80}, wantEPs: map[ServicePortName][]string{},
	}, {
		name:        "empty list also removes",
		delta:       &FamilyDelta{Endpoints: map[ServicePortName][]*Endpoint{a: {}}},
		wantChanged: []ServicePortName{a},
		wantPorts:   map[ServicePortName]int32{a: 80}, wantEPs: map[ServicePortName][]string{},
	}, {
		name:      "endpoints of an unknown port removed: no change",
		delta:     &FamilyDelta{Endpoints: map[ServicePortName][]*Endpoint{b: nil}},
		wantPorts: map[ServicePortName]int32{a: 80}, wantEPs: map[ServicePortName][]string{a: {"198.18.1.1:8080"}},
	}, {
		name:        "endpoints added for a port without a service yet",
		delta:       &FamilyDelta{Endpoints: map[ServicePortName][]*Endpoint{b: {wantEP("198.18.2.1", nil)}}},
		wantChanged: []ServicePortName{b},
		wantPorts:   map[ServicePortName]int32{a: 80},
		wantEPs:     map[ServicePortName][]string{a: {"198.18.1.1:8080"}, b: {"198.18.2.1:8080"}},
	}, {
		name: "service and endpoints of one port change: reported once",
		delta: &FamilyDelta{
			Services:  map[ServicePortName]*ServicePort{a: port(a, 81)},
			Endpoints: map[ServicePortName][]*Endpoint{a: {wantEP("198.18.1.2", nil)}},
		},
		wantChanged: []ServicePortName{a},
		wantPorts:   map[ServicePortName]int32{a: 81}, wantEPs: map[ServicePortName][]string{a: {"198.18.1.2:8080"}},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := initial()
			before := s.Clone()
			changed := s.Apply(tc.delta)
			if diff := cmp.Diff(sets.New(tc.wantChanged...), changed, cmp.Comparer(func(x, y sets.Set[ServicePortName]) bool { return x.Equal(y) })); diff != "" {
				t.Errorf("changed (-want +got):\n%s", diff)
			}
			ports := map[ServicePortName]int32{}
			for n, sp := range s.Services {
				ports[n] = sp.Port
			}
			if diff := cmp.Diff(tc.wantPorts, ports); diff != "" {
				t.Errorf("services (-want +got):\n%s", diff)
			}
			eps := map[ServicePortName][]string{}
			for n, list := range s.Endpoints {
				for _, e := range list {
					eps[n] = append(eps[n], e.String())
				}
			}
			if diff := cmp.Diff(tc.wantEPs, eps); diff != "" {
				t.Errorf("endpoints (-want +got):\n%s", diff)
			}
			// The clone taken before is untouched.
			if len(before.Services) != 1 || before.Services[a].Port != 80 || len(before.Endpoints) != 1 || before.Endpoints[a][0].Ready != true {
				t.Errorf("Apply changed a clone: %+v", before)
			}
		})
	}
}

func TestStateSortedNames(t *testing.T) {
	s := NewState(IPv6)
	names := []ServicePortName{spn("b", "http", TCP), spn("a", "x", UDP), spn("a", "x", TCP), spn("a", "", TCP)}
	for _, n := range names {
		s.Services[n] = &ServicePort{Name: n}
	}
	var got []string
	for _, n := range s.SortedNames() {
		got = append(got, n.String())
	}
	want := []string{"ns/a/TCP", "ns/a:x/TCP", "ns/a:x/UDP", "ns/b:http/TCP"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("SortedNames (-want +got):\n%s", diff)
	}
	if s.Clone().Family != IPv6 {
		t.Errorf("Clone lost the family")
	}
}

func TestUpdateEmpty(t *testing.T) {
	tests := []struct {
		name string
		u    Update
		want bool
	}{
		{name: "nothing", u: Update{}, want: true},
		{name: "empty family deltas", u: Update{Families: map[v1.IPFamily]*FamilyDelta{IPv4: {}}}, want: true},
		{name: "counts alone are no change", u: Update{ServiceChanges: 3, EndpointChanges: 2}, want: true},
		{name: "a removed service", u: Update{Families: map[v1.IPFamily]*FamilyDelta{IPv4: {Services: map[ServicePortName]*ServicePort{httpName: nil}}}}},
		{name: "removed endpoints", u: Update{Families: map[v1.IPFamily]*FamilyDelta{IPv6: {Endpoints: map[ServicePortName][]*Endpoint{httpName: nil}}}}},
		{name: "node", u: Update{Node: &Node{Name: thisNode}}},
		{name: "node deleted", u: Update{NodeDeleted: true}},
	}
	for _, tc := range tests {
		if got := tc.u.Empty(); got != tc.want {
			t.Errorf("%s: Empty() = %v, want %v", tc.name, got, tc.want)
		}
	}
}
