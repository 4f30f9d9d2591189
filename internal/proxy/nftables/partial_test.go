package nftables

// Partial sync tests, pure: Render and Commit only. Every transaction is
// applied to a cumulative tracer ruleset (which refuses what the kernel
// would refuse), and after every step that ruleset must route packets
// exactly as a fresh full render of the same state does. The address plan
// is at the top of fixtures_test.go.

import (
	"net/netip"
	"slices"
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
)

// TestPartialSyncOneEndpointChange follows an endpoint change of a
// service port with chains of its own (a NodePort service); plain
// ClusterIP ports are in plain_test.go.
func TestPartialSyncOneEndpointChange(t *testing.T) {
	c := flowtest.Example(t, example.NodeA)
	s := newSyncer(t, c, model.IPv4)
	s.full()
	s.checkLikeFull("full")

	web := fixtures.SPName("web-nodeport", "http", model.TCP)
	old := s.state.Endpoints[web]
	if len(old) != 2 || old[1].IP != netip.MustParseAddr("198.18.130.10") {
		t.Fatalf("unexpected endpoints of %s in the example: %v", web, old)
	}
	moved := *old[1]
	moved.IP = netip.MustParseAddr("198.18.130.11")
	s.now = s.now.Add(time.Second)
	plan := s.apply(&model.FamilyDelta{Endpoints: map[model.ServicePortName][]*model.Endpoint{web: {old[0], &moved}}})

	ops := opTexts(plan)
	svc := serviceChainName(prefixServiceChain, web)
	shard := s.shardOf(web)
	epMap := endpointMapName(web)
	// The endpoint map's new keys name no service: they are the ones the
	// service chain's new rule draws (checked below).
	newKeys := []string{
		"add element ip " + shard + " " + epMap + " { 2 : 198.18.129.10 . 8080 }",
		"add element ip " + shard + " " + epMap + " { 3 : 198.18.130.11 . 8080 }",
	}
	// Nor does the new endpoint's hairpin pair: it stands for the address,
	// whichever services it backs.
	hairpinPair := "add element ip " + s.hairpinTable("198.18.130.11") + " hairpin-endpoints { 198.18.130.11 . 198.18.130.11 }"
	for _, op := range ops {
		if slices.Contains(newKeys, op) || op == hairpinPair {
			continue
		}
		if m := servicesMentioned(op); !m.Equal(sets.New("web-nodeport")) {
			t.Errorf("operation names %v, want only web-nodeport: %s", sets.List(m), op)
		}
	}
	// The rules written are those a full render writes for the service
	// chain, inserted at its head (so in reverse order, after a closing
	// "return"), except that the endpoints get fresh keys in the endpoint
	// map (2 and 3; the full render numbers from 0), plus the hairpin
	// pair of the new endpoint. Nothing is deleted: a deletion costs the
	// kernel an RCU grace period, so the old keys 0 and 1 stay until a
	// clean-up.
	fresh := opTexts(Render(s.cfg, s.input(true, nil), NewApplied()))
	var svcRules []string
	for _, op := range fresh {
		if strings.HasPrefix(op, "add rule ip "+shard+" "+svc+" ") {
			svcRules = append(svcRules, op)
		}
	}
	if len(svcRules) == 0 {
		t.Fatalf("a full render writes no rules in %s", svc)
	}
	if last := svcRules[len(svcRules)-1]; !strings.HasSuffix(last, "meta l4proto tcp dnat ip to numgen random mod 2 offset 0 map @"+epMap) {
		t.Errorf("service chain must pick among its 2 endpoints through %s: %s", epMap, last)
	}
	want := []string{"insert rule ip " + shard + " " + svc + " return"}
	for i := len(svcRules) - 1; i >= 0; i-- {
		want = append(want, "insert"+strings.Replace(strings.TrimPrefix(svcRules[i], "add"), " offset 0 ", " offset 2 ", 1))
	}
	// The external chain (NodePort traffic) is rewritten the same way.
	ext := serviceChainName(prefixExternalChain, web)
	want = append(want, "insert rule ip "+shard+" "+ext+" return")
	var extRules []string
	for _, op := range fresh {
		if strings.HasPrefix(op, "add rule ip "+shard+" "+ext+" ") {
			extRules = append(extRules, op)
		}
	}
	for i := len(extRules) - 1; i >= 0; i-- {
		want = append(want, "insert"+strings.TrimPrefix(extRules[i], "add"))
	}
	want = append(want, hairpinPair)
	want = append(want, newKeys...)
	if diff := cmp.Diff(want, ops); diff != "" {
		t.Errorf("transaction (-want +got):\n%s", diff)
	}
	for _, op := range ops {
		if strings.HasPrefix(op, "delete") || strings.HasPrefix(op, "flush") {
			t.Errorf("a partial sync deletes: %s", op)
		}
	}
	if len(plan.StaleUDP) != 0 || len(plan.NewlyServedUDP) != 0 {
		t.Errorf("TCP change reported UDP work: %+v %+v", plan.StaleUDP, plan.NewlyServedUDP)
	}
	s.checkLikeFull("endpoint moved")
	runPacketFlowTests(t, s.rs, hostA, []packetFlowTest{
		{name: "new endpoint in use", src: localPod, iif: podIIF, dst: "198.19.0.11:80", output: "198.18.129.10:8080, 198.18.130.11:8080"},
	})

	// The first sync a second later sends nothing in its sync transaction;
	// its clean-up rewrites the chain without the shadowed rules: the
	// table is then exactly what a
	// fresh full render gives. A full sync changes nothing after that.
	s.now = s.now.Add(time.Second)
	p := s.partial()
	if p.Tx.Len() != 0 {
		t.Errorf("sync with nothing changed: want no operations, got:\n%s", p.Tx)
	}
	// (198.18.130.10 still backs other services: its hairpin pair stays.)
	if p.Cleanup == nil || !strings.Contains(p.Cleanup.String(), "flush chain ip "+shard+" "+svc) {
		t.Errorf("clean-up a second later: want the service chain rewritten, got:\n%v", p.Cleanup)
	}
	for _, k := range []string{"0 : 198.18.129.10 . 8080", "1 : 198.18.130.10 . 8080"} {
		if p.Cleanup == nil || !strings.Contains(p.Cleanup.String(), "delete element ip "+shard+" "+epMap+" { "+k+" }") {
			t.Errorf("clean-up a second later: want the old key %s deleted, got:\n%v", k, p.Cleanup)
		}
	}
	fresh1 := parse(t, Render(s.cfg, s.input(true, nil), NewApplied()).Tx.String())
	if diff := cmp.Diff(contents(fresh1), contents(s.rs)); diff != "" {
		t.Errorf("after the clean-up the table differs from a fresh full render (-fresh +synced):\n%s", diff)
	}
	if p := s.partial(); p.Tx.Len() != 0 || p.Cleanup != nil {
		t.Errorf("nothing left to clean up, yet:\n%s%v", p.Tx, p.Cleanup)
	}
	s.full()
	fresh2 := parse(t, Render(s.cfg, s.input(true, nil), NewApplied()).Tx.String())
	if diff := cmp.Diff(contents(fresh2), contents(s.rs)); diff != "" {
		t.Errorf("after a full sync the table differs from a fresh full render (-fresh +synced):\n%s", diff)
	}
}

func TestPartialSyncNothingChanged(t *testing.T) {
	c := flowtest.Example(t, example.NodeA)
	for _, f := range []v1.IPFamily{model.IPv4, model.IPv6} {
		t.Run(string(f), func(t *testing.T) {
			s := newSyncer(t, c, f)
			if p := s.full(); p.Tx.Len() == 0 {
				t.Fatal("full sync rendered nothing")
			}
			if p := s.partial(); p.Tx.Len() != 0 {
				t.Errorf("nothing changed: want no operations, got:\n%s", p.Tx)
			}
			// Services reported as changed that render the same touch
			// no element and no endpoint chain (their few per-service
			// chains are rewritten by design).
			for _, op := range opTexts(s.partial(s.state.SortedNames()...)) {
				if strings.Contains(op, " element ") || strings.Contains(op, " endpoint-") && !strings.HasPrefix(op, "add rule ") {
					t.Errorf("unchanged services re-rendered: %s", op)
				}
			}
			// An update carrying equal objects is not a change.
			d := &model.FamilyDelta{Services: map[model.ServicePortName]*model.ServicePort{}, Endpoints: map[model.ServicePortName][]*model.Endpoint{}}
			for n, sp := range s.state.Services {
				cp := *sp
				d.Services[n] = &cp
			}
			if p := s.apply(d); p.Tx.Len() != 0 {
				t.Errorf("equal update: want no operations, got:\n%s", p.Tx)
			}
			// A second full sync rewrites everything but changes nothing.
			s.full()
			if p := s.partial(); p.Tx.Len() != 0 {
				t.Errorf("after a second full sync: want no operations, got:\n%s", p.Tx)
			}
			s.checkLikeFull("second full sync")
		})
	}
}

func TestPartialSyncRemoveAndRevive(t *testing.T) {
	c := flowtest.Example(t, example.NodeA)
	// Service ports with chains of their own (plain ClusterIP ports have
	// none; see plain_test.go).
	itp := fixtures.SPName("itp-local", "http", model.TCP)
	aff := fixtures.SPName("affinity", "http", model.TCP)
	for _, tc := range []struct {
		name string
		n    model.ServicePortName
		// chains and sets the service owns.
		chains, sets int
	}{
		{"itp-local", itp, 1, 0},
		{"affinity (with sets)", aff, 1, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSyncer(t, c, model.IPv4)
			s.full()
			sp, eps := s.state.Services[tc.n], s.state.Endpoints[tc.n]
			dst := netip.AddrPortFrom(sp.ClusterIP, uint16(sp.Port)).String()
			owned := func() (chains, sets []string) {
				base := "-" + portBase(tc.n)
				for t, o := range objectNames(s.rs, s.cfg.table()) {
					for _, n := range o.Chains {
						if strings.Contains(n, base) {
							chains = append(chains, t+" "+n)
						}
					}
					for _, n := range o.Sets {
						if strings.Contains(n, base) {
							sets = append(sets, t+" "+n)
						}
					}
				}
				return chains, sets
			}
			ch, st := owned()
			if len(ch) != tc.chains || len(st) != tc.sets {
				t.Fatalf("service owns chains %v and sets %v; want %d and %d", ch, st, tc.chains, tc.sets)
			}

			// Removal: its map and set elements are deleted (the hairpin
			// pairs wait for a full sync); its chains and sets stay, unused,
			// until a full sync after the stale delay.
			s.now = s.now.Add(10 * time.Second)
			removedAt := s.now
			p := s.apply(&model.FamilyDelta{
				Services:  map[model.ServicePortName]*model.ServicePort{tc.n: nil},
				Endpoints: map[model.ServicePortName][]*model.Endpoint{tc.n: nil},
			})
			var elemDeletes int
			for _, op := range opTexts(p) {
				switch {
				case strings.HasPrefix(op, "delete element "):
					elemDeletes++
				default:
					t.Errorf("removal: unexpected operation %s", op)
				}
				// Element deletes name only the key (the service's IP).
				if m := servicesMentioned(op); !m.Equal(sets.New(tc.n.Name)) && !strings.Contains(op, sp.ClusterIP.String()+" ") {
					t.Errorf("removal: operation names %v: %s", sets.List(m), op)
				}
			}
			if elemDeletes != 2 {
				t.Errorf("removal: %d element deletes; want 2 (cluster-ips, service-ips):\n%s", elemDeletes, p.Tx)
			}
			s.checkLikeFull("removed")
			runPacketFlowTests(t, s.rs, hostA, []packetFlowTest{
				{name: "removed service is not ours", src: localPod, iif: podIIF, dst: dst, output: "ACCEPT"},
			})

			// No sync deletes them before the stale delay; the first
			// sync after it does, in a clean-up transaction of its own.
			s.now = removedAt.Add(staleDelay - time.Millisecond)
			if p := s.partial(); p.Tx.Len() != 0 || p.Cleanup != nil {
				t.Errorf("partial sync before the stale delay: want no operations, got:\n%s%v", p.Tx, p.Cleanup)
			}
			if p := s.full(); p.Cleanup != nil {
				t.Errorf("full sync before the stale delay cleans up:\n%s", p.Cleanup)
			}
			s.now = removedAt.Add(staleDelay)
			p = s.partial()
			if p.Tx.Len() != 0 {
				t.Errorf("partial sync after the stale delay: want only a clean-up, got:\n%s", p.Tx)
			}
			if p.Cleanup == nil {
				t.Fatal("sync after the stale delay: no clean-up")
			}
			var deletes []string
			for _, op := range strings.Split(strings.TrimSpace(p.Cleanup.String()), "\n") {
				switch {
				case strings.HasPrefix(op, "flush chain "):
				case strings.HasPrefix(op, "delete chain "), strings.HasPrefix(op, "delete set "):
					deletes = append(deletes, op)
				case strings.HasPrefix(op, "delete map ") && strings.Contains(op, " "+endpointMapName(tc.n)):
					// Its endpoint map, when no other service port of
					// its group used it.
				default:
					t.Errorf("stale cleanup: unexpected operation %s", op)
				}
			}
			if len(deletes) != tc.chains+tc.sets {
				t.Errorf("stale cleanup: want %d deletes, got:\n%s", tc.chains+tc.sets, p.Cleanup)
			}
			// Chains are deleted before the sets their rules used.
			if i := slices.IndexFunc(deletes, func(op string) bool { return strings.HasPrefix(op, "delete set ") }); i >= 0 && slices.ContainsFunc(deletes[i:], func(op string) bool { return strings.HasPrefix(op, "delete chain ") }) {
				t.Errorf("a set is deleted before a chain:\n%s", p.Cleanup)
			}
			if ch, st := owned(); len(ch)+len(st) != 0 {
				t.Errorf("left in the table: %v %v", ch, st)
			}
			s.now = s.now.Add(time.Hour)
			if p := s.partial(); p.Tx.Len() != 0 {
				t.Errorf("after cleanup: want no operations, got:\n%s", p.Tx)
			}
			s.checkLikeFull("stale deleted")

			// Remove again, and bring it back before a full sync: the
			// stale objects are used again and never deleted.
			s.apply(&model.FamilyDelta{Services: map[model.ServicePortName]*model.ServicePort{tc.n: sp}, Endpoints: map[model.ServicePortName][]*model.Endpoint{tc.n: eps}})
			s.checkLikeFull("re-added")
			s.now = s.now.Add(time.Hour)
			removedAt = s.now
			s.apply(&model.FamilyDelta{
				Services:  map[model.ServicePortName]*model.ServicePort{tc.n: nil},
				Endpoints: map[model.ServicePortName][]*model.Endpoint{tc.n: nil},
			})
			s.now = removedAt.Add(staleDelay / 2)
			p = s.apply(&model.FamilyDelta{Services: map[model.ServicePortName]*model.ServicePort{tc.n: sp}, Endpoints: map[model.ServicePortName][]*model.Endpoint{tc.n: eps}})
			for _, op := range opTexts(p) {
				if strings.HasPrefix(op, "delete chain ") || strings.HasPrefix(op, "delete set ") {
					t.Errorf("revival deletes: %s", op)
				}
			}
			s.checkLikeFull("revived")
			for _, later := range []time.Duration{staleDelay, 10 * staleDelay} {
				s.now = removedAt.Add(later)
				if p := s.partial(); p.Tx.Len() != 0 {
					t.Errorf("%s after the removal: the revived service must not be touched, got:\n%s", later, p.Tx)
				}
				if p := s.full(); p.Cleanup != nil {
					t.Errorf("%s after the removal: a full sync deletes objects of the revived service:\n%s", later, p.Cleanup)
				}
			}
			if ch, st := owned(); len(ch) != tc.chains || len(st) != tc.sets {
				t.Errorf("after revival the service owns %v and %v; want %d chains and %d sets", ch, st, tc.chains, tc.sets)
			}
			s.checkLikeFull("revived, later")
		})
	}
}

// TestPartialSyncConflicts: the renderer's own safety net for a key two
// service ports want (a State filled by hand, bypassing the model's
// resolution), then the normal case where State.Apply resolves it.
func TestPartialSyncConflicts(t *testing.T) {
	c := flowtest.Example(t, example.NodeA)
	s := newSyncer(t, c, model.IPv4)
	const extIP = "198.19.201.1"
	claimA := fixtures.ServicePort("claim-a", "198.19.1.1", 80, func(sp *model.ServicePort) {
		sp.ExternalIPs = []netip.Addr{netip.MustParseAddr(extIP)}
	})
	claimB := fixtures.ServicePort("claim-b", "198.19.1.2", 80, func(sp *model.ServicePort) {
		sp.ExternalIPs = []netip.Addr{netip.MustParseAddr(extIP)}
	})
	epA := fixtures.Endpoint("198.18.129.101", 8080, true, nil)
	epB := fixtures.Endpoint("198.18.130.102", 8080, false, nil)
	epB2 := fixtures.Endpoint("198.18.130.103", 8080, false, nil)
	s.state.Services[claimA.Name], s.state.Endpoints[claimA.Name] = claimA, []*model.Endpoint{epA}
	s.state.Services[claimB.Name], s.state.Endpoints[claimB.Name] = claimB, []*model.Endpoint{epB}

	p := s.full()
	want := []string{"demo/claim-b:http/TCP wants service-ips { 198.19.201.1 . tcp . 80 } which demo/claim-a:http/TCP already has"}
	if diff := cmp.Diff(want, p.Conflicts); diff != "" {
		t.Errorf("conflicts (-want +got):\n%s", diff)
	}
	ext := extIP + ":80"
	runPacketFlowTests(t, s.rs, hostA, []packetFlowTest{
		{name: "first claimant serves", src: outside, iif: lanIIF, dst: ext, output: "198.18.129.101:8080", masq: true},
		{name: "second claimant's cluster IP", src: localPod, iif: podIIF, dst: "198.19.1.2:80", output: "198.18.130.102:8080"},
	})
	s.checkLikeFull("both claim")

	// A change of the second claimant does not move the address.
	s.now = s.now.Add(time.Second)
	p = s.apply(&model.FamilyDelta{Endpoints: map[model.ServicePortName][]*model.Endpoint{claimB.Name: {epB2}}})
	for _, op := range opTexts(p) {
		if strings.Contains(op, extIP) && !strings.HasPrefix(op, "add rule ") {
			t.Errorf("second claimant's change touches the contested element: %s", op)
		}
	}
	runPacketFlowTests(t, s.rs, hostA, []packetFlowTest{
		{name: "first claimant still serves", src: outside, iif: lanIIF, dst: ext, output: "198.18.129.101:8080", masq: true},
	})

	// Removing the first claimant hands the address to the second.
	s.now = s.now.Add(time.Second)
	p = s.apply(&model.FamilyDelta{
		Services:  map[model.ServicePortName]*model.ServicePort{claimA.Name: nil},
		Endpoints: map[model.ServicePortName][]*model.Endpoint{claimA.Name: nil},
	})
	if len(p.Conflicts) != 0 {
		t.Errorf("conflicts after the first claimant left: %v", p.Conflicts)
	}
	var handover []string
	for _, op := range opTexts(p) {
		if strings.Contains(op, extIP) {
			handover = append(handover, op)
		}
	}
	wantOps := []string{
		// From the first claimant's shard to the second's.
		`delete element ip ` + s.shardOf(claimA.Name) + ` service-ips { 198.19.201.1 . tcp . 80 }`,
		`add element ip ` + s.shardOf(claimB.Name) + ` service-ips { 198.19.201.1 . tcp . 80 comment "demo/claim-b:http/TCP" : goto ` + serviceChainName(prefixExternalChain, claimB.Name) + ` }`,
	}
	if diff := cmp.Diff(wantOps, handover); diff != "" {
		t.Errorf("hand-over operations (-want +got):\n%s", diff)
	}
	runPacketFlowTests(t, s.rs, hostA, []packetFlowTest{
		{name: "second claimant serves now", src: outside, iif: lanIIF, dst: ext, output: "198.18.130.103:8080", masq: true},
	})
	s.checkLikeFull("first claimant removed")

	// The first claimant coming back queues behind the second.
	s.now = s.now.Add(time.Second)
	p = s.apply(&model.FamilyDelta{
		Services:  map[model.ServicePortName]*model.ServicePort{claimA.Name: claimA},
		Endpoints: map[model.ServicePortName][]*model.Endpoint{claimA.Name: {epA}},
	})
	want = []string{"demo/claim-a:http/TCP wants service-ips { 198.19.201.1 . tcp . 80 } which demo/claim-b:http/TCP already has"}
	if diff := cmp.Diff(want, p.Conflicts); diff != "" {
		t.Errorf("conflicts on return (-want +got):\n%s", diff)
	}
	runPacketFlowTests(t, s.rs, hostA, []packetFlowTest{
		{name: "second claimant keeps it", src: outside, iif: lanIIF, dst: ext, output: "198.18.130.103:8080", masq: true},
	})

	// Claims that reach the renderer through State.Apply are resolved by
	// the model first (model/resolve.go): the older service keeps the node
	// port whatever the order, the renderer sees no conflict, and the
	// service that loses or regains it is re-rendered.
	npA := fixtures.ServicePort("np-a", "198.19.1.3", 80, func(sp *model.ServicePort) {
		sp.Type, sp.NodePort, sp.Created = v1.ServiceTypeNodePort, 30500, 2000
	})
	npB := fixtures.ServicePort("np-b", "198.19.1.4", 81, func(sp *model.ServicePort) {
		sp.Type, sp.NodePort, sp.Created = v1.ServiceTypeNodePort, 30500, 1000
	})
	s.now = s.now.Add(time.Second)
	p = s.apply(&model.FamilyDelta{
		Services:  map[model.ServicePortName]*model.ServicePort{npA.Name: npA},
		Endpoints: map[model.ServicePortName][]*model.Endpoint{npA.Name: {epA}},
	})
	if len(p.Conflicts) != 0 {
		t.Errorf("nodePort conflicts reached the renderer: %v", p.Conflicts)
	}
	runPacketFlowTests(t, s.rs, hostA, []packetFlowTest{
		{name: "only nodePort claimant serves", src: outside, iif: lanIIF, dst: "198.18.0.10:30500", output: "198.18.129.101:8080", masq: true},
	})
	s.now = s.now.Add(time.Second)
	p = s.apply(&model.FamilyDelta{
		Services:  map[model.ServicePortName]*model.ServicePort{npB.Name: npB},
		Endpoints: map[model.ServicePortName][]*model.Endpoint{npB.Name: {epB}},
	})
	if len(p.Conflicts) != 0 {
		t.Errorf("nodePort conflicts reached the renderer: %v", p.Conflicts)
	}
	runPacketFlowTests(t, s.rs, hostA, []packetFlowTest{
		{name: "older nodePort claimant takes it", src: outside, iif: lanIIF, dst: "198.18.0.10:30500", output: "198.18.130.102:8080", masq: true},
		{name: "newer claimant keeps its cluster IP", src: localPod, iif: podIIF, dst: "198.19.1.3:80", output: "198.18.129.101:8080"},
	})
	s.checkLikeFull("nodePort taken by the older service")
	s.now = s.now.Add(time.Second)
	s.apply(&model.FamilyDelta{Services: map[model.ServicePortName]*model.ServicePort{npB.Name: nil}})
	runPacketFlowTests(t, s.rs, hostA, []packetFlowTest{
		{name: "nodePort handed back", src: outside, iif: lanIIF, dst: "198.18.0.10:30500", output: "198.18.129.101:8080", masq: true},
	})
	s.checkLikeFull("nodePort handed back")
}

// TestPartialSyncUDPConntrack: the plan says which UDP conntrack entries
// must go.
func TestPartialSyncUDPConntrack(t *testing.T) {
	c := flowtest.Example(t, example.NodeA)
	s := newSyncer(t, c, model.IPv4)
	if p := s.full(); len(p.StaleUDP) != 0 || len(p.NewlyServedUDP) != 0 {
		t.Errorf("first full sync reported UDP work: %+v %+v", p.StaleUDP, p.NewlyServedUDP)
	}
	dns := fixtures.SPName("dns-udp", "dns", model.UDP)
	eps := s.state.Endpoints[dns]
	s.now = s.now.Add(time.Second)
	p := s.apply(&model.FamilyDelta{Endpoints: map[model.ServicePortName][]*model.Endpoint{dns: eps[:1]}})
	if len(p.StaleUDP) != 1 || p.StaleUDP[0].Service.Name != dns || len(p.StaleUDP[0].Endpoints) != 1 || p.StaleUDP[0].Endpoints[0].AddrPort() != eps[1].AddrPort() {
		t.Errorf("endpoint removed: StaleUDP = %+v, want %s losing %s", p.StaleUDP, dns, eps[1])
	}
	if len(p.NewlyServedUDP) != 0 {
		t.Errorf("endpoint removed: NewlyServedUDP = %v", p.NewlyServedUDP)
	}
	s.now = s.now.Add(time.Second)
	p = s.apply(&model.FamilyDelta{Endpoints: map[model.ServicePortName][]*model.Endpoint{dns: nil}})
	if len(p.StaleUDP) != 1 || len(p.StaleUDP[0].Endpoints) != 1 || p.StaleUDP[0].Endpoints[0].AddrPort() != eps[0].AddrPort() {
		t.Errorf("last endpoint removed: StaleUDP = %+v", p.StaleUDP)
	}
	runPacketFlowTests(t, s.rs, hostA, []packetFlowTest{
		{name: "no endpoints: rejected", proto: v1.ProtocolUDP, src: localPod, iif: podIIF, dst: "198.19.0.18:53", output: "REJECT"},
	})
	s.now = s.now.Add(time.Second)
	p = s.apply(&model.FamilyDelta{Endpoints: map[model.ServicePortName][]*model.Endpoint{dns: eps}})
	if len(p.NewlyServedUDP) != 1 || p.NewlyServedUDP[0].Name != dns || len(p.StaleUDP) != 0 {
		t.Errorf("endpoints back: NewlyServedUDP = %v, StaleUDP = %v", p.NewlyServedUDP, p.StaleUDP)
	}
	// The TCP port of the same service never asks for UDP work.
	dnsTCP := fixtures.SPName("dns-udp", "dns-tcp", model.TCP)
	s.now = s.now.Add(time.Second)
	p = s.apply(&model.FamilyDelta{Endpoints: map[model.ServicePortName][]*model.Endpoint{dnsTCP: s.state.Endpoints[dnsTCP][:1]}})
	if len(p.StaleUDP) != 0 || len(p.NewlyServedUDP) != 0 {
		t.Errorf("TCP change: %+v %+v", p.StaleUDP, p.NewlyServedUDP)
	}
	s.checkLikeFull("dns changes")

	// Changes that a full sync picks up (the periodic one, or the retry
	// after a failure) need the same cleanup.
	s.now = s.now.Add(time.Second)
	s.state.Apply(&model.FamilyDelta{Endpoints: map[model.ServicePortName][]*model.Endpoint{dns: eps[1:]}})
	p = s.full()
	if len(p.StaleUDP) != 1 || p.StaleUDP[0].Service.Name != dns || len(p.StaleUDP[0].Endpoints) != 1 || p.StaleUDP[0].Endpoints[0].AddrPort() != eps[0].AddrPort() {
		t.Errorf("endpoint removed, full sync: StaleUDP = %+v, want %s losing %s", p.StaleUDP, dns, eps[0])
	}
	s.now = s.now.Add(time.Second)
	s.state.Apply(&model.FamilyDelta{Endpoints: map[model.ServicePortName][]*model.Endpoint{dns: nil}})
	s.full()
	s.now = s.now.Add(time.Second)
	s.state.Apply(&model.FamilyDelta{Endpoints: map[model.ServicePortName][]*model.Endpoint{dns: eps}})
	p = s.full()
	if len(p.NewlyServedUDP) != 1 || p.NewlyServedUDP[0].Name != dns {
		t.Errorf("endpoints back, full sync: NewlyServedUDP = %v", p.NewlyServedUDP)
	}
	s.now = s.now.Add(time.Second)
	sp := s.state.Services[dns]
	s.state.Apply(&model.FamilyDelta{Services: map[model.ServicePortName]*model.ServicePort{dns: nil}, Endpoints: map[model.ServicePortName][]*model.Endpoint{dns: nil}})
	p = s.full()
	if len(p.StaleUDP) != 1 || p.StaleUDP[0].Service != sp || len(p.StaleUDP[0].Endpoints) != 2 {
		t.Errorf("UDP service removed, full sync: StaleUDP = %+v, want both endpoints of %s", p.StaleUDP, dns)
	}
	// A restart knows nothing of what was there before: no cleanup
	// (upstream's reconciler would compare with the conntrack table).
	s.applied = NewApplied()
	s.state.Apply(&model.FamilyDelta{Services: map[model.ServicePortName]*model.ServicePort{dns: sp}, Endpoints: map[model.ServicePortName][]*model.Endpoint{dns: eps}})
	if p := s.full(); len(p.StaleUDP) != 0 || len(p.NewlyServedUDP) != 0 {
		t.Errorf("restart: %+v %v", p.StaleUDP, p.NewlyServedUDP)
	}
}

// TestPartialSyncUDPTerminatingThenGone: an endpoint that turns
// terminating keeps its UDP flows while it serves, and the sync in which
// it goes away names it stale (upstream's Conntrack e2e test of a cycling
// UDP server pod).
func TestPartialSyncUDPTerminatingThenGone(t *testing.T) {
	c := flowtest.Example(t, example.NodeA)
	s := newSyncer(t, c, model.IPv4)
	s.full()
	dns := fixtures.SPName("dns-udp", "dns", model.UDP)
	eps := s.state.Endpoints[dns]
	if len(eps) < 2 {
		t.Fatalf("%s has %d endpoints, want 2", dns, len(eps))
	}
	terminating := *eps[0]
	terminating.Ready, terminating.Serving, terminating.Terminating = false, true, true
	s.now = s.now.Add(time.Second)
	p := s.apply(&model.FamilyDelta{Endpoints: map[model.ServicePortName][]*model.Endpoint{dns: {&terminating, eps[1]}}})
	if len(p.StaleUDP) != 0 {
		t.Errorf("serving terminating endpoint: StaleUDP = %+v, want none", p.StaleUDP)
	}
	s.now = s.now.Add(time.Second)
	p = s.apply(&model.FamilyDelta{Endpoints: map[model.ServicePortName][]*model.Endpoint{dns: eps[1:2]}})
	if len(p.StaleUDP) != 1 || len(p.StaleUDP[0].Endpoints) != 1 || p.StaleUDP[0].Endpoints[0].AddrPort() != eps[0].AddrPort() {
		t.Errorf("terminating endpoint gone: StaleUDP = %+v, want %s losing %s", p.StaleUDP, dns, eps[0])
	}
}
