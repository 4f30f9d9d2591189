package nftables

// A randomized test of partial syncs: seeded random sequences of service
// and endpoint additions, changes and deletions (plus the odd full sync and
// restart) on top of the example. After every step the cumulative
// transactions must load (the tracer refuses what the kernel refuses) and
// route every interesting packet exactly as a fresh full render of the same
// state; at the end, once stale objects are gone, both hold the same
// chains, rules, sets and elements. Random services use 198.19.1.0/24
// (fd00:19::1:0/112) cluster IPs, 198.19.201.0/24 (fd00:19::c9:0/112)
// external and LB IPs, and endpoints 198.18.129.1xx/198.18.130.1xx
// (fd00:18:1:a::1xx/fd00:18:1:b::1xx).

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/kproxy/kproxy/internal/example"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy/flowtest"
	"github.com/kproxy/kproxy/internal/testutil/fixtures"
	nfttrace "github.com/kproxy/kproxy/internal/trace/nftables"
)

type randomizer struct {
	r  *rand.Rand
	v6 bool
}

func (g *randomizer) addr(v4, v6 string, i int) netip.Addr {
	if g.v6 {
		return netip.MustParseAddr(fmt.Sprintf(v6, i))
	}
	return netip.MustParseAddr(fmt.Sprintf(v4, i))
}

// service returns a random spec for demo/rnd-i (always the same cluster IP).
func (g *randomizer) service(i int) *model.ServicePort {
	r := g.r
	protos := []v1.Protocol{model.TCP, model.TCP, model.TCP, model.UDP, model.SCTP}
	sp := &model.ServicePort{
		Family:    model.IPv4,
		Type:      v1.ServiceTypeClusterIP,
		ClusterIP: g.addr("198.19.1.%d", "fd00:19::1:%x", i+1),
		Port:      []int32{80, 443}[r.IntN(2)],
		Protocol:  protos[r.IntN(len(protos))],
	}
	if g.v6 {
		sp.Family = model.IPv6
	}
	port := "http"
	if r.IntN(4) == 0 {
		port = "" // unnamed
	}
	sp.Name = fixtures.SPName(fmt.Sprintf("rnd-%d", i), port, sp.Protocol)
	// External addresses come from small pools so that services
	// sometimes claim the same ones.
	extIP := func() netip.Addr { return g.addr("198.19.201.%d", "fd00:19::c9:%x", 1+r.IntN(3)) }
	switch r.IntN(4) {
	case 1:
		sp.Type, sp.NodePort = v1.ServiceTypeNodePort, int32(30100+r.IntN(4))
	case 2:
		sp.Type, sp.NodePort = v1.ServiceTypeLoadBalancer, int32(30100+r.IntN(4))
		for range 1 + r.IntN(2) {
			sp.LoadBalancerIngress = append(sp.LoadBalancerIngress, model.LoadBalancerIngress{IP: extIP(), Proxy: r.IntN(4) == 0})
		}
		if r.IntN(2) == 0 {
			ranges := "203.0.113.0/24"
			if g.v6 {
				ranges = "2001:db8::/32"
			}
			sp.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix(ranges)}
		}
	}
	if r.IntN(4) == 0 {
		sp.ExternalIPs = []netip.Addr{extIP()}
	}
	if sp.ExternallyAccessible() && r.IntN(3) == 0 {
		sp.ExternalPolicyLocal = true
		sp.HealthCheckNodePort = int32(32000 + i)
	}
	sp.InternalPolicyLocal = r.IntN(5) == 0
	if r.IntN(4) == 0 {
		sp.StickyMaxAgeSeconds = []int32{600, 10800}[r.IntN(2)]
	}
	return sp
}

// endpoints returns 0 to 3 random endpoints for a service port.
func (g *randomizer) endpoints(sp *model.ServicePort) []*model.Endpoint {
	r := g.r
	var eps []*model.Endpoint
	used := sets.New[netip.Addr]()
	for range r.IntN(4) {
		local := r.IntN(2) == 0
		var ip netip.Addr
		if local {
			ip = g.addr("198.18.129.%d", "fd00:18:1:a::%x", 100+r.IntN(6))
		} else {
			ip = g.addr("198.18.130.%d", "fd00:18:1:b::%x", 100+r.IntN(6))
		}
		if used.Has(ip) {
			continue
		}
		used.Insert(ip)
		e := fixtures.Endpoint(ip.String(), []int32{8080, 8081}[r.IntN(2)], local, nil)
		switch r.IntN(6) {
		case 0: // terminating, still serving
			e.Ready, e.Serving, e.Terminating = false, true, true
		case 1: // not ready
			e.Ready, e.Serving = false, false
		}
		if r.IntN(5) == 0 {
			e.ZoneHints = sets.New(e.Zone)
		}
		eps = append(eps, e)
	}
	slices.SortFunc(eps, func(a, b *model.Endpoint) int { return a.AddrPort().Compare(b.AddrPort()) })
	return eps
}

// step changes the state at random and returns what it did.
func (g *randomizer) step(s *syncer) (string, *model.FamilyDelta) {
	r := g.r
	d := &model.FamilyDelta{Services: map[model.ServicePortName]*model.ServicePort{}, Endpoints: map[model.ServicePortName][]*model.Endpoint{}}
	names := s.state.SortedNames()
	// A random service of the state (example ones included).
	pick := func() (model.ServicePortName, bool) {
		if len(names) == 0 {
			return model.ServicePortName{}, false
		}
		return names[r.IntN(len(names))], true
	}
	switch op := r.IntN(12); {
	case op >= 10:
		// Change one field of a service in place: same name, same
		// endpoints, so that its chains are rewritten, not replaced.
		n, ok := pick()
		if !ok {
			return "nothing", d
		}
		sp := *s.state.Services[n]
		var what string
		switch r.IntN(7) {
		case 0:
			what = "affinity"
			if sp.StickyMaxAgeSeconds == 0 {
				sp.StickyMaxAgeSeconds = 600
			} else if r.IntN(2) == 0 {
				sp.StickyMaxAgeSeconds = 0
			} else {
				sp.StickyMaxAgeSeconds += 60 // a new timeout means new sets
			}
		case 1:
			what = "internal traffic policy"
			sp.InternalPolicyLocal = !sp.InternalPolicyLocal
		case 2:
			what = "external traffic policy"
			sp.ExternalPolicyLocal = !sp.ExternalPolicyLocal
		case 3:
			what = "port"
			sp.Port++
		case 4:
			what = "node port"
			if sp.NodePort == 0 {
				sp.Type, sp.NodePort = v1.ServiceTypeNodePort, int32(30100+r.IntN(4))
			} else {
				sp.NodePort = 0
			}
		case 5:
			what = "external IPs"
			if len(sp.ExternalIPs) > 0 {
				sp.ExternalIPs = nil
			} else {
				sp.ExternalIPs = []netip.Addr{g.addr("198.19.201.%d", "fd00:19::c9:%x", 1+r.IntN(3))}
			}
		case 6:
			what = "source ranges"
			if len(sp.LoadBalancerSourceRanges) > 0 {
				sp.LoadBalancerSourceRanges = nil
			} else {
				sp.LoadBalancerIngress = []model.LoadBalancerIngress{{IP: g.addr("198.19.201.%d", "fd00:19::c9:%x", 1+r.IntN(3))}}
				sp.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")}
				if g.v6 {
					sp.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("2001:db8::/32")}
				}
			}
		}
		d.Services[n] = &sp
		return fmt.Sprintf("change %s of %s", what, n), d
	case op < 3:
		i := r.IntN(8)
		// The same service under another port name or protocol is
		// another service port: remove what demo/rnd-i had before.
		for _, n := range names {
			if n.Name == fmt.Sprintf("rnd-%d", i) {
				d.Services[n], d.Endpoints[n] = nil, nil
			}
		}
		sp := g.service(i)
		d.Services[sp.Name] = sp
		d.Endpoints[sp.Name] = g.endpoints(sp)
		return "upsert " + sp.Name.String(), d
	case op < 7:
		n, ok := pick()
		if !ok {
			return "nothing", d
		}
		d.Endpoints[n] = g.endpoints(s.state.Services[n])
		return fmt.Sprintf("endpoints of %s: %d", n, len(d.Endpoints[n])), d
	case op < 8:
		n, ok := pick()
		if !ok {
			return "nothing", d
		}
		d.Services[n], d.Endpoints[n] = nil, nil
		return "delete " + n.String(), d
	case op < 9:
		n, ok := pick()
		if !ok {
			return "nothing", d
		}
		d.Endpoints[n] = nil
		return "no endpoints for " + n.String(), d
	default:
		return "nothing", d
	}
}

func TestPartialSyncRandomized(t *testing.T) {
	seeds, steps := 24, 40
	if testing.Short() {
		seeds, steps = 4, 20
	}
	c := flowtest.Example(t, example.NodeA)
	for seed := range seeds {
		for _, f := range []v1.IPFamily{model.IPv4, model.IPv6} {
			if f == model.IPv6 && seed%3 != 0 {
				continue
			}
			t.Run(fmt.Sprintf("%s/seed-%d", f, seed), func(t *testing.T) {
				randomizedSyncs(t, c, f, seed, steps)
			})
		}
	}
}

// TestPartialSyncRandomizedRegressions replays sequences that once broke:
// a clean-up deleted a stale chain or set still used by shadowed rules of
// its service (IPv6 seeds 11, 14, 20 and IPv4 seed 24 at 40 steps; IPv6
// seed 3 at 60); a shared chain of plain ports, flushed by a clean-up,
// then marked stale afresh by a restart's full sync, came back without
// its rules (IPv6 seed 347 at 100 steps: the service was rejected); a
// leftover chain a full sync left with its rules came back under a
// service's new ones, still using an affinity set the clean-up then
// deleted (IPv6 seed 372 at 100 steps: the clean-up was refused). IPv6
// seeds 539 and 588 and IPv4 seed 570 at 100 steps end with a full sync
// that changes the shard count, and both families of seed 897 with one
// that finds a port plain once the services in conflict with it are
// gone: the final check must allow for objects that sync left unused.
func TestPartialSyncRandomizedRegressions(t *testing.T) {
	c := flowtest.Example(t, example.NodeA)
	for _, tc := range []struct {
		f     v1.IPFamily
		seed  int
		steps int
	}{
		{model.IPv6, 11, 40}, {model.IPv6, 14, 40}, {model.IPv6, 20, 40}, {model.IPv6, 22, 40},
		{model.IPv6, 23, 40}, {model.IPv6, 35, 40}, {model.IPv6, 37, 40}, {model.IPv4, 24, 40}, {model.IPv6, 3, 60},
		{model.IPv6, 347, 100}, {model.IPv6, 372, 100},
		{model.IPv6, 539, 100}, {model.IPv4, 570, 100}, {model.IPv6, 588, 100},
		{model.IPv4, 897, 100}, {model.IPv6, 897, 100},
	} {
		t.Run(fmt.Sprintf("%s/seed-%d/steps-%d", tc.f, tc.seed, tc.steps), func(t *testing.T) {
			randomizedSyncs(t, c, tc.f, tc.seed, tc.steps)
		})
	}
}

// randomizedSyncs runs seeded random changes through partial syncs (with
// occasional full syncs and restarts), checking every step against a fresh
// full render, and at the end that the tables are identical.
func randomizedSyncs(t *testing.T, c *flowtest.Snapshot, f v1.IPFamily, seed, steps int) {
	g := &randomizer{r: rand.New(rand.NewPCG(uint64(seed), 0x6b70726f7879)), v6: f == model.IPv6}
	s := newSyncer(t, c, f)
	s.full()
	var log []string
	for i := range steps {
		s.now = s.now.Add(time.Duration(g.r.IntN(1500)) * time.Millisecond)
		var what string
		switch k := g.r.IntN(30); {
		case k == 0:
			what = "restart: full sync with a fresh Applied"
			s.applied = NewApplied()
			s.full()
		case k < 3:
			// A full sync may change the shard count: another shard size
			// makes it grow or shrink (tables added, tables deleted).
			s.cfg.ServicesPerShard = 1 + g.r.IntN(8)
			what = fmt.Sprintf("full sync, %d services per shard", s.cfg.ServicesPerShard)
			s.full()
		default:
			var d *model.FamilyDelta
			what, d = g.step(s)
			t.Logf("step %d at %s: %s", i, s.now.Sub(epoch), what)
			s.apply(d)
		}
		log = append(log, what)
		s.checkLikeFull(fmt.Sprintf("step %d (%s)", i, what))
		if t.Failed() {
			t.Fatalf("steps so far:\n%s", strings.Join(log, "\n"))
		}
	}
	// Remove the services in conflict, let the stale delay pass, and both
	// rulesets must hold exactly the same objects.
	if conflicts := s.conflicted(); conflicts.Len() > 0 {
		d := &model.FamilyDelta{Services: map[model.ServicePortName]*model.ServicePort{}}
		for _, n := range s.state.SortedNames() {
			if slices.ContainsFunc(s.claims(n), conflicts.Has) {
				d.Services[n] = nil
			}
		}
		s.apply(d)
		log = append(log, fmt.Sprintf("deleted %d conflicting services", len(d.Services)))
	}
	if n := s.conflicted().Len(); n > 0 {
		t.Fatalf("%d conflicts left", n)
	}
	// Partial syncs never delete (shadowed rules and stale
	// objects wait for a full sync); a full sync once the
	// stale delay has passed cleans everything up.
	s.now = s.now.Add(staleDelay)
	s.full()
	if len(s.applied.stale.objs) > 0 {
		// That full sync itself left objects unused (ports moved to
		// other shards when a step changed the shard size, a port that
		// kept a chain while its cluster IP was in conflict is plain
		// now): they go one stale delay later.
		s.now = s.now.Add(staleDelay)
		s.full()
	}
	if p := s.partial(); p.Tx.Len() != 0 {
		t.Errorf("after cleanup: want no operations, got:\n%s", p.Tx)
	}
	// The same shard count as the synced tables (a fresh render chooses
	// without hysteresis).
	freshApplied := NewApplied()
	freshApplied.shards = s.applied.shards
	fresh := parse(t, Render(s.cfg, s.input(true, nil), freshApplied).Tx.String())
	if diff := cmp.Diff(contents(fresh), contents(s.rs)); diff != "" {
		t.Errorf("after cleanup the table differs from a full render (-full +partial):\n%s\nsteps:\n%s", diff, strings.Join(log, "\n"))
	}
}

var elemCommentRE = regexp.MustCompile(` comment "[^"]*"`)

// tableContents is a ruleset's objects in a form that ignores the order
// of creation: rules stay in order within their chain.
type tableContents struct {
	Objects []string            // chains, sets and maps, sorted
	Elems   []string            // elements without comments, sorted
	Rules   map[string][]string // "table chain" -> rules, in order
}

var (
	epElemRE = regexp.MustCompile(`^add element (ip6? \S+ \S+) \{ (\d+) : (.*) \}$`)
	epRuleRE = regexp.MustCompile(`numgen random mod (\d+) offset (\d+) map @(\S+)`)
)

// contents reads a ruleset for comparison. Endpoint map keys are
// numbered differently by partial syncs (fresh keys) and full syncs
// (compact): a rule's "numgen random mod N offset O map @M" becomes the
// endpoints its keys map to, and the elements lose their keys (keys left
// behind still show as elements too many).
func contents(rs *nfttrace.Ruleset) tableContents {
	c := tableContents{Rules: map[string][]string{}}
	lines := strings.Split(rs.String(), "\n")
	eps := map[string]string{} // "FAMILY TABLE MAP KEY" -> "ADDR . PORT"
	for _, l := range lines {
		if m := epElemRE.FindStringSubmatch(l); m != nil && strings.Contains(m[1], " "+prefixEndpointMap) {
			eps[m[1]+" "+m[2]] = m[3]
		}
	}
	for _, l := range lines {
		f := strings.Fields(l)
		if len(f) < 5 {
			continue
		}
		switch f[1] {
		case "rule":
			body := strings.Join(f[5:], " ")
			body = epRuleRE.ReplaceAllStringFunc(body, func(m string) string {
				g := epRuleRE.FindStringSubmatch(m)
				n, _ := strconv.Atoi(g[1])
				off, _ := strconv.Atoi(g[2])
				var to []string
				for i := range n {
					to = append(to, eps[f[2]+" "+f[3]+" "+g[3]+" "+strconv.Itoa(off+i)])
				}
				return "map @" + g[3] + " [" + strings.Join(to, ", ") + "]"
			})
			c.Rules[f[3]+" "+f[4]] = append(c.Rules[f[3]+" "+f[4]], body)
		case "element":
			if m := epElemRE.FindStringSubmatch(l); m != nil && strings.Contains(m[1], " "+prefixEndpointMap) {
				c.Elems = append(c.Elems, "add element "+m[1]+" { "+m[3]+" }")
				continue
			}
			c.Elems = append(c.Elems, elemCommentRE.ReplaceAllString(l, ""))
		default:
			c.Objects = append(c.Objects, l)
		}
	}
	slices.Sort(c.Objects)
	slices.Sort(c.Elems)
	return c
}
