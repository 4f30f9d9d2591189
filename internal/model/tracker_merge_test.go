package model

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
)

// TestTrackerSlicesMatchOneShotConversion: the tracker converts each
// EndpointSlice when its event arrives and merges a service's slices at
// Take. After any sequence of updates and deletions, in any order, what it
// has given the consumer must be what ConvertEndpointSlices makes of the
// slices that are left, all at once: duplicates across slices (a
// terminating copy, an unready one), two ports, both families, a slice
// losing a port.
func TestTrackerSlicesMatchOneShotConversion(t *testing.T) {
	fams := []v1.IPFamily{IPv4, IPv6}
	for seed := range 40 {
		t.Run(fmt.Sprintf("seed-%d", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(seed), 7))
			tr := NewTracker(TrackerOptions{Families: fams, Hostname: "node-a"})
			have := map[string]*discovery.EndpointSlice{} // by name
			got := map[v1.IPFamily]map[ServicePortName][]*Endpoint{IPv4: {}, IPv6: {}}
			for step := range 30 {
				name := fmt.Sprintf("web-%d", rng.IntN(4))
				if rng.IntN(4) == 0 {
					if s, ok := have[name]; ok {
						tr.EndpointSliceDeleted(s)
						delete(have, name)
					}
				} else {
					s := randomSlice(rng, name)
					tr.EndpointSliceUpdated(s)
					have[name] = s
				}
				if rng.IntN(3) > 0 && step < 29 {
					continue // several events per Take
				}
				u := tr.Take()
				for f, d := range u.Families {
					for n, eps := range d.Endpoints {
						if eps == nil {
							delete(got[f], n)
						} else {
							got[f][n] = eps
						}
					}
				}
				var list []*discovery.EndpointSlice
				for _, s := range have {
					list = append(list, s)
				}
				want, _ := ConvertEndpointSlices(list, "node-a", fams)
				for _, f := range fams {
					if want[f] == nil {
						want[f] = map[ServicePortName][]*Endpoint{}
					}
				}
				if diff := cmp.Diff(endpointValues(want), endpointValues(got), netipComparers); diff != "" {
					t.Fatalf("step %d: tracker (+) differs from a one-shot conversion (-):\n%s", step, diff)
				}
			}
		})
	}
}

// randomSlice is a slice of service demo/web with addresses from a small
// pool (so that slices share some), random conditions, and ports http and,
// sometimes, dns.
func randomSlice(rng *rand.Rand, name string) *discovery.EndpointSlice {
	at, pool := discovery.AddressTypeIPv4, []string{"198.18.1.10", "198.18.1.11", "198.18.2.10", "198.18.2.11"}
	if rng.IntN(3) == 0 {
		at, pool = discovery.AddressTypeIPv6, []string{"fd00:18::1:10", "fd00:18::2:10"}
	}
	return makeSlice("demo", "web", name, at, func(s *discovery.EndpointSlice) {
		if rng.IntN(2) == 0 {
			s.Ports = append(s.Ports, epPort("dns", 53, v1.ProtocolUDP))
		}
		for range rng.IntN(4) {
			var tweaks []func(*discovery.Endpoint)
			switch rng.IntN(4) {
			case 0:
				tweaks = append(tweaks, terminatingEP)
			case 1:
				tweaks = append(tweaks, unreadyEP)
			}
			if rng.IntN(2) == 0 {
				tweaks = append(tweaks, onNode("node-a"))
			}
			s.Endpoints = append(s.Endpoints, sliceEP(pool[rng.IntN(len(pool))], tweaks...))
		}
	})
}
