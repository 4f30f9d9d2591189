package model

import (
	"slices"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
)

// State is a proxier's view of one IP family: every service port and its
// endpoints. A proxier owns its State and changes it only through Apply.
type State struct {
	Family    v1.IPFamily
	Services  map[ServicePortName]*ServicePort
	Endpoints map[ServicePortName][]*Endpoint
}

// NewState returns an empty State.
func NewState(f v1.IPFamily) *State {
	return &State{Family: f, Services: map[ServicePortName]*ServicePort{}, Endpoints: map[ServicePortName][]*Endpoint{}}
}

// Apply folds a delta in and returns the service ports whose service or
// endpoints really changed (an update that changes nothing is not counted).
func (s *State) Apply(d *FamilyDelta) sets.Set[ServicePortName] {
	changed := sets.New[ServicePortName]()
	if d == nil {
		return changed
	}
	for name, sp := range d.Services {
		old, had := s.Services[name]
		if sp == nil {
			if had {
				delete(s.Services, name)
				changed.Insert(name)
			}
			continue
		}
		if !had || !old.Equal(sp) {
			changed.Insert(name)
		}
		s.Services[name] = sp
	}
	for name, eps := range d.Endpoints {
		old, had := s.Endpoints[name]
		if len(eps) == 0 {
			if had {
				delete(s.Endpoints, name)
				changed.Insert(name)
			}
			continue
		}
		if !had || !endpointsEqual(old, eps) {
			changed.Insert(name)
		}
		s.Endpoints[name] = eps
	}
	return changed
}

// Clone returns a copy whose maps can be changed independently (the
// ServicePort and Endpoint values are shared and never mutated).
func (s *State) Clone() *State {
	c := NewState(s.Family)
	for k, v := range s.Services {
		c.Services[k] = v
	}
	for k, v := range s.Endpoints {
		c.Endpoints[k] = v
	}
	return c
}

// SortedNames returns the service port names in a stable order.
func (s *State) SortedNames() []ServicePortName {
	names := make([]ServicePortName, 0, len(s.Services))
	for n := range s.Services {
		names = append(names, n)
	}
	slices.SortFunc(names, ServicePortName.Compare)
	return names
}
