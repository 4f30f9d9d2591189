package model

// State, a family's services and endpoints as last applied, and the
// Update deltas applied to it. Addresses as in tracker_test.go.

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
)

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
