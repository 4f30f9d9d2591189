package nftables

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/kernel/nft"
	"github.com/kproxy/kproxy/internal/trace"
)

func TestParseErrors(t *testing.T) {
	const head = "add table ip t\nadd chain ip t c\n" // lines 1-2
	for _, tc := range []struct {
		name     string
		text     string
		wantLine int
		wantErr  string
	}{
		{"unknown verb", "list table ip t", 1, `expected add or insert`},
		{"unknown object", "add flowtable ip t f", 1, `expected table or chain`},
		{"unsupported family", "add table inet t", 1, `unsupported family "inet"`},
		{"table flags", "add table ip t { flags dormant ; }", 1, `unsupported table attribute "flags"`},
		{"unknown statement", head + "add rule ip t c log prefix \"x\"", 3, `unsupported statement "log"`},
		{"unknown statement after blank lines", head + "\n\n  \nadd rule ip t c tcp dport 80 limit rate 1/second drop", 6, `unsupported statement "limit"`},
		{"ct state other than new", head + "add rule ip t c ct state established accept", 3, "only ct state new"},
		{"ip6 keyword in an ip table", head + "add rule ip t c ip6 daddr fd00::1 drop", 3, `"ip6" match in a table of family ip`},
		{"IPv6 address in an ip table", head + "add rule ip t c ip daddr fd00::1 drop", 3, "address fd00::1 in a table of family ip"},
		{"bad address", head + "add rule ip t c ip daddr 10.0.0.300 drop", 3, `invalid address "10.0.0.300"`},
		{"statement after a verdict", head + "add rule ip t c accept drop", 3, `statement "drop" after a verdict`},
		{"text after the comment", head + "add rule ip t c accept comment \"x\" drop", 3, "after comment"},
		{"mark compared to non-zero", head + "add rule ip t c meta mark & 0x4000 == 0x4000 drop", 3, "only meta mark & MASK == 0"},
		{"numgen branch missing", head + "add chain ip t a\nadd rule ip t c numgen random mod 3 vmap { 0 : goto a, 1 : goto a }", 4, "numgen index 2 has no branch"},
		{"numgen branch that is not a goto", head + "add chain ip t a\nadd rule ip t c numgen random mod 1 vmap { 0 : jump a }", 4, "numgen branches must goto"},
		{"inline vmap", head + "add rule ip t c ip daddr vmap { 10.0.0.1 : drop }", 3, "only named verdict maps"},
		{"dnat map rule of another protocol", head + "add map ip t m { typeof numgen random mod 1 : ip daddr . udp dport ; }\nadd rule ip t c meta l4proto tcp dnat ip to numgen random mod 2 offset 0 map @m", 4, "map m holds UDP endpoints, the rule DNATs TCP"},
		{"endpoint map element of the other family", head + "add map ip t m { typeof numgen random mod 1 : ip daddr . udp dport ; }\nadd element ip t m { 1 : fd00::1 . 80 }", 4, `bad address "fd00::1"`},
		{"service dnat rule on an unkeyed endpoint map", head + "add map ip t m { typeof numgen random mod 1 : ip daddr . tcp dport ; }\nadd rule ip t c meta l4proto tcp dnat ip to ip daddr . th dport . numgen random mod 2 map @m", 4, "m is not an endpoint map keyed by service"},
		{"dnat map rule on a keyed endpoint map", head + "add map ip t m { typeof ip daddr . tcp dport . numgen random mod 1 : ip daddr . tcp dport ; }\nadd rule ip t c meta l4proto tcp dnat ip to numgen random mod 2 map @m", 4, "m is an endpoint map keyed by service"},
		{"keyed endpoint map element without the service", head + "add map ip t m { typeof ip daddr . tcp dport . numgen random mod 1 : ip daddr . tcp dport ; }\nadd element ip t m { 1 : 10.0.0.1 . 80 }", 4, `bad service address "1"`},
		{"keyed endpoint map of two protocols", head + "add map ip t m { typeof ip daddr . tcp dport . numgen random mod 1 : ip daddr . udp dport ; }", 3, `keyed by tcp ports maps to udp ports`},
		{"th dport as a match", head + "add rule ip t c th dport 80 drop", 3, "th dport is only supported as a map lookup key"},
		{"dnat without a port", head + "add rule ip t c meta l4proto tcp dnat to 10.0.0.1", 3, "invalid dnat destination"},
		{"IPv4 dnat in an ip6 table", "add table ip6 t\nadd chain ip6 t c\nadd rule ip6 t c meta l4proto tcp dnat to 10.0.0.1:80", 3, "in a table of family ip6"},
		{"unterminated quote", head + "add rule ip t c accept comment \"x", 3, "unterminated"},
		{"rule in a missing chain", head + "add rule ip t nope accept", 3, "chain nope does not exist"},
		{"missing table", "add chain ip t c", 1, "table ip t does not exist"},
		{"jump to a missing chain (checked at commit)", head + "add rule ip t c jump nope\nadd chain ip t other", 3, `jump to chain "nope", which does not exist`},
		{"goto a base chain", head + "add chain ip t b { type filter hook input priority 0 ; }\nadd rule ip t c goto b", 4, "goto to base chain b"},
		{"lookup in a missing map", head + "add rule ip t c ip daddr . meta l4proto . th dport vmap @m", 3, "map m does not exist"},
		{"lookup key of the wrong shape", head + "add map ip t m { type inet_proto . inet_service : verdict ; }\nadd rule ip t c ip daddr . th dport vmap @m", 4, "map m has key [inet_proto inet_service], the lookup gives [ipv4_addr inet_service]"},
		{"map element without a verdict", head + "add map ip t m { type ipv4_addr : verdict ; }\nadd element ip t m { 10.0.0.1 }", 4, "without a verdict"},
		{"set element with a verdict", head + "add set ip t s { type ipv4_addr ; }\nadd element ip t s { 10.0.0.1 : drop }", 4, "element with a value"},
		{"prefix in a set without interval", head + "add set ip t s { type ipv4_addr ; }\nadd element ip t s { 10.0.0.0/8 }", 4, "without flags interval"},
		{"element key too short", head + "add map ip t m { type ipv4_addr . inet_proto . inet_service : verdict ; }\nadd element ip t m { 10.0.0.1 . tcp : drop }", 4, "key of \"m\" has 3 fields"},
		{"element of the wrong family", head + "add set ip t s { type ipv4_addr ; }\nadd element ip t s { fd00::1 }", 4, "is not an ipv4_addr"},
		{"element verdict to a missing chain", head + "add map ip t m { type inet_proto . inet_service : verdict ; }\nadd element ip t m { tcp . 80 : goto nope }", 4, `goto to chain "nope", which does not exist`},
		{"unsupported set type", head + "add set ip t s { type ether_addr ; }", 3, `unsupported data type "ether_addr"`},
		{"set declared with a value type", head + "add set ip t s { type ipv4_addr : verdict ; }", 3, "use map"},
		{"unknown chain attribute", head + "add chain ip t b { type filter hook input priority 0 ; device eth0 ; }", 3, `unknown chain attribute "device"`},
		{"unsupported hook", head + "add chain ip t b { type filter hook ingress priority 0 ; }", 3, `unsupported hook "ingress"`},
		{"base chain moved to another hook", head + "add chain ip t b { type filter hook input priority 0 ; }\nadd chain ip t b { type filter hook output priority 0 ; }", 4, "different type, hook or priority"},
		{"delete a chain still jumped to", head + "add chain ip t a\nadd rule ip t c jump a\ndelete chain ip t a", 5, "chain a is still used by a rule in chain c"},
		{"delete a chain still in a map", head + "add map ip t m { type inet_proto . inet_service : verdict ; }\nadd element ip t m { tcp . 80 : goto c }\ndelete chain ip t c", 5, "chain c is still used by an element of map m"},
		{"delete a set still used", head + "add set ip t s { type ipv4_addr ; }\nadd rule ip t c ip saddr @s drop\ndelete set ip t s", 5, "set s is still used by a rule in chain c"},
		{"delete a missing element", head + "add set ip t s { type ipv4_addr ; }\ndelete element ip t s { 10.0.0.1 }", 4, "element 10.0.0.1 does not exist"},
		{"delete a rule that is not there", head + "delete rule ip t c tcp dport 22 drop", 3, "no such rule"},
		{"delete a missing handle", head + "delete rule ip t c handle 7", 3, "no rule with handle 7"},
		{"flush a missing chain", head + "flush chain ip t nope", 3, "chain nope does not exist"},
		{"create an existing chain", head + "create chain ip t c", 3, "chain c exists"},
		{"create an existing element", head + "add set ip t s { type ipv4_addr ; }\nadd element ip t s { 10.0.0.1 }\ncreate element ip t s { 10.0.0.1 }", 5, "element 10.0.0.1 exists"},
		{"set redefined with another type", head + "add set ip t s { type ipv4_addr ; }\nadd set ip t s { type ipv6_addr ; }", 4, "set s exists with a different definition"},
		{"address match on a set of ports", head + "add set ip t s { type inet_service ; }\nadd rule ip t c ip saddr @s drop", 4, "set s does not have ipv4_addr keys"},
		{"numgen index given twice", head + "add chain ip t a\nadd rule ip t c numgen random mod 2 vmap { 0 : goto a, 0 : goto a }", 4, "numgen index 0 given twice"},
		{"lookup on an unsupported field", head + "add rule ip t c ip daddr . tcp dport vmap @m", 3, `unsupported lookup field "tcp"`},
		// What nft -f refuses because the kernel does (nftstate's checks).
		{"element re-added with another verdict", head + "add map ip t m { type ipv4_addr : verdict ; }\nadd element ip t m { 10.0.0.1 : accept }\nadd element ip t m { 10.0.0.1 : drop }", 5, "element 10.0.0.1 exists with a different verdict"},
		{"flush set on a map", head + "add map ip t m { type ipv4_addr : verdict ; }\nflush set ip t m", 4, "m is a map; flush it as one"},
		{"jump loop", head + "add chain ip t base { type filter hook prerouting priority 0 ; }\nadd chain ip t a\nadd rule ip t base jump a\nadd rule ip t a jump c\nadd rule ip t c jump a", 7, "chain loop: base -> a -> c -> a"},
		{"goto loop", head + "add chain ip t base { type filter hook prerouting priority 0 ; }\nadd rule ip t base goto c\nadd rule ip t c goto c", 5, "chain loop: base -> c -> c"},
		{"dnat in a filter chain", head + "add chain ip t f { type filter hook prerouting priority 0 ; }\nadd rule ip t c meta l4proto tcp dnat to 10.1.0.1:80\nadd rule ip t f jump c", 4, "dnat in chain c is reachable from base chain f (filter hook prerouting)"},
		{"masquerade in a prerouting nat chain", head + "add chain ip t n { type nat hook prerouting priority -100 ; }\nadd rule ip t n masquerade", 4, "masquerade in chain n is reachable from base chain n (nat hook prerouting)"},
		{"dnat in postrouting", head + "add chain ip t n { type nat hook postrouting priority 100 ; }\nadd rule ip t n meta l4proto tcp dnat to 10.1.0.1:80", 4, "dnat in chain n is reachable from base chain n (nat hook postrouting)"},
		{"comment longer than nft keeps", head + "add rule ip t c accept comment \"" + strings.Repeat("x", nft.MaxCommentLen+1) + "\"", 3, "comment of 129 bytes"},
		{"update keyed on the destination", head + "add rule ip t c update @s { ip daddr }", 3, "only update @set { ip saddr }"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseNFT(tc.text)
			var pe *trace.ParseError
			if !errors.As(err, &pe) {
				t.Fatalf("got %v, want a *trace.ParseError", err)
			}
			if pe.Line != tc.wantLine || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("got line %d %q, want line %d containing %q", pe.Line, err, tc.wantLine, tc.wantErr)
			}
			lines := strings.Split(tc.text, "\n")
			if want := strings.TrimSpace(lines[tc.wantLine-1]); pe.Text != want {
				t.Errorf("error text %q, want the line %q", pe.Text, want)
			}
		})
	}
}

func TestApplyIsAtomic(t *testing.T) {
	r, err := ParseNFT(join(baseV4, svcA))
	if err != nil {
		t.Fatal(err)
	}
	before := r.String()
	err = r.Apply("flush chain ip kube-proxy services\ndelete element ip kube-proxy service-ips { 10.96.0.10 . tcp . 80 }\nadd rule ip kube-proxy services bogus")
	var pe *trace.ParseError
	if !errors.As(err, &pe) || pe.Line != 3 {
		t.Fatalf("got %v, want a parse error on line 3", err)
	}
	if diff := cmp.Diff(before, r.String()); diff != "" {
		t.Errorf("a failed Apply changed the ruleset (-before +after):\n%s", diff)
	}
	res, err := r.Trace(pkt(tcp, "10.180.1.7:40000", "10.96.0.10:80", "cali1"), node4)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(res.Outcomes); n != 3 {
		t.Errorf("after a failed Apply: %d outcomes, want 3", n)
	}
}

// TestRoundTrip renders every statement kind with the nft package and
// checks that parsing its text and dumping the result gives the same text.
func TestRoundTrip(t *testing.T) {
	p4 := netip.MustParsePrefix
	a := netip.MustParseAddr
	tx4 := nft.NewTransaction(nft.IPv4, "kube-proxy")
	tx4.Add(
		&nft.Table{Comment: "rules for kube-proxy"},
		&nft.Chain{Name: "filter-input", Type: nft.TypeFilter, Hook: nft.HookInput, Priority: nft.PriorityDstNAT - 10},
		&nft.Chain{Name: "nat-postrouting", Type: nft.TypeNAT, Hook: nft.HookPostrouting, Priority: nft.PrioritySrcNAT, Comment: "masquerade"},
		&nft.Chain{Name: "nat-prerouting", Type: nft.TypeNAT, Hook: nft.HookPrerouting, Priority: nft.PriorityDstNAT},
		&nft.Chain{Name: "svc", Comment: "a service"},
		&nft.Chain{Name: "ep-1"},
		&nft.Chain{Name: "ep-2"},
		&nft.Set{Name: "cluster-ips", Key: []nft.DataType{nft.TypeIPv4Addr}, Comment: "Active ClusterIPs"},
		&nft.Set{Name: "pods", Key: []nft.DataType{nft.TypeIPv4Addr}, Interval: true},
		&nft.Set{Name: "affinity-1", Key: []nft.DataType{nft.TypeIPv4Addr}, Dynamic: true, Timeout: 3 * time.Hour},
		&nft.Set{Name: "service-ips", Key: []nft.DataType{nft.TypeIPv4Addr, nft.TypeInetProto, nft.TypeInetService}, Data: nft.TypeVerdict},
		&nft.Set{Name: "fw", Key: []nft.DataType{nft.TypeIPv4Addr, nft.TypeInetProto, nft.TypeInetService}, Data: nft.TypeVerdict, Interval: true},
		&nft.Element{Set: "cluster-ips", Key: []nft.Value{{Addr: a("10.96.0.10")}}},
		&nft.Element{Set: "pods", Key: []nft.Value{{Prefix: p4("10.180.0.0/16")}}, Comment: "cluster CIDR"},
		&nft.Element{Set: "pods", Key: []nft.Value{{Addr: a("10.0.0.7")}}},
		&nft.Element{Set: "service-ips", Key: []nft.Value{{Addr: a("10.96.0.10")}, {Proto: v1.ProtocolTCP}, {Port: 80}}, Comment: "ns/a:http", Verdict: &nft.Verdict{Kind: nft.Goto, Chain: "svc"}},
		&nft.Element{Set: "service-ips", Key: []nft.Value{{Addr: a("10.96.0.11")}, {Proto: v1.ProtocolUDP}, {Port: 53}}, Verdict: &nft.Verdict{Kind: nft.Jump, Chain: "svc"}},
		&nft.Element{Set: "service-ips", Key: []nft.Value{{Addr: a("10.96.0.12")}, {Proto: v1.ProtocolSCTP}, {Port: 9}}, Verdict: &nft.Verdict{Kind: nft.Drop}},
		&nft.Element{Set: "fw", Key: []nft.Value{{Prefix: p4("192.0.2.0/24")}, {Proto: v1.ProtocolTCP}, {Port: 443}}, Verdict: &nft.Verdict{Kind: nft.Accept}},
		&nft.Element{Set: "fw", Key: []nft.Value{{Addr: a("192.0.2.255")}, {Proto: v1.ProtocolTCP}, {Port: 80}}, Verdict: &nft.Verdict{Kind: nft.Return}},
		&nft.Rule{Chain: "filter-input", Stmts: []nft.Stmt{nft.MatchCtStateNew{}, nft.Verdict{Kind: nft.Jump, Chain: "ep-2"}}},
		&nft.Rule{Chain: "filter-input", Stmts: []nft.Stmt{nft.MatchIifname{Name: "cali", Prefix: true}, nft.Counter{}, nft.Verdict{Kind: nft.Return}}},
		&nft.Rule{Chain: "filter-input", Stmts: []nft.Stmt{nft.MatchIifname{Name: "eth0", Negate: true}, nft.MatchFibLocal{Source: true}, nft.Reject{}}},
		&nft.Rule{Chain: "filter-input", Stmts: []nft.Stmt{nft.MatchAddr{Prefixes: []netip.Prefix{p4("10.96.0.10/32")}}, nft.MatchDport{Proto: v1.ProtocolTCP, Port: 80}, nft.Verdict{Kind: nft.Accept}}},
		&nft.Rule{Chain: "filter-input", Stmts: []nft.Stmt{nft.MatchAddr{Source: true, Negate: true, Prefixes: []netip.Prefix{p4("10.180.0.0/16"), p4("10.0.0.1/32")}}, nft.MatchDport{Proto: v1.ProtocolSCTP, Port: 9}, nft.Verdict{Kind: nft.Drop}}, Comment: "not from pods"},
		&nft.Rule{Chain: "filter-input", Stmts: []nft.Stmt{nft.MatchAddr{Negate: true, Set: "cluster-ips"}, nft.MatchL4Proto{Proto: v1.ProtocolUDP}, nft.MatchDport{Proto: v1.ProtocolUDP, Port: 53}, nft.Verdict{Kind: nft.Drop}}},
		&nft.Rule{Chain: "filter-input", Stmts: []nft.Stmt{nft.VmapLookup{Fields: []nft.Field{nft.FieldSaddr, nft.FieldL4Proto, nft.FieldDport}, Map: "fw"}}},
		&nft.Rule{Chain: "nat-postrouting", Stmts: []nft.Stmt{nft.MatchMarkZero{Mask: 0x4000}, nft.Verdict{Kind: nft.Return}}},
		&nft.Rule{Chain: "nat-postrouting", Stmts: []nft.Stmt{nft.SetMarkXor{Mask: 0x4000}}},
		&nft.Rule{Chain: "nat-postrouting", Stmts: []nft.Stmt{nft.Masquerade{}}},
		&nft.Rule{Chain: "nat-prerouting", Stmts: []nft.Stmt{nft.MatchFibLocal{}, nft.VmapLookup{Fields: []nft.Field{nft.FieldDaddr, nft.FieldL4Proto, nft.FieldDport}, Map: "service-ips"}}},
		&nft.Rule{Chain: "svc", Stmts: []nft.Stmt{nft.MatchAddr{Source: true, Set: "affinity-1"}, nft.Verdict{Kind: nft.Goto, Chain: "ep-1"}}},
		&nft.Rule{Chain: "svc", Stmts: []nft.Stmt{nft.NumgenVmap{Chains: []string{"ep-1", "ep-2"}}}},
		&nft.Rule{Chain: "ep-1", Stmts: []nft.Stmt{nft.SetMarkOr{Mask: 0x4000}}},
		&nft.Rule{Chain: "ep-1", Stmts: []nft.Stmt{nft.UpdateSaddr{Set: "affinity-1"}}},
		&nft.Rule{Chain: "ep-1", Stmts: []nft.Stmt{nft.DNAT{Proto: v1.ProtocolTCP, To: netip.MustParseAddrPort("10.180.1.1:8080")}}},
	)
	tx6 := nft.NewTransaction(nft.IPv6, "kube-proxy")
	tx6.Add(
		&nft.Table{},
		&nft.Chain{Name: "nat-output", Type: nft.TypeNAT, Hook: nft.HookOutput, Priority: nft.PriorityDstNAT},
		&nft.Chain{Name: "ep"},
		&nft.Set{Name: "service-nodeports", Key: []nft.DataType{nft.TypeInetProto, nft.TypeInetService}, Data: nft.TypeVerdict},
		&nft.Set{Name: "nets", Key: []nft.DataType{nft.TypeIPv6Addr}, Interval: true},
		&nft.Element{Set: "service-nodeports", Key: []nft.Value{{Proto: v1.ProtocolTCP}, {Port: 30080}}, Verdict: &nft.Verdict{Kind: nft.Goto, Chain: "ep"}},
		&nft.Element{Set: "nets", Key: []nft.Value{{Prefix: netip.MustParsePrefix("fd00:180::/64")}}},
		&nft.Rule{Chain: "nat-output", Stmts: []nft.Stmt{nft.MatchAddr{Prefixes: []netip.Prefix{netip.MustParsePrefix("fd00:96::/112")}}, nft.VmapLookup{Fields: []nft.Field{nft.FieldL4Proto, nft.FieldDport}, Map: "service-nodeports"}}},
		&nft.Rule{Chain: "ep", Stmts: []nft.Stmt{nft.MatchAddr{Source: true, Set: "nets"}, nft.DNAT{Proto: v1.ProtocolUDP, To: netip.MustParseAddrPort("[fd00:180::1]:53")}}},
	)
	text := tx4.String() + tx6.String()
	r, err := ParseNFT(text)
	if err != nil {
		t.Fatalf("ParseNFT of the nft package's own text: %v\n%s", err, text)
	}
	if diff := cmp.Diff(text, r.String()); diff != "" {
		t.Errorf("round trip (-rendered +dumped):\n%s", diff)
	}
	// The dump parses again to the same dump.
	r2, err := ParseNFT(r.String())
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(r.String(), r2.String()); diff != "" {
		t.Errorf("second round trip (-first +second):\n%s", diff)
	}
}

// TestRenderedPartialSync runs a transaction built with the nft package's
// types through the parser, including the "delete rule" form text.go
// prints (the rule itself, no handle) and "flush map".
func TestRenderedPartialSync(t *testing.T) {
	full := nft.NewTransaction(nft.IPv4, "t")
	full.Add(
		&nft.Table{},
		&nft.Chain{Name: "pre", Type: nft.TypeNAT, Hook: nft.HookPrerouting, Priority: nft.PriorityDstNAT},
		&nft.Chain{Name: "ep"},
		&nft.Set{Name: "m", Key: []nft.DataType{nft.TypeInetProto, nft.TypeInetService}, Data: nft.TypeVerdict},
		&nft.Element{Set: "m", Key: []nft.Value{{Proto: v1.ProtocolTCP}, {Port: 80}}, Verdict: &nft.Verdict{Kind: nft.Goto, Chain: "ep"}},
		&nft.Rule{Chain: "pre", Stmts: []nft.Stmt{nft.VmapLookup{Fields: []nft.Field{nft.FieldL4Proto, nft.FieldDport}, Map: "m"}}},
		&nft.Rule{Chain: "ep", Stmts: []nft.Stmt{nft.DNAT{Proto: v1.ProtocolTCP, To: netip.MustParseAddrPort("10.1.0.1:80")}}},
	)
	partial := nft.NewTransaction(nft.IPv4, "t")
	partial.Delete(&nft.Rule{Chain: "ep", Stmts: []nft.Stmt{nft.DNAT{Proto: v1.ProtocolTCP, To: netip.MustParseAddrPort("10.1.0.1:80")}}})
	partial.Add(&nft.Rule{Chain: "ep", Stmts: []nft.Stmt{nft.DNAT{Proto: v1.ProtocolTCP, To: netip.MustParseAddrPort("10.1.0.2:80")}}})
	r, err := ParseNFT(full.String() + partial.String())
	if err != nil {
		t.Fatal(err)
	}
	p := pkt(tcp, "203.0.113.5:1000", "10.0.0.10:80", "eth0")
	res, err := r.Trace(p, node4)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{out("accept", "10.1.0.2:80", false, 1)}, summarize(res)); diff != "" {
		t.Errorf("after the partial sync (-want +got):\n%s", diff)
	}

	flush := nft.NewTransaction(nft.IPv4, "t")
	flush.Flush(&nft.Set{Name: "m", Data: nft.TypeVerdict}) // prints "flush map", as nft needs for a map
	flush.Delete(&nft.Chain{Name: "ep"})
	if err := r.Apply(flush.String()); err != nil {
		t.Fatalf("Apply(%q): %v", flush.String(), err)
	}
	res, err = r.Trace(p, node4)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{out("accept", "", false, 1)}, summarize(res)); diff != "" {
		t.Errorf("after the flush (-want +got):\n%s", diff)
	}
}

func TestChainPriorities(t *testing.T) {
	r, err := ParseNFT(`add table ip t
add chain ip t a { type filter hook prerouting priority dstnat - 10 ; }
add chain ip t b { type nat hook prerouting priority dstnat; policy accept; }
add chain ip t c { type filter hook output priority dstnat+10 ; comment "post dnat" ; }
add chain ip t d { type nat hook postrouting priority srcnat ; }
add chain ip t e { type filter hook input priority filter ; policy drop ; }
add set ip t s { type ipv4_addr ; flags dynamic,timeout ; timeout 3h ; size 65535 ; }
`)
	if err != nil {
		t.Fatal(err)
	}
	tb := r.state.Tables[0]
	got := map[string]int{}
	for _, n := range tb.ChainOrder {
		got[n] = tb.Chains[n].Def.Priority
	}
	if diff := cmp.Diff(map[string]int{"a": -110, "b": -100, "c": -90, "d": 100, "e": 0}, got); diff != "" {
		t.Errorf("priorities (-want +got):\n%s", diff)
	}
	if tb.Chains["e"].Policy != nft.Drop || tb.Chains["c"].Def.Comment != "post dnat" {
		t.Errorf("policy %q comment %q", tb.Chains["e"].Policy, tb.Chains["c"].Def.Comment)
	}
	if s := tb.Sets["s"].Def; !s.Dynamic || s.Timeout != 3*time.Hour {
		t.Errorf("set = %+v, want dynamic with a 3h timeout", s)
	}
	// The drop policy survives a dump.
	if !strings.Contains(r.String(), "add chain ip t e { type filter hook input priority 0 ; policy drop ; }") {
		t.Errorf("dump lost the drop policy:\n%s", r)
	}
}
