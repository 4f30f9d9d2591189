package model

// Addresses: 198.19.0.x cluster IPs, 198.19.1.x external IPs, 198.19.2.x
// load balancer VIPs; node ports 30080 and up.

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
)

// claimPort is a TCP port "http" of ns/name with a cluster IP and port,
// created at t (Unix seconds, 0 unknown), edited by tweak.
func claimPort(ns, name, cip string, port int32, created int64, tweak func(*ServicePort)) *ServicePort {
	n := ServicePortName{NamespacedName: types.NamespacedName{Namespace: ns, Name: name}, Port: "http", Protocol: TCP}
	sp := &ServicePort{Name: n, Family: IPv4, Type: "ClusterIP", ClusterIP: netip.MustParseAddr(cip), Port: port, Protocol: TCP, Created: created}
	if tweak != nil {
		tweak(sp)
	}
	return sp
}

func withNodePort(np int32) func(*ServicePort) {
	return func(sp *ServicePort) { sp.Type, sp.NodePort = "NodePort", np }
}

func withExternal(ips ...string) func(*ServicePort) {
	return func(sp *ServicePort) {
		for _, ip := range ips {
			sp.ExternalIPs = append(sp.ExternalIPs, netip.MustParseAddr(ip))
		}
	}
}

func withVIP(ips ...string) func(*ServicePort) {
	return func(sp *ServicePort) {
		for _, ip := range ips {
			sp.LoadBalancerIngress = append(sp.LoadBalancerIngress, LoadBalancerIngress{IP: netip.MustParseAddr(ip)})
		}
	}
}

func chain(fs ...func(*ServicePort)) func(*ServicePort) {
	return func(sp *ServicePort) {
		for _, f := range fs {
			f(sp)
		}
	}
}

// web is shop/web: created first, but last in alphabetical order of the
// intruders below ("aaa/...").
func web() *ServicePort {
	return claimPort("shop", "web", "198.19.0.10", 80, 100, chain(withNodePort(30080), withExternal("198.19.1.1")))
}

// resolution prints a State's resolution, one line per port, for comparison.
func resolution(s *State) string {
	var b strings.Builder
	for _, n := range s.SortedNames() {
		sp := s.Services[n]
		fmt.Fprintf(&b, "%s %s:%d np=%d ext=%v lb=%v\n", n, sp.ClusterIP, sp.Port, sp.NodePort, sp.ExternalIPs, sp.LoadBalancerVIPs())
	}
	for _, l := range s.Lost() {
		fmt.Fprintf(&b, "lost: %s\n", l)
	}
	return b.String()
}

func applyPorts(s *State, ports ...*ServicePort) sets.Set[ServicePortName] {
	d := &FamilyDelta{Services: map[ServicePortName]*ServicePort{}}
	for _, sp := range ports {
		d.Services[sp.Name] = sp
	}
	return s.Apply(d)
}

func deletePorts(s *State, names ...ServicePortName) sets.Set[ServicePortName] {
	d := &FamilyDelta{Services: map[ServicePortName]*ServicePort{}}
	for _, n := range names {
		d.Services[n] = nil
	}
	return s.Apply(d)
}

func permutations(n int) [][]int {
	if n == 0 {
		return [][]int{{}}
	}
	var out [][]int
	for _, p := range permutations(n - 1) {
		for i := 0; i <= len(p); i++ {
			q := slices.Insert(slices.Clone(p), i, n-1)
			out = append(out, q)
		}
	}
	return out
}

// TestContestedResolution feeds each set of ports in every order, one port
// an Apply, and all at once into a fresh State (a restart): the resolution
// must be the same every time, and the one expected.
func TestContestedResolution(t *testing.T) {
	shopWeb := web().Name
	tests := []struct {
		name  string
		ports []*ServicePort
		check func(t *testing.T, s *State)
	}{{
		name: "intruder claims the cluster IP and port",
		ports: []*ServicePort{web(),
			claimPort("aaa", "intruder", "198.19.0.10", 80, 200, nil)},
		check: func(t *testing.T, s *State) {
			if len(s.Services) != 1 || s.Services[shopWeb] == nil {
				t.Errorf("only shop/web should be programmed:\n%s", resolution(s))
			}
		},
	}, {
		name: "older intruder claims the cluster IP and port: the older one wins among equals",
		ports: []*ServicePort{web(),
			claimPort("aaa", "intruder", "198.19.0.10", 80, 50, nil)},
		check: func(t *testing.T, s *State) {
			if len(s.Services) != 1 || s.Services[shopWeb] != nil {
				t.Errorf("only aaa/intruder should be programmed:\n%s", resolution(s))
			}
		},
	}, {
		name: "intruder claims the node port",
		ports: []*ServicePort{web(),
			claimPort("aaa", "intruder", "198.19.0.11", 80, 200, withNodePort(30080))},
		check: func(t *testing.T, s *State) {
			if sp := s.Services[shopWeb]; sp == nil || sp.NodePort != 30080 {
				t.Errorf("shop/web should keep its node port:\n%s", resolution(s))
			}
			if len(s.Services) != 2 || len(s.Lost()) != 1 || s.Lost()[0].LoserKind != ClaimNodePort {
				t.Errorf("the intruder should be programmed without its node port:\n%s", resolution(s))
			}
		},
	}, {
		name: "intruder claims the cluster IP as an external IP, even created earlier",
		ports: []*ServicePort{web(),
			claimPort("aaa", "intruder", "198.19.0.11", 80, 1, withExternal("198.19.0.10", "198.19.1.9"))},
		check: func(t *testing.T, s *State) {
			sp := s.Services[ServicePortName{NamespacedName: types.NamespacedName{Namespace: "aaa", Name: "intruder"}, Port: "http", Protocol: TCP}]
			if sp == nil || !slices.Equal(sp.ExternalIPs, []netip.Addr{netip.MustParseAddr("198.19.1.9")}) {
				t.Errorf("the intruder should keep only its own external IP:\n%s", resolution(s))
			}
		},
	}, {
		name: "two external IP claims: the older one wins",
		ports: []*ServicePort{web(),
			claimPort("aaa", "older", "198.19.0.11", 80, 50, withExternal("198.19.1.1"))},
		check: func(t *testing.T, s *State) {
			if sp := s.Services[shopWeb]; sp == nil || len(sp.ExternalIPs) != 0 {
				t.Errorf("shop/web should lose its external IP to the older service:\n%s", resolution(s))
			}
		},
	}, {
		name: "an external IP and a VIP of the same age: namespace/name decides",
		ports: []*ServicePort{web(),
			claimPort("shop", "lb", "198.19.0.11", 80, 100, withVIP("198.19.1.1", "198.19.2.1"))},
		check: func(t *testing.T, s *State) {
			sp := s.Services[ServicePortName{NamespacedName: types.NamespacedName{Namespace: "shop", Name: "lb"}, Port: "http", Protocol: TCP}]
			if sp == nil || !slices.Equal(sp.LoadBalancerVIPs(), []netip.Addr{netip.MustParseAddr("198.19.1.1"), netip.MustParseAddr("198.19.2.1")}) {
				t.Errorf("shop/lb (before shop/web) should keep both VIPs:\n%s", resolution(s))
			}
			if sp := s.Services[shopWeb]; sp == nil || len(sp.ExternalIPs) != 0 {
				t.Errorf("shop/web should lose its external IP:\n%s", resolution(s))
			}
		},
	}, {
		name: "a port that lost its cluster IP claims nothing else",
		ports: []*ServicePort{web(),
			claimPort("aaa", "intruder", "198.19.0.10", 80, 200, withNodePort(30090)),
			claimPort("zzz", "late", "198.19.0.12", 80, 300, withNodePort(30090)),
			claimPort("shop", "web", "198.19.0.10", 80, 100, nil)},
		check: func(t *testing.T, s *State) {
			late := s.Services[ServicePortName{NamespacedName: types.NamespacedName{Namespace: "zzz", Name: "late"}, Port: "http", Protocol: TCP}]
			if late == nil || late.NodePort != 30090 {
				t.Errorf("zzz/late should have node port 30090:\n%s", resolution(s))
			}
		},
	}, {
		name: "unknown creation time counts as newest",
		ports: []*ServicePort{web(),
			claimPort("aaa", "intruder", "198.19.0.11", 80, 0, withNodePort(30080))},
		check: func(t *testing.T, s *State) {
			if sp := s.Services[shopWeb]; sp == nil || sp.NodePort != 30080 {
				t.Errorf("shop/web should keep its node port:\n%s", resolution(s))
			}
		},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// Later entries with the same name replace earlier ones; the
			// set as a whole is what a restart sees.
			final := map[ServicePortName]*ServicePort{}
			for _, sp := range tc.ports {
				final[sp.Name] = sp
			}
			fresh := NewState(IPv4)
			d := &FamilyDelta{Services: final}
			fresh.Apply(d)
			want := resolution(fresh)
			tc.check(t, fresh)
			for _, perm := range permutations(len(tc.ports)) {
				s := NewState(IPv4)
				for _, i := range perm {
					applyPorts(s, tc.ports[i])
				}
				if got := resolution(s); got != want && sameSet(tc.ports, perm) {
					t.Errorf("order %v:\n%s\nrestart:\n%s", perm, got, want)
				}
			}
		})
	}
}

// sameSet is true when applying ports in order perm leaves the final set
// (the last version of each name).
func sameSet(ports []*ServicePort, perm []int) bool {
	last := map[ServicePortName]*ServicePort{}
	for _, i := range perm {
		last[ports[i].Name] = ports[i]
	}
	for _, sp := range ports {
		if !last[sp.Name].Equal(ports[lastIndex(ports, sp.Name)]) {
			return false
		}
	}
	return true
}

func lastIndex(ports []*ServicePort, n ServicePortName) int {
	i := -1
	for j, sp := range ports {
		if sp.Name == n {
			i = j
		}
	}
	return i
}

// TestContestedWinnerLeaves: when the holder of an address leaves or stops
// claiming it, the next claimant gets it back, and Apply reports that
// claimant changed so that the backends program it.
func TestContestedWinnerLeaves(t *testing.T) {
	intruder := claimPort("aaa", "intruder", "198.19.0.10", 80, 200, withNodePort(30081))
	npIntruder := claimPort("aaa", "np", "198.19.0.11", 80, 200, withNodePort(30080))
	extIntruder := claimPort("aaa", "ext", "198.19.0.12", 80, 200, withExternal("198.19.0.10"))
	s := NewState(IPv4)
	applyPorts(s, web(), intruder, npIntruder, extIntruder)
	if got := len(s.Lost()); got != 3 {
		t.Fatalf("want 3 lost claims, got:\n%s", resolution(s))
	}
	if c := s.Contested(); c[ClaimClusterIP] != 1 || c[ClaimNodePort] != 1 || c[ClaimExternalIP] != 1 {
		t.Errorf("Contested() = %v", c)
	}
	if _, ok := s.Services[intruder.Name]; ok {
		t.Fatalf("intruder programmed without its cluster IP:\n%s", resolution(s))
	}

	changed := deletePorts(s, web().Name)
	// aaa/ext still lacks the address (the intruder holds the cluster IP
	// now), so it need not be reported.
	for _, n := range []ServicePortName{web().Name, intruder.Name, npIntruder.Name} {
		if !changed.Has(n) {
			t.Errorf("%s not reported changed when shop/web left (changed: %v)", n, changed.UnsortedList())
		}
	}
	if sp := s.Services[intruder.Name]; sp == nil || sp.NodePort != 30081 {
		t.Errorf("intruder should now be programmed:\n%s", resolution(s))
	}
	if sp := s.Services[npIntruder.Name]; sp == nil || sp.NodePort != 30080 {
		t.Errorf("aaa/np should now have node port 30080:\n%s", resolution(s))
	}
	// The cluster IP is the intruder's now: a claim as external IP still loses.
	if sp := s.Services[extIntruder.Name]; sp == nil || len(sp.ExternalIPs) != 0 {
		t.Errorf("aaa/ext should still lack the external IP:\n%s", resolution(s))
	}
	if got := s.Lost(); len(got) != 1 || got[0].Winner != intruder.Name {
		t.Errorf("lost claims: %v", got)
	}

	// The intruder leaves too: aaa/ext gets the address.
	changed = deletePorts(s, intruder.Name)
	if !changed.Has(extIntruder.Name) {
		t.Errorf("aaa/ext not reported changed")
	}
	if sp := s.Services[extIntruder.Name]; sp == nil || len(sp.ExternalIPs) != 1 {
		t.Errorf("aaa/ext should have its external IP:\n%s", resolution(s))
	}
	if len(s.Lost()) != 0 || s.Contested()[ClaimExternalIP] != 0 {
		t.Errorf("nothing should be contested: %v %v", s.Lost(), s.Contested())
	}

	// An unrelated change reports nothing but itself.
	other := claimPort("other", "svc", "198.19.0.50", 80, 10, nil)
	if changed := applyPorts(s, other); changed.Len() != 1 || !changed.Has(other.Name) {
		t.Errorf("unrelated change reported %v", changed.UnsortedList())
	}
}

// TestContestedNewlyLost: a lost claim is reported once, by the Apply that
// made it lost, not by later ones.
func TestContestedNewlyLost(t *testing.T) {
	s := NewState(IPv4)
	applyPorts(s, web())
	applyPorts(s, claimPort("aaa", "intruder", "198.19.0.10", 80, 200, nil))
	if got := s.NewlyLost(); len(got) != 1 || got[0].Loser.Name != "intruder" || got[0].Winner.Name != "web" || got[0].Address != "198.19.0.10:80/TCP" {
		t.Fatalf("NewlyLost = %v", got)
	}
	applyPorts(s, claimPort("other", "svc", "198.19.0.50", 80, 10, nil))
	if got := s.NewlyLost(); len(got) != 0 {
		t.Errorf("NewlyLost after an unrelated change = %v", got)
	}
}

// TestContestedRandomized applies random changes to a small pool of
// ports that often collide, and after each one checks against a fresh
// State built from the same ports (a restart): the same resolution, and
// every port whose resolved view changed reported changed.
func TestContestedRandomized(t *testing.T) {
	cips := []string{"198.19.0.10", "198.19.0.11", "198.19.0.12"}
	extra := []string{"198.19.0.10", "198.19.0.11", "198.19.1.1", "198.19.2.1"}
	names := []string{"a", "b", "c", "d", "e"}
	for seed := uint64(1); seed <= 40; seed++ {
		rng := rand.New(rand.NewPCG(seed, 16))
		s := NewState(IPv4)
		cur := map[ServicePortName]*ServicePort{}
		for step := 0; step < 60; step++ {
			d := &FamilyDelta{Services: map[ServicePortName]*ServicePort{}}
			for range 1 + rng.IntN(3) {
				name := names[rng.IntN(len(names))]
				sp := claimPort("ns", name, cips[rng.IntN(len(cips))], 80+int32(rng.IntN(2)), int64(rng.IntN(3))*100, nil)
				if rng.IntN(4) == 0 {
					d.Services[sp.Name] = nil
					continue
				}
				if rng.IntN(2) == 0 {
					sp.NodePort = 30080 + int32(rng.IntN(2))
				}
				for _, ip := range extra {
					switch rng.IntN(4) {
					case 0:
						sp.ExternalIPs = append(sp.ExternalIPs, netip.MustParseAddr(ip))
					case 1:
						sp.LoadBalancerIngress = append(sp.LoadBalancerIngress, LoadBalancerIngress{IP: netip.MustParseAddr(ip), Proxy: rng.IntN(3) == 0})
					}
				}
				d.Services[sp.Name] = sp
			}
			before := copyPorts(s.Services)
			changed := s.Apply(d)
			for n, sp := range d.Services {
				if sp == nil {
					delete(cur, n)
				} else {
					cur[n] = sp
				}
			}
			fresh := NewState(IPv4)
			fresh.Apply(&FamilyDelta{Services: copyPorts(cur)})
			if got, want := resolution(s), resolution(fresh); got != want {
				t.Fatalf("seed %d step %d: incremental:\n%s\nrestart:\n%s", seed, step, got, want)
			}
			for n := range union(before, s.Services) {
				if !before[n].Equal(s.Services[n]) && !changed.Has(n) {
					t.Fatalf("seed %d step %d: %s changed from %+v to %+v but was not reported", seed, step, n, before[n], s.Services[n])
				}
			}
			c := s.Contested()
			total := 0
			for _, k := range ClaimKinds {
				total += c[k]
			}
			if total != len(s.Lost()) {
				t.Fatalf("seed %d step %d: Contested %v, lost %v", seed, step, c, s.Lost())
			}
		}
	}
}

func copyPorts(m map[ServicePortName]*ServicePort) map[ServicePortName]*ServicePort {
	out := make(map[ServicePortName]*ServicePort, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func union(a, b map[ServicePortName]*ServicePort) sets.Set[ServicePortName] {
	out := sets.New[ServicePortName]()
	for k := range a {
		out.Insert(k)
	}
	for k := range b {
		out.Insert(k)
	}
	return out
}

// TestConvertCreated: the creation timestamp decides contests, so
// ConvertService must carry it (0 when the object has none).
func TestConvertCreated(t *testing.T) {
	for _, tc := range []struct {
		ts   metav1.Time
		want int64
	}{{metav1.Unix(1767225600, 0), 1767225600}, {metav1.Time{}, 0}} {
		svc := makeService(testNS, "web", func(s *v1.Service) { s.CreationTimestamp = tc.ts })
		ports, errs := ConvertService(svc, []v1.IPFamily{IPv4})
		if len(errs) > 0 {
			t.Fatal(errs)
		}
		for _, sp := range ports[IPv4] {
			if sp.Created != tc.want {
				t.Errorf("creationTimestamp %v: Created = %d, want %d", tc.ts, sp.Created, tc.want)
			}
		}
	}
}
