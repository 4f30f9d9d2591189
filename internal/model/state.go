package model

import (
	"maps"
	"slices"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
)

// State is a proxier's view of one IP family: every service port and its
// endpoints. A proxier owns its State and changes it only through Apply.
//
// Services holds the ports as they are to be programmed: contested
// frontends are resolved (see resolve.go), so a port may lack an external
// IP, a VIP or its node port that it asked for, or be missing altogether.
type State struct {
	Family    v1.IPFamily
	Services  map[ServicePortName]*ServicePort
	Endpoints map[ServicePortName][]*Endpoint

	// shadowed holds the port as converted for every port whose resolved
	// view differs from it (trimmed, or absent from Services); every other
	// port is in Services as converted.
	shadowed map[ServicePortName]*ServicePort
	// claims indexes every port's claims by frontend.
	claims map[frontend][]claim
	// lost holds, per port that lost claims, what it lost (sorted).
	lost      map[ServicePortName][]LostClaim
	contested map[ClaimKind]int
	newLost   []LostClaim
}

// NewState returns an empty State.
func NewState(f v1.IPFamily) *State {
	return &State{Family: f, Services: map[ServicePortName]*ServicePort{}, Endpoints: map[ServicePortName][]*Endpoint{},
		shadowed: map[ServicePortName]*ServicePort{}, claims: map[frontend][]claim{},
		lost: map[ServicePortName][]LostClaim{}, contested: map[ClaimKind]int{}}
}

// Apply folds a delta in and returns the service ports whose service or
// endpoints really changed (an update that changes nothing is not counted).
// A changed claim on an address also reports every other port whose
// resolved view it changes: the one that gets the address, the one that
// loses it.
func (s *State) Apply(d *FamilyDelta) sets.Set[ServicePortName] {
	changed := sets.New[ServicePortName]()
	s.newLost = nil
	if d == nil {
		return changed
	}
	s.applyServices(d.Services, changed)
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
	maps.Copy(c.Services, s.Services)
	maps.Copy(c.Endpoints, s.Endpoints)
	maps.Copy(c.shadowed, s.shadowed)
	// Claim lists and lost lists are replaced, never changed in place.
	maps.Copy(c.claims, s.claims)
	maps.Copy(c.lost, s.lost)
	maps.Copy(c.contested, s.contested)
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
