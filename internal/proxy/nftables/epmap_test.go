package nftables

// Endpoint map keys through partial and full syncs. Addresses are those of
// the example cluster (testdata/example): 198.19.0.0/16 service IPs,
// 198.18.129.0/24 pods of node-a, 198.18.130.0/24 pods of node-b.

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kproxy/kproxy/internal/example"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy/flowtest"
	"github.com/kproxy/kproxy/internal/testutil/fixtures"
)

// TestEndpointMapKeys follows the keys of a service port with chains of its
// own (a NodePort service; plain ClusterIP ports have no chain, see
// plain_test.go).
func TestEndpointMapKeys(t *testing.T) {
	c := flowtest.Example(t, example.NodeA)
	s := newSyncer(t, c, model.IPv4)
	s.full()
	web := fixtures.SPName("web-nodeport", "http", model.TCP)
	shard, m := s.shardOf(web), endpointMapName(web)
	chain := serviceChainName(prefixServiceChain, web)
	mapRule := func(off string) string {
		return "meta l4proto tcp dnat ip to numgen random mod 2 offset " + off + " map @" + m
	}
	// live is the service chain's first map rule (inserted rules come
	// first) and the elements of its map.
	live := func() (string, []string) {
		var rule string
		var elems []string
		for _, l := range strings.Split(s.rs.String(), "\n") {
			if body, ok := strings.CutPrefix(l, "add rule ip "+shard+" "+chain+" "); ok && rule == "" && strings.Contains(body, " map @") {
				rule = body
			}
			if e, ok := strings.CutPrefix(l, "add element ip "+shard+" "+m+" "); ok {
				elems = append(elems, e)
			}
		}
		slices.Sort(elems)
		return rule, elems
	}
	check := func(step, wantRule string, wantElems ...string) {
		t.Helper()
		rule, elems := live()
		if rule != wantRule {
			t.Errorf("%s: service chain draws with %q, want %q", step, rule, wantRule)
		}
		slices.Sort(wantElems)
		if d := cmp.Diff(wantElems, elems); d != "" {
			t.Errorf("%s: elements of %s (-want +got):\n%s", step, m, d)
		}
	}
	check("full sync", mapRule("0"), "{ 0 : 198.18.129.10 . 8080 }", "{ 1 : 198.18.130.10 . 8080 }")

	// A change of the service that leaves its endpoints alone keeps the
	// keys: no element is written.
	s.now = s.now.Add(100 * time.Millisecond)
	sp := *s.state.Services[web]
	sp.ExternalIPs = []netip.Addr{netip.MustParseAddr("203.0.113.77")}
	p := s.apply(&model.FamilyDelta{Services: map[model.ServicePortName]*model.ServicePort{web: &sp}})
	for _, op := range opTexts(p) {
		if strings.Contains(op, " "+m+" ") && strings.HasPrefix(op, "add element") {
			t.Errorf("endpoints unchanged, yet: %s", op)
		}
	}
	check("external IP added", mapRule("0"), "{ 0 : 198.18.129.10 . 8080 }", "{ 1 : 198.18.130.10 . 8080 }")

	// Each endpoint change takes fresh keys after all the map has had;
	// the old ones stay (a deletion would cost the sync an RCU grace
	// period) and no rule draws them.
	eps := s.state.Endpoints[web]
	moved := *eps[1]
	moved.IP = netip.MustParseAddr("198.18.130.11")
	s.now = s.now.Add(100 * time.Millisecond)
	first := s.now
	p = s.apply(&model.FamilyDelta{Endpoints: map[model.ServicePortName][]*model.Endpoint{web: {eps[0], &moved}}})
	for _, op := range opTexts(p) {
		if strings.HasPrefix(op, "delete") || strings.HasPrefix(op, "flush") {
			t.Errorf("a partial sync deletes: %s", op)
		}
	}
	check("endpoint moved", mapRule("2"), "{ 0 : 198.18.129.10 . 8080 }", "{ 1 : 198.18.130.10 . 8080 }",
		"{ 2 : 198.18.129.10 . 8080 }", "{ 3 : 198.18.130.11 . 8080 }")
	runPacketFlowTests(t, s.rs, hostA, []packetFlowTest{
		{name: "the fresh keys", src: localPod, iif: podIIF, dst: "198.19.0.11:80", output: "198.18.129.10:8080, 198.18.130.11:8080"},
	})
	s.now = s.now.Add(500 * time.Millisecond)
	third := *eps[1]
	third.IP = netip.MustParseAddr("198.18.130.12")
	p = s.apply(&model.FamilyDelta{Endpoints: map[model.ServicePortName][]*model.Endpoint{web: {eps[0], &third}}})
	if p.Cleanup != nil {
		t.Errorf("clean-up before the stale delay:\n%s", p.Cleanup)
	}
	check("endpoint moved again", mapRule("4"), "{ 0 : 198.18.129.10 . 8080 }", "{ 1 : 198.18.130.10 . 8080 }",
		"{ 2 : 198.18.129.10 . 8080 }", "{ 3 : 198.18.130.11 . 8080 }", "{ 4 : 198.18.129.10 . 8080 }", "{ 5 : 198.18.130.12 . 8080 }")

	// The stale delay after the first change: its clean-up deletes the
	// keys that change left (0, 1), not those of the second (2, 3).
	s.now = first.Add(staleDelay)
	p = s.partial()
	if p.Tx.Len() != 0 || p.Cleanup == nil {
		t.Fatalf("after the stale delay: want only a clean-up, got:\n%s%v", p.Tx, p.Cleanup)
	}
	check("first clean-up", mapRule("4"), "{ 2 : 198.18.129.10 . 8080 }", "{ 3 : 198.18.130.11 . 8080 }",
		"{ 4 : 198.18.129.10 . 8080 }", "{ 5 : 198.18.130.12 . 8080 }")
	s.now = s.now.Add(staleDelay)
	s.partial()
	check("second clean-up", mapRule("4"), "{ 4 : 198.18.129.10 . 8080 }", "{ 5 : 198.18.130.12 . 8080 }")
	if p := s.partial(); p.Tx.Len() != 0 || p.Cleanup != nil {
		t.Errorf("nothing left to clean up, yet:\n%s%v", p.Tx, p.Cleanup)
	}

	// A full sync numbers from 0 again.
	s.full()
	check("full sync", mapRule("0"), "{ 0 : 198.18.129.10 . 8080 }", "{ 1 : 198.18.130.12 . 8080 }")
	runPacketFlowTests(t, s.rs, hostA, []packetFlowTest{
		{name: "renumbered", src: localPod, iif: podIIF, dst: "198.19.0.11:80", output: "198.18.129.10:8080, 198.18.130.12:8080"},
	})

	// Down to one endpoint: a plain DNAT rule, and the map, which no
	// other service port of the example uses, goes with the clean-up;
	// two endpoints again declare it anew.
	s.now = s.now.Add(time.Second)
	s.apply(&model.FamilyDelta{Endpoints: map[model.ServicePortName][]*model.Endpoint{web: {eps[0]}}})
	s.now = s.now.Add(staleDelay)
	p = s.partial()
	if p.Cleanup == nil || !strings.Contains(p.Cleanup.String(), "delete map ip "+shard+" "+m+"\n") {
		t.Fatalf("clean-up: want %s deleted, got:\n%v", m, p.Cleanup)
	}
	s.now = s.now.Add(time.Second)
	p = s.apply(&model.FamilyDelta{Endpoints: map[model.ServicePortName][]*model.Endpoint{web: {eps[0], &third}}})
	if !slices.Contains(opTexts(p), "add map ip "+shard+" "+m+" { typeof numgen random mod 1 : ip daddr . tcp dport ; }") {
		t.Errorf("map used again: not declared:\n%s", p.Tx)
	}
	check("map again", mapRule("0"), "{ 0 : 198.18.129.10 . 8080 }", "{ 1 : 198.18.130.12 . 8080 }")
	s.checkLikeFull("map again")
}
