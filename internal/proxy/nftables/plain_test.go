package nftables

// Plain ClusterIP service ports (see plainService): no chain of their own,
// elements only. Pure tests (Render and Commit, the tracer as kernel); the
// address plan is at the top of fixtures_test.go. web-clusterip
// (198.19.0.10:80, endpoints 198.18.129.10 and 198.18.130.10 port 8080)
// shares its shard and the chain cluster/tcp/2 with dns-udp's TCP port
// (198.19.0.18:53).

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/example"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy/flowtest"
	"github.com/kproxy/kproxy/internal/testutil/fixtures"
)

// settleAll runs partial syncs a stale delay apart until no clean-up is
// left, then checks that the tables hold exactly what a fresh full
// render writes, and that one more sync has nothing to do.
func (s *syncer) settleAll(step string) {
	s.t.Helper()
	for range 4 {
		s.now = s.now.Add(staleDelay)
		p := s.partial()
		if p.Tx.Len() != 0 {
			s.t.Errorf("%s: a sync with nothing changed sends:\n%s", step, p.Tx)
		}
		if p.Cleanup == nil {
			break
		}
	}
	if p := s.partial(); p.Tx.Len() != 0 || p.Cleanup != nil {
		s.t.Errorf("%s: nothing left to clean up, yet:\n%s%v", step, p.Tx, p.Cleanup)
	}
	fresh := parse(s.t, Render(s.cfg, s.input(true, nil), &Applied{shards: s.applied.shards}).Tx.String())
	if diff := cmp.Diff(contents(fresh), contents(s.rs)); diff != "" {
		s.t.Errorf("%s: after the clean-ups the tables differ from a fresh full render (-fresh +synced):\n%s", step, diff)
	}
}

func webEndpoint(t *testing.T, s *syncer, ip string) *model.Endpoint {
	t.Helper()
	e := *s.state.Endpoints[fixtures.SPName("web-clusterip", "http", model.TCP)][0]
	e.IP = netip.MustParseAddr(ip)
	return &e
}

func TestPlainEndpointChange(t *testing.T) {
	c := flowtest.Example(t, example.NodeA)
	s := newSyncer(t, c, model.IPv4)
	s.full()
	web := fixtures.SPName("web-clusterip", "http", model.TCP)
	shard := s.shardOf(web)
	if dns := fixtures.SPName("dns-udp", "dns-tcp", model.TCP); s.shardOf(dns) != shard {
		t.Fatalf("the example changed: %s is not in %s's shard", dns, web)
	}
	for _, op := range opTexts(s.full()) {
		if strings.Contains(op, "web-clusterip") && (strings.HasPrefix(op, "add chain") || strings.HasPrefix(op, "add rule")) {
			t.Errorf("a plain service port has a chain: %s", op)
		}
	}
	eps := s.state.Endpoints[web]

	s.now = s.now.Add(time.Second)
	moved := webEndpoint(t, s, "198.18.130.11")
	p := s.apply(&model.FamilyDelta{Endpoints: map[model.ServicePortName][]*model.Endpoint{web: {eps[0], moved}}})
	// Adds only, in the maps looked up first, and the new endpoint's
	// hairpin pair: no chain, no rule, no deletion.
	want := []string{
		"add element ip " + shard + ` cluster-services-new { 198.19.0.10 . tcp . 80 comment "demo/web-clusterip:http/TCP" : goto cluster/tcp/2 }`,
		"add element ip " + shard + " cluster-endpoints-new-tcp { 198.19.0.10 . 80 . 0 : 198.18.129.10 . 8080 }",
		"add element ip " + shard + " cluster-endpoints-new-tcp { 198.19.0.10 . 80 . 1 : 198.18.130.11 . 8080 }",
		"add element ip " + s.hairpinTable("198.18.130.11") + " hairpin-endpoints { 198.18.130.11 . 198.18.130.11 }",
	}
	if diff := cmp.Diff(want, opTexts(p)); diff != "" {
		t.Errorf("transaction (-want +got):\n%s", diff)
	}
	s.checkLikeFull("endpoint moved")
	runPacketFlowTests(t, s.rs, hostA, []packetFlowTest{
		{name: "new endpoint in use", src: localPod, iif: podIIF, dst: "198.19.0.10:80", output: "198.18.129.10:8080, 198.18.130.11:8080"},
		{name: "pod traffic not masqueraded", src: localPod, iif: podIIF, dst: "198.19.0.10:80", output: "198.18.129.10:8080, 198.18.130.11:8080"},
		{name: "outside traffic masqueraded", src: "203.0.113.9", iif: lanIIF, dst: "198.19.0.10:80", output: "198.18.129.10:8080, 198.18.130.11:8080", masq: true},
		{name: "the other port of the shared chain", src: localPod, iif: podIIF, dst: "198.19.0.18:53", output: "198.18.129.53:53, 198.18.130.53:53"},
	})

	// Before the stale delay nothing is settled; after it the clean-up
	// moves the port back: the changed key of the other map, the "new"
	// elements deleted.
	s.now = s.now.Add(staleDelay / 2)
	if p := s.partial(); p.Tx.Len() != 0 || p.Cleanup != nil {
		t.Errorf("before the stale delay: want nothing, got:\n%s%v", p.Tx, p.Cleanup)
	}
	s.now = s.now.Add(staleDelay)
	p = s.partial()
	if p.Tx.Len() != 0 || p.Cleanup == nil {
		t.Fatalf("after the stale delay: want only a clean-up, got:\n%s%v", p.Tx, p.Cleanup)
	}
	wantCleanup := []string{
		"delete element ip " + shard + " cluster-endpoints-tcp { 198.19.0.10 . 80 . 1 : 198.18.130.10 . 8080 }",
		"add element ip " + shard + " cluster-endpoints-tcp { 198.19.0.10 . 80 . 1 : 198.18.130.11 . 8080 }",
		"delete element ip " + shard + " cluster-services-new { 198.19.0.10 . tcp . 80 }",
		"delete element ip " + shard + " cluster-endpoints-new-tcp { 198.19.0.10 . 80 . 0 : 198.18.129.10 . 8080 }",
		"delete element ip " + shard + " cluster-endpoints-new-tcp { 198.19.0.10 . 80 . 1 : 198.18.130.11 . 8080 }",
	}
	var got []string
	for _, l := range strings.Split(strings.TrimSpace(p.Cleanup.String()), "\n") {
		if !strings.Contains(l, "hairpin-endpoints") {
			got = append(got, l)
		}
	}
	if diff := cmp.Diff(wantCleanup, got); diff != "" {
		t.Errorf("clean-up (-want +got):\n%s", diff)
	}
	s.checkLikeFull("settled")
	s.settleAll("settled")
}

// TestPlainCountChanges changes web-clusterip's endpoint count 2 -> 3 -> 1
// -> 2 -> 1 -> 0 -> 3, three times within the stale delay, and checks each
// step against a fresh full render, the kernel operations each change
// sends (adds only until the tiers run out), the clean-up that settles,
// and that chains of counts no longer used go.
func TestPlainCountChanges(t *testing.T) {
	c := flowtest.Example(t, example.NodeA)
	s := newSyncer(t, c, model.IPv4)
	s.full()
	web := fixtures.SPName("web-clusterip", "http", model.TCP)
	shard := s.shardOf(web)
	e0, e1 := s.state.Endpoints[web][0], s.state.Endpoints[web][1]
	e2 := webEndpoint(t, s, "198.18.130.12")
	set := func(step string, eps ...*model.Endpoint) *Plan {
		t.Helper()
		p := s.apply(&model.FamilyDelta{Endpoints: map[model.ServicePortName][]*model.Endpoint{web: eps}})
		s.checkLikeFull(step)
		return p
	}
	deletes := func(p *Plan) []string {
		var out []string
		for _, op := range opTexts(p) {
			if strings.HasPrefix(op, "delete") || strings.HasPrefix(op, "flush") {
				out = append(out, op)
			}
		}
		return out
	}

	// 2 -> 3: a chain for 3 and the "new" elements, nothing deleted.
	s.now = s.now.Add(time.Second)
	p := set("3 endpoints", e0, e1, e2)
	if d := deletes(p); len(d) > 0 {
		t.Errorf("first change deletes: %v", d)
	}
	if !slices.Contains(opTexts(p), "add chain ip "+shard+" cluster/tcp/3") {
		t.Errorf("no chain for 3 endpoints:\n%s", p.Tx)
	}
	runPacketFlowTests(t, s.rs, hostA, []packetFlowTest{
		{name: "three endpoints", src: localPod, iif: podIIF, dst: "198.19.0.10:80", output: "198.18.129.10:8080, 198.18.130.10:8080, 198.18.130.12:8080"},
	})

	// 3 -> 1 within the stale delay: the next tier, adds only again.
	s.now = s.now.Add(staleDelay / 4)
	p = set("1 endpoint, soon after", e1)
	if d := deletes(p); len(d) > 0 {
		t.Errorf("second change within the stale delay deletes: %v", d)
	}
	if !slices.Contains(opTexts(p), "add element ip "+shard+` cluster-services-newer { 198.19.0.10 . tcp . 80 comment "demo/web-clusterip:http/TCP" : goto cluster/tcp/1 }`) {
		t.Errorf("second change: not in the top tier:\n%s", p.Tx)
	}
	runPacketFlowTests(t, s.rs, hostA, []packetFlowTest{
		{name: "one endpoint", src: localPod, iif: podIIF, dst: "198.19.0.10:80", output: "198.18.130.10:8080"},
	})
	// 1 -> 2, still within the delay: out of tiers, changed in place,
	// which deletes.
	s.now = s.now.Add(staleDelay / 4)
	p = set("2 endpoints, soon after", e1, e2)
	if d := deletes(p); len(d) == 0 {
		t.Errorf("third change within the stale delay: want it in place, got:\n%s", p.Tx)
	}
	runPacketFlowTests(t, s.rs, hostA, []packetFlowTest{
		{name: "two endpoints", src: localPod, iif: podIIF, dst: "198.19.0.10:80", output: "198.18.130.10:8080, 198.18.130.12:8080"},
	})
	// 2 -> 1 once the first change is a stale delay old: in place again,
	// but the clean-up after this very change settles the port (its
	// change is live by then) ...
	s.now = s.now.Add(staleDelay / 2)
	p = set("1 endpoint, settled", e1)
	if p.Cleanup == nil || !strings.Contains(p.Cleanup.String(), "delete element ip "+shard+" cluster-services-newer { 198.19.0.10 . tcp . 80 }") {
		t.Errorf("the clean-up of the change does not settle it:\n%v", p.Cleanup)
	}
	// ... so that the next change, right after, adds only.
	s.now = s.now.Add(10 * time.Millisecond)
	p = set("3 endpoints, right after", e0, e1, e2)
	if d := deletes(p); len(d) > 0 {
		t.Errorf("change after the settling deletes: %v", d)
	}
	s.now = s.now.Add(10 * time.Millisecond)
	set("1 endpoint, right after", e1)
	s.settleAll("1 endpoint")
	for _, name := range []string{"cluster/tcp/3"} {
		if slices.Contains(objectNames(s.rs, s.cfg.table())[shard].Chains, name) {
			t.Errorf("%s still there after the clean-ups", name)
		}
	}

	// 1 -> 0: no longer plain (no endpoints: reject); its elements go.
	s.now = s.now.Add(time.Second)
	set("no endpoints")
	runPacketFlowTests(t, s.rs, hostA, []packetFlowTest{
		{name: "no endpoints", src: localPod, iif: podIIF, dst: "198.19.0.10:80", output: "REJECT"},
	})
	// 0 -> 3: plain again, straight into the other maps.
	s.now = s.now.Add(time.Second)
	p = set("3 endpoints again", e0, e1, e2)
	for _, op := range opTexts(p) {
		if strings.HasPrefix(op, "add element") && strings.Contains(op, "-new") {
			t.Errorf("a port new to the plain maps goes to the \"new\" ones: %s", op)
		}
	}
	runPacketFlowTests(t, s.rs, hostA, []packetFlowTest{
		{name: "three endpoints again", src: localPod, iif: podIIF, dst: "198.19.0.10:80", output: "198.18.129.10:8080, 198.18.130.10:8080, 198.18.130.12:8080"},
	})
	s.settleAll("3 endpoints again")
	if !slices.Contains(objectNames(s.rs, s.cfg.table())[shard].Chains, "cluster/tcp/3") {
		t.Errorf("cluster/tcp/3 gone while in use")
	}
	if slices.Contains(objectNames(s.rs, s.cfg.table())[shard].Chains, "cluster/tcp/1") {
		t.Errorf("cluster/tcp/1 still there after the clean-ups")
	}
}

// TestPlainSwitches turns web-clusterip (dual-stack in IPv6) into a port with chains of its own
// and back (NodePort, session affinity, internal policy Local), removes it
// and brings it back, each step checked against a fresh full render.
func TestPlainSwitches(t *testing.T) {
	for _, f := range []v1.IPFamily{model.IPv4, model.IPv6} {
		t.Run(string(f), func(t *testing.T) {
			c := flowtest.Example(t, example.NodeA)
			s := newSyncer(t, c, f)
			s.full()
			web := fixtures.SPName("web-clusterip", "http", model.TCP)
			if f == model.IPv6 {
				web = fixtures.SPName("dual-stack", "http", model.TCP) // web-clusterip is IPv4 only
			}
			orig := s.state.Services[web]
			origEps := s.state.Endpoints[web]
			edit := func(step string, tweak func(sp *model.ServicePort)) {
				t.Helper()
				s.now = s.now.Add(300 * time.Millisecond)
				sp := *orig
				tweak(&sp)
				s.apply(&model.FamilyDelta{Services: map[model.ServicePortName]*model.ServicePort{web: &sp}})
				s.checkLikeFull(step)
			}
			moveEndpoint := func(step string) {
				t.Helper()
				s.now = s.now.Add(300 * time.Millisecond)
				eps := slices.Clone(s.state.Endpoints[web])
				e := *eps[0]
				e.Port++
				eps[0] = &e
				s.apply(&model.FamilyDelta{Endpoints: map[model.ServicePortName][]*model.Endpoint{web: eps}})
				s.checkLikeFull(step)
			}
			// Hot (changed, not yet settled) when it switches.
			moveEndpoint("endpoint moved")
			edit("NodePort", func(sp *model.ServicePort) { sp.Type = v1.ServiceTypeNodePort; sp.NodePort = 30099 })
			edit("ClusterIP again", func(sp *model.ServicePort) {})
			moveEndpoint("endpoint moved again")
			edit("session affinity", func(sp *model.ServicePort) { sp.StickyMaxAgeSeconds = 600 })
			edit("no session affinity", func(sp *model.ServicePort) {})
			edit("internal policy Local", func(sp *model.ServicePort) { sp.InternalPolicyLocal = true })
			edit("internal policy Cluster", func(sp *model.ServicePort) {})
			moveEndpoint("endpoint moved once more")
			edit("other port number", func(sp *model.ServicePort) { sp.Port = 81 })
			s.settleAll("switches")

			// Removed while its change is not settled, then back.
			moveEndpoint("before removal")
			s.now = s.now.Add(100 * time.Millisecond)
			s.apply(&model.FamilyDelta{
				Services:  map[model.ServicePortName]*model.ServicePort{web: nil},
				Endpoints: map[model.ServicePortName][]*model.Endpoint{web: nil},
			})
			s.checkLikeFull("removed")
			s.now = s.now.Add(100 * time.Millisecond)
			s.apply(&model.FamilyDelta{
				Services:  map[model.ServicePortName]*model.ServicePort{web: orig},
				Endpoints: map[model.ServicePortName][]*model.Endpoint{web: origEps},
			})
			s.checkLikeFull("back")
			s.settleAll("removed and back")
		})
	}
}
