package nft

import (
	"net/netip"
	"time"

	v1 "k8s.io/api/core/v1"
)

// SampleAddrs are the addresses Sample uses for one family.
type SampleAddrs struct {
	Fam                          Family
	Svc1, Svc2, Pod1, Pod2, Node netip.Addr
	PodNet, NodeNet, Odd, Client netip.Prefix
	ClientAdj, Top, Zero         netip.Prefix
}

// SampleAddrsFor returns the sample addresses of a family.
func SampleAddrsFor(f Family) SampleAddrs {
	if f == IPv6 {
		return SampleAddrs{
			Fam:  IPv6,
			Svc1: netip.MustParseAddr("fd00:96::1"), Svc2: netip.MustParseAddr("fd00:96::2"),
			Pod1: netip.MustParseAddr("fd00:244::11"), Pod2: netip.MustParseAddr("fd00:244::12"),
			Node:   netip.MustParseAddr("fd00:192::10"),
			PodNet: netip.MustParsePrefix("fd00:244::/64"), NodeNet: netip.MustParsePrefix("fd00:192::/48"),
			Odd:       netip.MustParsePrefix("fd00:100::/36"),
			Client:    netip.MustParsePrefix("2001:db8::/33"),
			ClientAdj: netip.MustParsePrefix("2001:db8:8000::/33"),
			Top:       netip.MustParsePrefix("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ff00/120"),
			Zero:      netip.MustParsePrefix("::/8"),
		}
	}
	return SampleAddrs{
		Fam:  IPv4,
		Svc1: netip.MustParseAddr("10.96.0.1"), Svc2: netip.MustParseAddr("10.96.0.2"),
		Pod1: netip.MustParseAddr("10.244.1.11"), Pod2: netip.MustParseAddr("10.244.2.12"),
		Node:   netip.MustParseAddr("192.168.0.10"),
		PodNet: netip.MustParsePrefix("10.244.0.0/16"), NodeNet: netip.MustParsePrefix("192.168.0.0/16"),
		Odd:       netip.MustParsePrefix("10.16.0.0/12"),
		Client:    netip.MustParsePrefix("203.0.113.0/25"),
		ClientAdj: netip.MustParsePrefix("203.0.113.128/25"),
		Top:       netip.MustParsePrefix("255.255.255.0/24"),
		Zero:      netip.MustParsePrefix("0.0.0.0/8"),
	}
}

func singlePrefix(a netip.Addr) netip.Prefix { return netip.PrefixFrom(a, a.BitLen()) }

// SampleTable is the table Sample's transaction writes.
const SampleTable = "kproxy-test"

// Sample builds a transaction using every statement type and every
// kind of set and map, laid out the way the kernel accepts them (NAT
// statements only reachable from NAT base chains, reject only from
// filter hooks).
//
// It is the one list of everything the object model can express: the
// text form, the parser, the netlink encoder (against the kernel and
// against nft -f), the fake and the tracer are each tested on it, so a
// new statement type added here is checked by all of them.
func Sample(a SampleAddrs) *Transaction {
	tx := NewTransaction(a.Fam, SampleTable)
	tx.Add(&Table{Comment: "rules for kproxy tests"})
	tx.Add(
		&Chain{Name: "nat-prerouting", Type: TypeNAT, Hook: HookPrerouting, Priority: PriorityDstNAT},
		&Chain{Name: "nat-output", Type: TypeNAT, Hook: HookOutput, Priority: PriorityDstNAT},
		&Chain{Name: "nat-postrouting", Type: TypeNAT, Hook: HookPostrouting, Priority: PrioritySrcNAT},
		&Chain{Name: "filter-input", Type: TypeFilter, Hook: HookInput, Priority: PriorityDstNAT - 10},
		&Chain{Name: "filter-forward", Type: TypeFilter, Hook: HookForward, Priority: PriorityDstNAT - 10, Comment: "forward filter"},
		&Chain{Name: "services"},
		&Chain{Name: "masquerading"},
		&Chain{Name: "mark-for-masquerade", Comment: "marks packets"},
		&Chain{Name: "service-1", Comment: "ns1/svc1:http"},
		&Chain{Name: "endpoint-1"},
		&Chain{Name: "endpoint-2"},
		&Chain{Name: "firewall-1"},
		&Chain{Name: "reject-chain"},
		&Chain{Name: "misc"},
	)
	addr := AddrType(a.Fam)
	tx.Add(
		&Set{Name: "cluster-ips", Key: []DataType{addr}, Comment: "Active ClusterIPs"},
		&Set{Name: "nodeport-ips", Key: []DataType{addr}, Interval: true},
		&Set{Name: "zero-ips", Key: []DataType{addr}, Interval: true},
		&Set{Name: "ports", Key: []DataType{TypeInetService}},
		&Set{Name: "protos", Key: []DataType{TypeInetProto}},
		&Set{Name: "triples", Key: []DataType{addr, TypeInetProto, TypeInetService}},
		&Set{Name: "affinity-1", Key: []DataType{addr}, Dynamic: true, Timeout: 3 * time.Hour},
		&Set{Name: "service-ips", Key: []DataType{addr, TypeInetProto, TypeInetService}, Data: TypeVerdict, Comment: "ClusterIP, ExternalIP and LoadBalancer IP traffic"},
		&Set{Name: "service-nodeports", Key: []DataType{TypeInetProto, TypeInetService}, Data: TypeVerdict},
		&Set{Name: "no-endpoint-services", Key: []DataType{addr, TypeInetProto, TypeInetService}, Data: TypeVerdict},
		&Set{Name: "no-endpoint-nodeports", Key: []DataType{TypeInetProto, TypeInetService}, Data: TypeVerdict},
		&Set{Name: "firewall-ips", Key: []DataType{addr}, Data: TypeVerdict, Interval: true},
		&Set{Name: "by-addr", Key: []DataType{addr}, Data: TypeVerdict, Timeout: 10 * time.Second},
		&Set{Name: "hairpin", Key: []DataType{addr, addr}},
	)
	tx.Add(
		&Element{Set: "cluster-ips", Key: []Value{{Addr: a.Svc1}}},
		&Element{Set: "cluster-ips", Key: []Value{{Addr: a.Svc2}}, Comment: "second"},
		&Element{Set: "nodeport-ips", Key: []Value{{Prefix: a.NodeNet}}},
		&Element{Set: "nodeport-ips", Key: []Value{{Addr: a.Svc1}}, Comment: "one address"},
		&Element{Set: "nodeport-ips", Key: []Value{{Prefix: a.Top}}},
		&Element{Set: "zero-ips", Key: []Value{{Prefix: a.Zero}}},
		&Element{Set: "zero-ips", Key: []Value{{Prefix: a.PodNet}}},
		&Element{Set: "ports", Key: []Value{{Port: 80}}},
		&Element{Set: "ports", Key: []Value{{Port: 65535}}},
		&Element{Set: "protos", Key: []Value{{Proto: v1.ProtocolSCTP}}},
		&Element{Set: "triples", Key: []Value{{Addr: a.Svc1}, {Proto: v1.ProtocolUDP}, {Port: 53}}},
		&Element{Set: "service-ips", Key: []Value{{Addr: a.Svc1}, {Proto: v1.ProtocolTCP}, {Port: 80}}, Verdict: &Verdict{Kind: Goto, Chain: "service-1"}, Comment: "ns1/svc1:http"},
		&Element{Set: "service-ips", Key: []Value{{Addr: a.Svc2}, {Proto: v1.ProtocolUDP}, {Port: 53}}, Verdict: &Verdict{Kind: Jump, Chain: "service-1"}},
		&Element{Set: "service-nodeports", Key: []Value{{Proto: v1.ProtocolTCP}, {Port: 30080}}, Verdict: &Verdict{Kind: Goto, Chain: "service-1"}},
		&Element{Set: "service-nodeports", Key: []Value{{Proto: v1.ProtocolSCTP}, {Port: 30081}}, Verdict: &Verdict{Kind: Drop}},
		&Element{Set: "no-endpoint-services", Key: []Value{{Addr: a.Svc2}, {Proto: v1.ProtocolTCP}, {Port: 81}}, Verdict: &Verdict{Kind: Goto, Chain: "reject-chain"}, Comment: "ns1/svc2:http has no endpoints"},
		&Element{Set: "no-endpoint-nodeports", Key: []Value{{Proto: v1.ProtocolUDP}, {Port: 30053}}, Verdict: &Verdict{Kind: Goto, Chain: "reject-chain"}},
		&Element{Set: "firewall-ips", Key: []Value{{Prefix: a.NodeNet}}, Verdict: &Verdict{Kind: Goto, Chain: "firewall-1"}, Comment: "LB range"},
		&Element{Set: "firewall-ips", Key: []Value{{Addr: a.Svc2}}, Verdict: &Verdict{Kind: Accept}},
		&Element{Set: "by-addr", Key: []Value{{Addr: a.Pod1}}, Verdict: &Verdict{Kind: Return}},
		&Element{Set: "hairpin", Key: []Value{{Addr: a.Pod1}, {Addr: a.Pod1}}},
	)
	rules := []*Rule{
		{Chain: "nat-prerouting", Stmts: []Stmt{Verdict{Kind: Jump, Chain: "services"}}},
		{Chain: "nat-output", Stmts: []Stmt{Verdict{Kind: Jump, Chain: "services"}}},
		{Chain: "nat-postrouting", Stmts: []Stmt{Verdict{Kind: Jump, Chain: "masquerading"}}, Comment: "masquerade marked packets"},
		{Chain: "filter-input", Stmts: []Stmt{MatchCtStateNew{}, VmapLookup{Fields: []Field{FieldDaddr, FieldL4Proto, FieldDport}, Map: "no-endpoint-services"}}},
		{Chain: "filter-forward", Stmts: []Stmt{MatchCtStateNew{}, Counter{}, VmapLookup{Fields: []Field{FieldDaddr}, Map: "firewall-ips"}}},
		{Chain: "filter-forward", Stmts: []Stmt{MatchAddr{Set: "nodeport-ips"}, VmapLookup{Fields: []Field{FieldL4Proto, FieldDport}, Map: "no-endpoint-nodeports"}}},
		{Chain: "filter-forward", Stmts: []Stmt{VmapLookup{Fields: []Field{FieldSaddr}, Map: "by-addr"}}},
		{Chain: "masquerading", Stmts: []Stmt{MatchInSet{Fields: []Field{FieldSaddr, FieldDaddr}, Set: "hairpin"}, Masquerade{}}},
		{Chain: "masquerading", Stmts: []Stmt{MatchMarkZero{Mask: 0x4000}, Verdict{Kind: Return}}},
		{Chain: "masquerading", Stmts: []Stmt{SetMarkXor{Mask: 0x4000}}},
		{Chain: "masquerading", Stmts: []Stmt{Masquerade{}}},
		{Chain: "services", Stmts: []Stmt{VmapLookup{Fields: []Field{FieldDaddr, FieldL4Proto, FieldDport}, Map: "service-ips"}}},
		{Chain: "services", Stmts: []Stmt{MatchFibLocal{}, VmapLookup{Fields: []Field{FieldL4Proto, FieldDport}, Map: "service-nodeports"}}},
		{Chain: "mark-for-masquerade", Stmts: []Stmt{SetMarkOr{Mask: 0x4000}}},
		{Chain: "service-1", Stmts: []Stmt{MatchAddr{Source: true, Negate: true, Prefixes: []netip.Prefix{a.PodNet}}, MatchAddr{Prefixes: []netip.Prefix{singlePrefix(a.Svc1)}}, MatchDport{Proto: v1.ProtocolTCP, Port: 80}, Verdict{Kind: Jump, Chain: "mark-for-masquerade"}}},
		{Chain: "service-1", Stmts: []Stmt{NumgenVmap{Chains: []string{"endpoint-1", "endpoint-2"}}}, Comment: "2 endpoints"},
		{Chain: "service-1", Stmts: []Stmt{MatchNumgen{Mod: 3, Value: 0}, UpdateSaddr{Set: "affinity-1"}, DNAT{Proto: v1.ProtocolTCP, To: netip.AddrPortFrom(a.Pod1, 8080)}}},
		{Chain: "endpoint-1", Stmts: []Stmt{MatchAddr{Source: true, Prefixes: []netip.Prefix{singlePrefix(a.Pod1)}}, Verdict{Kind: Jump, Chain: "mark-for-masquerade"}}},
		{Chain: "endpoint-1", Stmts: []Stmt{UpdateSaddr{Set: "affinity-1"}}},
		{Chain: "endpoint-1", Stmts: []Stmt{DNAT{Proto: v1.ProtocolTCP, To: netip.AddrPortFrom(a.Pod1, 8080)}}},
		{Chain: "endpoint-2", Stmts: []Stmt{DNAT{Proto: v1.ProtocolUDP, To: netip.AddrPortFrom(a.Pod2, 53)}}},
		{Chain: "firewall-1", Stmts: []Stmt{MatchAddr{Source: true, Negate: true, Prefixes: []netip.Prefix{a.Client, a.ClientAdj, singlePrefix(a.Node), a.PodNet}}, Verdict{Kind: Drop}}},
		{Chain: "firewall-1", Stmts: []Stmt{MatchAddr{Prefixes: []netip.Prefix{singlePrefix(a.Svc1), singlePrefix(a.Svc2)}}, Verdict{Kind: Accept}}},
		{Chain: "reject-chain", Stmts: []Stmt{Reject{}}, Comment: "reject traffic to services without endpoints"},
		{Chain: "misc", Stmts: []Stmt{MatchIifname{Name: "eth", Prefix: true}, MatchIifname{Negate: true, Name: "lo"}, MatchIifname{Negate: true, Name: "veth", Prefix: true}, MatchIifname{Name: "eth0"}, Counter{}}},
		{Chain: "misc", Stmts: []Stmt{MatchFibLocal{Source: true}, MatchAddr{Negate: true, Prefixes: []netip.Prefix{singlePrefix(a.Svc1)}}, MatchAddr{Prefixes: []netip.Prefix{a.Odd}}, Verdict{Kind: Goto, Chain: "endpoint-2"}}},
		{Chain: "misc", Stmts: []Stmt{MatchAddr{Source: true, Prefixes: []netip.Prefix{netip.PrefixFrom(a.Svc1, 0).Masked()}}, MatchAddr{Set: "cluster-ips", Negate: true}, MatchL4Proto{Proto: v1.ProtocolSCTP}, Verdict{Kind: Accept}}},
		{Chain: "misc", Stmts: []Stmt{MatchL4Proto{Proto: v1.ProtocolUDP}, MatchDport{Proto: v1.ProtocolUDP, Port: 53}, Verdict{Kind: Return}}},
		{Chain: "misc", Stmts: []Stmt{MatchDport{Proto: v1.ProtocolSCTP, Port: 9}, MatchAddr{Set: "cluster-ips"}, Verdict{Kind: Drop}}},
		{Chain: "misc", Stmts: []Stmt{MatchAddr{Source: true, Prefixes: []netip.Prefix{singlePrefix(a.Pod1), singlePrefix(a.Pod2), singlePrefix(a.Pod1)}}, Verdict{Kind: Drop}}},
	}
	for _, r := range rules {
		tx.Add(r)
	}
	// Endpoint maps last, so that the bytes of everything above stay as
	// they were before they existed (TestLowerWire).
	tx.Add(&Chain{Name: "service-2"}, &Set{Name: "endpoints-0", Endpoints: v1.ProtocolTCP}, &Set{Name: "endpoints-1", Endpoints: v1.ProtocolSCTP},
		&Set{Name: "endpoints-2", Endpoints: v1.ProtocolUDP})
	tx.Add(
		&Rule{Chain: "service-2", Stmts: []Stmt{DNATMap{Proto: v1.ProtocolTCP, Mod: 2, Offset: 0, Map: "endpoints-0"}}},
		&Rule{Chain: "service-2", Stmts: []Stmt{MatchAddr{Source: true, Prefixes: []netip.Prefix{singlePrefix(a.Pod1)}}, DNATMap{Proto: v1.ProtocolSCTP, Mod: 3, Offset: 4294967292, Map: "endpoints-1"}}, Comment: "3 endpoints"},
		&Element{Set: "endpoints-0", Index: 0, To: netip.AddrPortFrom(a.Pod1, 8080)},
		&Element{Set: "endpoints-0", Index: 1, To: netip.AddrPortFrom(a.Pod2, 80)},
		&Element{Set: "endpoints-1", Index: 4294967292, To: netip.AddrPortFrom(a.Pod2, 65535)},
		&Element{Set: "endpoints-1", Index: 4294967293, To: netip.AddrPortFrom(a.Pod1, 1)},
		&Element{Set: "endpoints-1", Index: 4294967294, To: netip.AddrPortFrom(a.Pod1, 9)},
	)
	// Endpoint maps keyed by service, and the chains sharing them, after
	// everything else for the same reason.
	tx.Add(&Chain{Name: "cluster-tcp-2"}, &Chain{Name: "cluster-udp-1"},
		&Set{Name: "cluster-endpoints-tcp", Endpoints: v1.ProtocolTCP, ByService: true},
		&Set{Name: "cluster-endpoints-udp", Endpoints: v1.ProtocolUDP, ByService: true},
		&Set{Name: "cluster-endpoints-sctp", Endpoints: v1.ProtocolSCTP, ByService: true})
	tx.Add(
		&Rule{Chain: "cluster-tcp-2", Stmts: []Stmt{MatchAddr{Source: true, Negate: true, Prefixes: []netip.Prefix{a.PodNet}}, SetMarkOr{Mask: 0x4000}}},
		&Rule{Chain: "cluster-tcp-2", Stmts: []Stmt{DNATByService{Proto: v1.ProtocolTCP, Mod: 2, Map: "cluster-endpoints-tcp"}}},
		&Rule{Chain: "cluster-udp-1", Stmts: []Stmt{DNATByService{Proto: v1.ProtocolUDP, Mod: 1, Map: "cluster-endpoints-udp"}}, Comment: "1 endpoint"},
		&Element{Set: "service-ips", Key: []Value{{Addr: a.Svc1}, {Proto: v1.ProtocolTCP}, {Port: 8080}}, Verdict: &Verdict{Kind: Goto, Chain: "cluster-tcp-2"}},
		&Element{Set: "cluster-endpoints-tcp", Key: []Value{{Addr: a.Svc1}, {Port: 8080}}, Index: 0, To: netip.AddrPortFrom(a.Pod1, 80)},
		&Element{Set: "cluster-endpoints-tcp", Key: []Value{{Addr: a.Svc1}, {Port: 8080}}, Index: 1, To: netip.AddrPortFrom(a.Pod2, 65535)},
		&Element{Set: "cluster-endpoints-udp", Key: []Value{{Addr: a.Svc2}, {Port: 53}}, Index: 0, To: netip.AddrPortFrom(a.Pod2, 5353)},
		&Element{Set: "cluster-endpoints-sctp", Key: []Value{{Addr: a.Svc2}, {Port: 65535}}, Index: 4294967295, To: netip.AddrPortFrom(a.Pod1, 1)},
	)
	return tx
}
