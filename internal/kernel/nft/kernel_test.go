package nft

// Kernel tests: they need root and the nft binary, and run every case in
// fresh network namespaces (kproxy-nfttest-<random>), deleted afterwards.
//
// Address ranges used below:
//   10.96.0.0/16, fd00:96::/112     service cluster IPs
//   10.244.0.0/16, fd00:244::/64    pod (endpoint) IPs
//   192.168.0.0/16, fd00:192::/48   node and load balancer addresses
//   203.0.113.0/24, 2001:db8::/32   external clients (source ranges)

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
)

// kernelNS is a network namespace created for one test.
type kernelNS struct {
	name string
	nl   *Netlink
	ex   *Exec
}

func requireKernel(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("kernel test: needs root to create network namespaces and program nf_tables")
	}
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("kernel test: the nft binary is not installed (apt-get install nftables)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("kernel test: the ip binary is not installed (iproute2)")
	}
}

func newKernelNS(t *testing.T) *kernelNS {
	t.Helper()
	requireKernel(t)
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	name := "kproxy-nfttest-" + hex.EncodeToString(rnd[:])
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	ns := &kernelNS{name: name}
	t.Cleanup(func() {
		if ns.nl != nil {
			_ = ns.nl.Close()
		}
		if out, err := exec.Command("ip", "netns", "delete", name).CombinedOutput(); err != nil {
			t.Errorf("ip netns delete %s: %v: %s", name, err, out)
		}
	})
	nl, err := NewNetlink(WithNetNSPath("/run/netns/" + name))
	if err != nil {
		t.Fatalf("NewNetlink: %v", err)
	}
	ns.nl = nl
	ex, err := NewExec("", WithCommandPrefix("ip", "netns", "exec", name))
	if err != nil {
		t.Fatalf("NewExec: %v", err)
	}
	ns.ex = ex
	return ns
}

func (ns *kernelNS) nft(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", append([]string{"netns", "exec", ns.name, "nft"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("nft %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// handles in `nft --debug=netlink list` rule headers: "ip t chain HANDLE [POSITION]".
var debugRuleHeader = regexp.MustCompile(`(?m)^((?:ip|ip6) \S+ \S+)( \d+)+$`)

// expires is the time left of elements in sets with timeouts.
var expires = regexp.MustCompile(` expires [0-9hmsd]+`)

// sortElementLines sorts the element lines of each set in a debug
// listing: hash sets iterate in an order that depends on a random seed.
func sortElementLines(s string) string {
	lines := strings.Split(s, "\n")
	for i := 0; i < len(lines); {
		j := i
		for j < len(lines) && strings.HasPrefix(lines[j], "\telement ") {
			j++
		}
		if j > i {
			slices.Sort(lines[i:j])
			i = j
		} else {
			i++
		}
	}
	return strings.Join(lines, "\n")
}

// state is everything we compare between two namespaces: nft's listing,
// its netlink-level listing (expressions, elements with their flags and
// user data) and the raw attributes of tables, chains and sets (flags,
// user data, chosen set backend), without handles.
func (ns *kernelNS) state(t *testing.T, fam Family, table string) (listing, debug, raw string) {
	t.Helper()
	listing = expires.ReplaceAllString(ns.nft(t, "list", "table", string(fam), table), "")
	debug = ns.nft(t, "--debug=netlink", "list", "table", string(fam), table)
	debug = sortElementLines(expires.ReplaceAllString(debugRuleHeader.ReplaceAllString(debug, "$1"), ""))
	raw = ns.rawState(t, fam)
	return
}

func (ns *kernelNS) rawState(t *testing.T, fam Family) string {
	t.Helper()
	c, err := ns.nl.dial()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	skip := map[uint16]map[uint16]bool{
		unix.NFT_MSG_GETTABLE: {4 /* NFTA_TABLE_HANDLE */ : true},
		unix.NFT_MSG_GETCHAIN: {unix.NFTA_CHAIN_HANDLE: true},
		unix.NFT_MSG_GETSET:   {16 /* NFTA_SET_HANDLE */ : true},
	}
	var b strings.Builder
	for _, m := range []uint16{unix.NFT_MSG_GETTABLE, unix.NFT_MSG_GETCHAIN, unix.NFT_MSG_GETSET} {
		replies, err := c.dump(context.Background(), m, nfproto(fam), nil)
		if err != nil {
			t.Fatalf("dump %d: %v", m, err)
		}
		for _, r := range replies {
			fmt.Fprintf(&b, "%d:", m)
			forEachAttr(r, func(typ uint16, data []byte) {
				if !skip[m][typ] {
					fmt.Fprintf(&b, " %d=%x", typ, data)
				}
			})
			b.WriteByte('\n')
		}
	}
	return b.String()
}

func compareStates(t *testing.T, step string, a, b *kernelNS, fam Family, table string) {
	t.Helper()
	la, da, ra := a.state(t, fam, table)
	lb, db, rb := b.state(t, fam, table)
	if d := cmp.Diff(la, lb); d != "" {
		t.Errorf("%s: nft list table differs between netlink (-) and nft -f (+):\n%s", step, d)
	}
	if d := cmp.Diff(da, db); d != "" {
		t.Errorf("%s: nft --debug=netlink list table differs between netlink (-) and nft -f (+):\n%s", step, d)
	}
	if d := cmp.Diff(ra, rb); d != "" {
		t.Errorf("%s: raw table/chain/set attributes differ between netlink (-) and nft -f (+):\n%s", step, d)
	}
	if t.Failed() {
		t.Logf("%s: listing through nft -f:\n%s", step, lb)
	}
}

// family-specific test addresses.
type famAddrs struct {
	fam                          Family
	svc1, svc2, pod1, pod2, node netip.Addr
	podNet, nodeNet, odd, client netip.Prefix
	clientAdj, top, zero         netip.Prefix
}

func addrsFor(f Family) famAddrs {
	if f == IPv6 {
		return famAddrs{
			fam:  IPv6,
			svc1: netip.MustParseAddr("fd00:96::1"), svc2: netip.MustParseAddr("fd00:96::2"),
			pod1: netip.MustParseAddr("fd00:244::11"), pod2: netip.MustParseAddr("fd00:244::12"),
			node:   netip.MustParseAddr("fd00:192::10"),
			podNet: netip.MustParsePrefix("fd00:244::/64"), nodeNet: netip.MustParsePrefix("fd00:192::/48"),
			odd:       netip.MustParsePrefix("fd00:100::/36"),
			client:    netip.MustParsePrefix("2001:db8::/33"),
			clientAdj: netip.MustParsePrefix("2001:db8:8000::/33"),
			top:       netip.MustParsePrefix("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ff00/120"),
			zero:      netip.MustParsePrefix("::/8"),
		}
	}
	return famAddrs{
		fam:  IPv4,
		svc1: netip.MustParseAddr("10.96.0.1"), svc2: netip.MustParseAddr("10.96.0.2"),
		pod1: netip.MustParseAddr("10.244.1.11"), pod2: netip.MustParseAddr("10.244.2.12"),
		node:   netip.MustParseAddr("192.168.0.10"),
		podNet: netip.MustParsePrefix("10.244.0.0/16"), nodeNet: netip.MustParsePrefix("192.168.0.0/16"),
		odd:       netip.MustParsePrefix("10.16.0.0/12"),
		client:    netip.MustParsePrefix("203.0.113.0/25"),
		clientAdj: netip.MustParsePrefix("203.0.113.128/25"),
		top:       netip.MustParsePrefix("255.255.255.0/24"),
		zero:      netip.MustParsePrefix("0.0.0.0/8"),
	}
}

func single(a netip.Addr) netip.Prefix { return netip.PrefixFrom(a, a.BitLen()) }

const testTable = "kproxy-test"

// everyThing builds a transaction using every statement type and every
// kind of set and map, laid out the way the kernel accepts them (NAT
// statements only reachable from NAT base chains, reject only from
// filter hooks).
func everyThing(a famAddrs) *Transaction {
	tx := NewTransaction(a.fam, testTable)
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
	addr := AddrType(a.fam)
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
		&Element{Set: "cluster-ips", Key: []Value{{Addr: a.svc1}}},
		&Element{Set: "cluster-ips", Key: []Value{{Addr: a.svc2}}, Comment: "second"},
		&Element{Set: "nodeport-ips", Key: []Value{{Prefix: a.nodeNet}}},
		&Element{Set: "nodeport-ips", Key: []Value{{Addr: a.svc1}}, Comment: "one address"},
		&Element{Set: "nodeport-ips", Key: []Value{{Prefix: a.top}}},
		&Element{Set: "zero-ips", Key: []Value{{Prefix: a.zero}}},
		&Element{Set: "zero-ips", Key: []Value{{Prefix: a.podNet}}},
		&Element{Set: "ports", Key: []Value{{Port: 80}}},
		&Element{Set: "ports", Key: []Value{{Port: 65535}}},
		&Element{Set: "protos", Key: []Value{{Proto: v1.ProtocolSCTP}}},
		&Element{Set: "triples", Key: []Value{{Addr: a.svc1}, {Proto: v1.ProtocolUDP}, {Port: 53}}},
		&Element{Set: "service-ips", Key: []Value{{Addr: a.svc1}, {Proto: v1.ProtocolTCP}, {Port: 80}}, Verdict: &Verdict{Kind: Goto, Chain: "service-1"}, Comment: "ns1/svc1:http"},
		&Element{Set: "service-ips", Key: []Value{{Addr: a.svc2}, {Proto: v1.ProtocolUDP}, {Port: 53}}, Verdict: &Verdict{Kind: Jump, Chain: "service-1"}},
		&Element{Set: "service-nodeports", Key: []Value{{Proto: v1.ProtocolTCP}, {Port: 30080}}, Verdict: &Verdict{Kind: Goto, Chain: "service-1"}},
		&Element{Set: "service-nodeports", Key: []Value{{Proto: v1.ProtocolSCTP}, {Port: 30081}}, Verdict: &Verdict{Kind: Drop}},
		&Element{Set: "no-endpoint-services", Key: []Value{{Addr: a.svc2}, {Proto: v1.ProtocolTCP}, {Port: 81}}, Verdict: &Verdict{Kind: Goto, Chain: "reject-chain"}, Comment: "ns1/svc2:http has no endpoints"},
		&Element{Set: "no-endpoint-nodeports", Key: []Value{{Proto: v1.ProtocolUDP}, {Port: 30053}}, Verdict: &Verdict{Kind: Goto, Chain: "reject-chain"}},
		&Element{Set: "firewall-ips", Key: []Value{{Prefix: a.nodeNet}}, Verdict: &Verdict{Kind: Goto, Chain: "firewall-1"}, Comment: "LB range"},
		&Element{Set: "firewall-ips", Key: []Value{{Addr: a.svc2}}, Verdict: &Verdict{Kind: Accept}},
		&Element{Set: "by-addr", Key: []Value{{Addr: a.pod1}}, Verdict: &Verdict{Kind: Return}},
		&Element{Set: "hairpin", Key: []Value{{Addr: a.pod1}, {Addr: a.pod1}}},
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
		{Chain: "service-1", Stmts: []Stmt{MatchAddr{Source: true, Negate: true, Prefixes: []netip.Prefix{a.podNet}}, MatchAddr{Prefixes: []netip.Prefix{single(a.svc1)}}, MatchDport{Proto: v1.ProtocolTCP, Port: 80}, Verdict{Kind: Jump, Chain: "mark-for-masquerade"}}},
		{Chain: "service-1", Stmts: []Stmt{NumgenVmap{Chains: []string{"endpoint-1", "endpoint-2"}}}, Comment: "2 endpoints"},
		{Chain: "service-1", Stmts: []Stmt{MatchNumgen{Mod: 3, Value: 0}, UpdateSaddr{Set: "affinity-1"}, DNAT{Proto: v1.ProtocolTCP, To: netip.AddrPortFrom(a.pod1, 8080)}}},
		{Chain: "endpoint-1", Stmts: []Stmt{MatchAddr{Source: true, Prefixes: []netip.Prefix{single(a.pod1)}}, Verdict{Kind: Jump, Chain: "mark-for-masquerade"}}},
		{Chain: "endpoint-1", Stmts: []Stmt{UpdateSaddr{Set: "affinity-1"}}},
		{Chain: "endpoint-1", Stmts: []Stmt{DNAT{Proto: v1.ProtocolTCP, To: netip.AddrPortFrom(a.pod1, 8080)}}},
		{Chain: "endpoint-2", Stmts: []Stmt{DNAT{Proto: v1.ProtocolUDP, To: netip.AddrPortFrom(a.pod2, 53)}}},
		{Chain: "firewall-1", Stmts: []Stmt{MatchAddr{Source: true, Negate: true, Prefixes: []netip.Prefix{a.client, a.clientAdj, single(a.node), a.podNet}}, Verdict{Kind: Drop}}},
		{Chain: "firewall-1", Stmts: []Stmt{MatchAddr{Prefixes: []netip.Prefix{single(a.svc1), single(a.svc2)}}, Verdict{Kind: Accept}}},
		{Chain: "reject-chain", Stmts: []Stmt{Reject{}}, Comment: "reject traffic to services without endpoints"},
		{Chain: "misc", Stmts: []Stmt{MatchIifname{Name: "eth", Prefix: true}, MatchIifname{Negate: true, Name: "lo"}, MatchIifname{Negate: true, Name: "veth", Prefix: true}, MatchIifname{Name: "eth0"}, Counter{}}},
		{Chain: "misc", Stmts: []Stmt{MatchFibLocal{Source: true}, MatchAddr{Negate: true, Prefixes: []netip.Prefix{single(a.svc1)}}, MatchAddr{Prefixes: []netip.Prefix{a.odd}}, Verdict{Kind: Goto, Chain: "endpoint-2"}}},
		{Chain: "misc", Stmts: []Stmt{MatchAddr{Source: true, Prefixes: []netip.Prefix{netip.PrefixFrom(a.svc1, 0).Masked()}}, MatchAddr{Set: "cluster-ips", Negate: true}, MatchL4Proto{Proto: v1.ProtocolSCTP}, Verdict{Kind: Accept}}},
		{Chain: "misc", Stmts: []Stmt{MatchL4Proto{Proto: v1.ProtocolUDP}, MatchDport{Proto: v1.ProtocolUDP, Port: 53}, Verdict{Kind: Return}}},
		{Chain: "misc", Stmts: []Stmt{MatchDport{Proto: v1.ProtocolSCTP, Port: 9}, MatchAddr{Set: "cluster-ips"}, Verdict{Kind: Drop}}},
		{Chain: "misc", Stmts: []Stmt{MatchAddr{Source: true, Prefixes: []netip.Prefix{single(a.pod1), single(a.pod2), single(a.pod1)}}, Verdict{Kind: Drop}}},
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
		&Rule{Chain: "service-2", Stmts: []Stmt{MatchAddr{Source: true, Prefixes: []netip.Prefix{single(a.pod1)}}, DNATMap{Proto: v1.ProtocolSCTP, Mod: 3, Offset: 4294967292, Map: "endpoints-1"}}, Comment: "3 endpoints"},
		&Element{Set: "endpoints-0", Index: 0, To: netip.AddrPortFrom(a.pod1, 8080)},
		&Element{Set: "endpoints-0", Index: 1, To: netip.AddrPortFrom(a.pod2, 80)},
		&Element{Set: "endpoints-1", Index: 4294967292, To: netip.AddrPortFrom(a.pod2, 65535)},
		&Element{Set: "endpoints-1", Index: 4294967293, To: netip.AddrPortFrom(a.pod1, 1)},
		&Element{Set: "endpoints-1", Index: 4294967294, To: netip.AddrPortFrom(a.pod1, 9)},
	)
	// Endpoint maps keyed by service, and the chains sharing them, after
	// everything else for the same reason.
	tx.Add(&Chain{Name: "cluster-tcp-2"}, &Chain{Name: "cluster-udp-1"},
		&Set{Name: "cluster-endpoints-tcp", Endpoints: v1.ProtocolTCP, ByService: true},
		&Set{Name: "cluster-endpoints-udp", Endpoints: v1.ProtocolUDP, ByService: true},
		&Set{Name: "cluster-endpoints-sctp", Endpoints: v1.ProtocolSCTP, ByService: true})
	tx.Add(
		&Rule{Chain: "cluster-tcp-2", Stmts: []Stmt{MatchAddr{Source: true, Negate: true, Prefixes: []netip.Prefix{a.podNet}}, SetMarkOr{Mask: 0x4000}}},
		&Rule{Chain: "cluster-tcp-2", Stmts: []Stmt{DNATByService{Proto: v1.ProtocolTCP, Mod: 2, Map: "cluster-endpoints-tcp"}}},
		&Rule{Chain: "cluster-udp-1", Stmts: []Stmt{DNATByService{Proto: v1.ProtocolUDP, Mod: 1, Map: "cluster-endpoints-udp"}}, Comment: "1 endpoint"},
		&Element{Set: "service-ips", Key: []Value{{Addr: a.svc1}, {Proto: v1.ProtocolTCP}, {Port: 8080}}, Verdict: &Verdict{Kind: Goto, Chain: "cluster-tcp-2"}},
		&Element{Set: "cluster-endpoints-tcp", Key: []Value{{Addr: a.svc1}, {Port: 8080}}, Index: 0, To: netip.AddrPortFrom(a.pod1, 80)},
		&Element{Set: "cluster-endpoints-tcp", Key: []Value{{Addr: a.svc1}, {Port: 8080}}, Index: 1, To: netip.AddrPortFrom(a.pod2, 65535)},
		&Element{Set: "cluster-endpoints-udp", Key: []Value{{Addr: a.svc2}, {Port: 53}}, Index: 0, To: netip.AddrPortFrom(a.pod2, 5353)},
		&Element{Set: "cluster-endpoints-sctp", Key: []Value{{Addr: a.svc2}, {Port: 65535}}, Index: 4294967295, To: netip.AddrPortFrom(a.pod1, 1)},
	)
	return tx
}

// applyBoth applies tx through netlink in a and through nft -f in b.
func applyBoth(t *testing.T, a, b *kernelNS, tx *Transaction) (errNetlink, errExec error) {
	t.Helper()
	ctx := context.Background()
	start := time.Now()
	errNetlink = a.nl.Apply(ctx, tx)
	t.Logf("netlink: %d operations in %v", tx.Len(), time.Since(start))
	start = time.Now()
	errExec = b.ex.Apply(ctx, tx)
	t.Logf("nft -f: %d operations in %v", tx.Len(), time.Since(start))
	return
}

func TestKernelNetlinkMatchesNft(t *testing.T) {
	for _, fam := range []Family{IPv4, IPv6} {
		t.Run(string(fam), func(t *testing.T) {
			a, b := newKernelNS(t), newKernelNS(t)
			addrs := addrsFor(fam)

			steps := []struct {
				name string
				tx   func() *Transaction
			}{
				{"create everything", func() *Transaction { return everyThing(addrs) }},
				{"partial update", func() *Transaction {
					tx := NewTransaction(fam, testTable)
					tx.Add(&Chain{Name: "endpoint-3"})
					tx.Add(&Rule{Chain: "endpoint-3", Stmts: []Stmt{DNAT{Proto: v1.ProtocolTCP, To: netip.AddrPortFrom(addrs.pod2, 8080)}}})
					tx.Flush(&Chain{Name: "service-1"})
					tx.Add(&Rule{Chain: "service-1", Stmts: []Stmt{NumgenVmap{Chains: []string{"endpoint-1", "endpoint-2", "endpoint-3"}}}})
					// Inserted rules go to the head of the chain, each before the previous one.
					tx.Insert(&Rule{Chain: "service-1", Stmts: []Stmt{Verdict{Kind: Goto, Chain: "endpoint-2"}}})
					tx.Insert(&Rule{Chain: "service-1", Stmts: []Stmt{MatchNumgen{Mod: 2, Value: 0}, Verdict{Kind: Goto, Chain: "endpoint-3"}}})
					// A set that already has elements: no first segment.
					tx.Add(&Element{Set: "nodeport-ips", Key: []Value{{Prefix: addrs.podNet}}})
					tx.Delete(&Element{Set: "nodeport-ips", Key: []Value{{Addr: addrs.svc1}}})
					tx.Delete(&Element{Set: "service-ips", Key: []Value{{Addr: addrs.svc2}, {Proto: v1.ProtocolUDP}, {Port: 53}}})
					tx.Add(&Element{Set: "service-ips", Key: []Value{{Addr: addrs.svc2}, {Proto: v1.ProtocolSCTP}, {Port: 9}}, Verdict: &Verdict{Kind: Goto, Chain: "service-1"}})
					tx.Delete(&Element{Set: "cluster-ips", Key: []Value{{Addr: addrs.svc2}}})
					tx.Flush(&Chain{Name: "misc"})
					tx.Delete(&Chain{Name: "misc"})
					// A service of the endpoint map changes: fresh keys, the
					// old ones deleted.
					tx.Insert(&Rule{Chain: "service-2", Stmts: []Stmt{DNATMap{Proto: v1.ProtocolTCP, Mod: 1, Offset: 7, Map: "endpoints-0"}}})
					tx.Add(&Rule{Chain: "service-2", Stmts: []Stmt{DNATMap{Proto: v1.ProtocolUDP, Mod: 1, Offset: 0, Map: "endpoints-2"}}})
					tx.Add(&Element{Set: "endpoints-2", Index: 0, To: netip.AddrPortFrom(addrs.pod1, 53)})
					tx.Add(&Element{Set: "endpoints-0", Index: 7, To: netip.AddrPortFrom(addrs.pod2, 53)})
					tx.Delete(&Element{Set: "endpoints-0", Index: 1, To: netip.AddrPortFrom(addrs.pod2, 80)})
					// An endpoint of a service sharing cluster-tcp-2
					// changes, and a service moves to another count.
					tx.Delete(&Element{Set: "cluster-endpoints-tcp", Key: []Value{{Addr: addrs.svc1}, {Port: 8080}}, Index: 1, To: netip.AddrPortFrom(addrs.pod2, 65535)})
					tx.Add(&Element{Set: "cluster-endpoints-tcp", Key: []Value{{Addr: addrs.svc1}, {Port: 8080}}, Index: 1, To: netip.AddrPortFrom(addrs.pod1, 8081)})
					tx.Add(&Chain{Name: "cluster-tcp-3"})
					tx.Add(&Rule{Chain: "cluster-tcp-3", Stmts: []Stmt{DNATByService{Proto: v1.ProtocolTCP, Mod: 3, Map: "cluster-endpoints-tcp"}}})
					tx.Delete(&Element{Set: "service-ips", Key: []Value{{Addr: addrs.svc1}, {Proto: v1.ProtocolTCP}, {Port: 8080}}})
					tx.Add(&Element{Set: "service-ips", Key: []Value{{Addr: addrs.svc1}, {Proto: v1.ProtocolTCP}, {Port: 8080}}, Verdict: &Verdict{Kind: Goto, Chain: "cluster-tcp-3"}})
					tx.Add(&Element{Set: "cluster-endpoints-tcp", Key: []Value{{Addr: addrs.svc1}, {Port: 8080}}, Index: 2, To: netip.AddrPortFrom(addrs.pod2, 8082)})
					tx.Flush(&Chain{Name: "cluster-udp-1"})
					tx.Delete(&Chain{Name: "cluster-udp-1"})
					return tx
				}},
				{"refill and recreate", func() *Transaction {
					tx := NewTransaction(fam, testTable)
					tx.Add(&Set{Name: "nodeport-ips", Key: []DataType{AddrType(fam)}, Interval: true})
					tx.Flush(&Set{Name: "nodeport-ips", Key: []DataType{AddrType(fam)}, Interval: true})
					tx.Add(&Element{Set: "nodeport-ips", Key: []Value{{Prefix: addrs.nodeNet}}})
					tx.Add(&Set{Name: "new-interval", Key: []DataType{AddrType(fam)}, Interval: true, Comment: "new"})
					tx.Add(&Element{Set: "new-interval", Key: []Value{{Prefix: addrs.podNet}}, Comment: "pods"})
					tx.Flush(&Set{Name: "triples"})
					tx.Delete(&Set{Name: "triples"})
					tx.Flush(&Table{})
					return tx
				}},
			}
			for _, st := range steps {
				tx := st.tx()
				errN, errE := applyBoth(t, a, b, tx)
				if errN != nil || errE != nil {
					t.Fatalf("%s: netlink: %v; nft -f: %v\ntransaction:\n%s", st.name, errN, errE, tx)
				}
				compareStates(t, st.name, a, b, fam, testTable)
			}
		})
	}
}

func TestKernelFailedTransactionChangesNothing(t *testing.T) {
	for _, fam := range []Family{IPv4, IPv6} {
		t.Run(string(fam), func(t *testing.T) {
			a, b := newKernelNS(t), newKernelNS(t)
			addrs := addrsFor(fam)
			if errN, errE := applyBoth(t, a, b, everyThing(addrs)); errN != nil || errE != nil {
				t.Fatalf("setup: netlink: %v; nft -f: %v", errN, errE)
			}
			la0, da0, ra0 := a.state(t, fam, testTable)
			lb0, db0, rb0 := b.state(t, fam, testTable)

			tx := NewTransaction(fam, testTable)
			tx.Add(&Chain{Name: "endpoint-9"})
			tx.Add(&Rule{Chain: "endpoint-9", Stmts: []Stmt{DNAT{Proto: v1.ProtocolTCP, To: netip.AddrPortFrom(addrs.pod2, 80)}}})
			tx.Add(&Element{Set: "cluster-ips", Key: []Value{{Addr: addrs.pod2}}})
			tx.Flush(&Chain{Name: "services"})
			tx.Delete(&Element{Set: "service-ips", Key: []Value{{Addr: addrs.svc1}, {Proto: v1.ProtocolTCP}, {Port: 80}}})
			tx.Add(&Rule{Chain: "service-1", Stmts: []Stmt{Verdict{Kind: Goto, Chain: "no-such-chain"}}})
			last := tx.Len() - 1

			errN, errE := applyBoth(t, a, b, tx)
			for name, err := range map[string]error{"netlink": errN, "nft -f": errE} {
				if !errors.Is(err, unix.ENOENT) {
					t.Errorf("%s: got error %v, want ENOENT", name, err)
				}
				var oe *OpError
				if !errors.As(err, &oe) || oe.Index != last {
					t.Errorf("%s: error %v does not name operation %d", name, err, last)
				} else {
					t.Logf("%s: %v", name, err)
				}
			}
			la, da, ra := a.state(t, fam, testTable)
			lb, db, rb := b.state(t, fam, testTable)
			for _, c := range []struct{ name, before, after string }{
				{"netlink listing", la0, la}, {"netlink debug listing", da0, da}, {"netlink raw", ra0, ra},
				{"nft -f listing", lb0, lb}, {"nft -f debug listing", db0, db}, {"nft -f raw", rb0, rb},
			} {
				if d := cmp.Diff(c.before, c.after); d != "" {
					t.Errorf("%s changed by a failed transaction (-before +after):\n%s", c.name, d)
				}
			}
		})
	}
}

func TestKernelErrorsNameTheCulprit(t *testing.T) {
	ns := newKernelNS(t)
	ctx := context.Background()
	addrs := addrsFor(IPv4)
	if err := ns.nl.Apply(ctx, everyThing(addrs)); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		build  func(tx *Transaction)
		errno  error
		index  int
		detail string
	}{
		{
			name: "element with a different verdict",
			build: func(tx *Transaction) {
				tx.Add(&Element{Set: "service-ips", Key: []Value{{Addr: addrs.svc2}, {Proto: v1.ProtocolTCP}, {Port: 1}}, Verdict: &Verdict{Kind: Drop}})
				tx.Add(&Element{Set: "service-ips", Key: []Value{{Addr: addrs.svc1}, {Proto: v1.ProtocolTCP}, {Port: 80}}, Verdict: &Verdict{Kind: Drop}})
				tx.Add(&Element{Set: "service-ips", Key: []Value{{Addr: addrs.svc2}, {Proto: v1.ProtocolTCP}, {Port: 2}}, Verdict: &Verdict{Kind: Drop}})
			},
			errno: unix.EEXIST, index: 1,
		},
		{
			name: "delete a missing element",
			build: func(tx *Transaction) {
				tx.Delete(&Element{Set: "cluster-ips", Key: []Value{{Addr: addrs.svc1}}})
				tx.Delete(&Element{Set: "cluster-ips", Key: []Value{{Addr: addrs.pod1}}})
			},
			errno: unix.ENOENT, index: 1,
		},
		{
			name: "jump to a missing chain",
			build: func(tx *Transaction) {
				tx.Add(&Rule{Chain: "services", Stmts: []Stmt{MatchCtStateNew{}, Verdict{Kind: Jump, Chain: "nope"}}})
			},
			errno: unix.ENOENT, index: 0, detail: "statement jump nope",
		},
		{
			name:  "delete a chain still referenced",
			build: func(tx *Transaction) { tx.Delete(&Chain{Name: "service-1"}) },
			errno: unix.EBUSY, index: 0,
		},
		{
			name:  "change a base chain's hook",
			build: func(tx *Transaction) { tx.Add(&Chain{Name: "filter-input", Type: TypeFilter, Hook: HookOutput}) },
			errno: unix.EOPNOTSUPP, index: 0,
		},
		{
			name:  "masquerade reachable from prerouting",
			build: func(tx *Transaction) { tx.Add(&Rule{Chain: "services", Stmts: []Stmt{Masquerade{}}}) },
			errno: unix.EOPNOTSUPP, index: 0,
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tx := NewTransaction(IPv4, testTable)
			c.build(tx)
			err := ns.nl.Apply(ctx, tx)
			t.Logf("error: %v", err)
			if !errors.Is(err, c.errno) {
				t.Fatalf("got %v, want %v", err, c.errno)
			}
			var oe *OpError
			if !errors.As(err, &oe) {
				t.Fatalf("%v is not an *OpError", err)
			}
			if oe.Index != c.index || oe.Op != tx.OpText(c.index) {
				t.Errorf("error names operation %d %q, want %d %q", oe.Index, oe.Op, c.index, tx.OpText(c.index))
			}
			if c.detail != "" && oe.Detail != c.detail {
				t.Errorf("detail %q, want %q", oe.Detail, c.detail)
			}
		})
	}
}

func TestKernelLargeMapIsOneBatch(t *testing.T) {
	for _, fam := range []Family{IPv4, IPv6} {
		t.Run(string(fam), func(t *testing.T) {
			ns := newKernelNS(t)
			ctx := context.Background()
			addr := AddrType(fam)
			base := netip.MustParseAddr("10.0.0.0")
			if fam == IPv6 {
				base = netip.MustParseAddr("fd00::")
			}
			build := func(n int, poison bool) *Transaction {
				tx := NewTransaction(fam, testTable)
				tx.Add(&Table{})
				tx.Add(&Chain{Name: "service-with-a-long-name-like-kube-proxy-uses"})
				tx.Add(&Set{Name: "service-ips", Key: []DataType{addr, TypeInetProto, TypeInetService}, Data: TypeVerdict})
				a := base
				for i := 0; i < n; i++ {
					a = a.Next()
					tx.Add(&Element{Set: "service-ips", Key: []Value{{Addr: a}, {Proto: v1.ProtocolTCP}, {Port: uint16(i % 65536)}},
						Verdict: &Verdict{Kind: Goto, Chain: "service-with-a-long-name-like-kube-proxy-uses"}, Comment: fmt.Sprintf("ns/svc-%d:http", i)})
				}
				if poison {
					tx.Add(&Element{Set: "service-ips", Key: []Value{{Addr: base}, {Proto: v1.ProtocolTCP}, {Port: 1}}, Verdict: &Verdict{Kind: Goto, Chain: "missing"}})
				}
				return tx
			}
			const n = 10000
			// All or nothing: a bad last element keeps the other 10000 out.
			if err := ns.nl.Apply(ctx, build(n, true)); !errors.Is(err, unix.ENOENT) {
				t.Fatalf("poisoned transaction: got %v, want ENOENT", err)
			}
			if ok, err := ns.nl.TableExists(ctx, fam, testTable); err != nil || ok {
				t.Fatalf("after a failed transaction the table exists=%v (err %v)", ok, err)
			}
			tx := build(n, false)
			start := time.Now()
			if err := ns.nl.Apply(ctx, tx); err != nil {
				t.Fatal(err)
			}
			t.Logf("%d elements through netlink in %v", n, time.Since(start))
			if got := ns.countElements(t, fam, "service-ips"); got != n {
				t.Errorf("map has %d elements, want %d", got, n)
			}
		})
	}
}

func (ns *kernelNS) countElements(t *testing.T, fam Family, set string) int {
	t.Helper()
	c, err := ns.nl.dial()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var a attrs
	a.str(unix.NFTA_SET_ELEM_LIST_TABLE, testTable)
	a.str(unix.NFTA_SET_ELEM_LIST_SET, set)
	n := 0
	err = c.dumpEach(context.Background(), unix.NFT_MSG_GETSETELEM, nfproto(fam), a.b, func(b []byte) bool {
		forEachAttr(b, func(typ uint16, data []byte) {
			if typ == unix.NFTA_SET_ELEM_LIST_ELEMENTS {
				forEachAttr(data, func(uint16, []byte) { n++ })
			}
		})
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestKernelListings(t *testing.T) {
	ns := newKernelNS(t)
	ctx := context.Background()
	for _, impl := range []struct {
		name string
		nft  Interface
	}{{"netlink", ns.nl}, {"exec", ns.ex}} {
		t.Run(impl.name, func(t *testing.T) {
			if ok, err := impl.nft.TableExists(ctx, IPv4, testTable); err != nil || ok {
				t.Fatalf("TableExists before creation = %v, %v", ok, err)
			}
			if _, err := impl.nft.ListChains(ctx, IPv4, testTable); !errors.Is(err, ErrNotFound) {
				t.Errorf("ListChains of a missing table: %v, want ErrNotFound", err)
			}
			if err := impl.nft.DeleteTable(ctx, IPv4, testTable); err != nil {
				t.Errorf("DeleteTable of a missing table: %v", err)
			}
			if err := impl.nft.Apply(ctx, everyThing(addrsFor(IPv4))); err != nil {
				t.Fatal(err)
			}
			if ok, err := impl.nft.TableExists(ctx, IPv4, testTable); err != nil || !ok {
				t.Fatalf("TableExists after creation = %v, %v", ok, err)
			}
			if ok, err := impl.nft.TableExists(ctx, IPv6, testTable); err != nil || ok {
				t.Fatalf("TableExists(ip6) = %v, %v", ok, err)
			}
			chains, err := impl.nft.ListChains(ctx, IPv4, testTable)
			if err != nil {
				t.Fatal(err)
			}
			wantChains := []string{"cluster-tcp-2", "cluster-udp-1", "endpoint-1", "endpoint-2", "filter-forward", "filter-input", "firewall-1", "mark-for-masquerade",
				"masquerading", "misc", "nat-output", "nat-postrouting", "nat-prerouting", "reject-chain", "service-1", "service-2", "services"}
			if d := cmp.Diff(wantChains, chains); d != "" {
				t.Errorf("ListChains (-want +got):\n%s", d)
			}
			sets, err := impl.nft.ListSets(ctx, IPv4, testTable)
			if err != nil {
				t.Fatal(err)
			}
			wantSets := []string{"affinity-1", "by-addr", "cluster-endpoints-sctp", "cluster-endpoints-tcp", "cluster-endpoints-udp", "cluster-ips", "endpoints-0", "endpoints-1", "endpoints-2", "firewall-ips", "hairpin", "no-endpoint-nodeports", "no-endpoint-services", "nodeport-ips",
				"ports", "protos", "service-ips", "service-nodeports", "triples", "zero-ips"}
			if d := cmp.Diff(wantSets, sets); d != "" {
				t.Errorf("ListSets (-want +got):\n%s", d)
			}
			if err := impl.nft.DeleteTable(ctx, IPv4, testTable); err != nil {
				t.Fatal(err)
			}
			if ok, err := impl.nft.TableExists(ctx, IPv4, testTable); err != nil || ok {
				t.Fatalf("TableExists after deletion = %v, %v", ok, err)
			}
		})
	}
}

// A full sync of a large cluster is one batch of tens of thousands of
// messages and several megabytes.
const largeServices = 5000

// largeTx is a full sync of largeServices services with two endpoints each.
func largeTx() *Transaction {
	const services = largeServices
	tx := NewTransaction(IPv4, testTable)
	tx.Add(&Table{})
	tx.Add(&Chain{Name: "nat-prerouting", Type: TypeNAT, Hook: HookPrerouting, Priority: PriorityDstNAT})
	tx.Add(&Chain{Name: "mark-for-masquerade"})
	tx.Add(&Rule{Chain: "mark-for-masquerade", Stmts: []Stmt{SetMarkOr{Mask: 0x4000}}})
	tx.Add(&Set{Name: "service-ips", Key: []DataType{TypeIPv4Addr, TypeInetProto, TypeInetService}, Data: TypeVerdict})
	tx.Add(&Rule{Chain: "nat-prerouting", Stmts: []Stmt{VmapLookup{Fields: []Field{FieldDaddr, FieldL4Proto, FieldDport}, Map: "service-ips"}}})
	svc := netip.MustParseAddr("10.96.0.0")
	pod := netip.MustParseAddr("10.244.0.0")
	for i := 0; i < services; i++ {
		svc = svc.Next()
		name := fmt.Sprintf("service-%08x-ns%d/svc%d/tcp/http", i, i%50, i)
		var eps []string
		for j := 0; j < 2; j++ {
			pod = pod.Next()
			ep := fmt.Sprintf("endpoint-%08x-ns%d/svc%d/tcp/http__%s/8080", i*2+j, i%50, i, pod)
			eps = append(eps, ep)
			tx.Add(&Chain{Name: ep})
			tx.Add(&Rule{Chain: ep, Stmts: []Stmt{MatchAddr{Source: true, Prefixes: []netip.Prefix{single(pod)}}, Verdict{Kind: Jump, Chain: "mark-for-masquerade"}}})
			tx.Add(&Rule{Chain: ep, Stmts: []Stmt{DNAT{Proto: v1.ProtocolTCP, To: netip.AddrPortFrom(pod, 8080)}}})
		}
		tx.Add(&Chain{Name: name})
		tx.Add(&Rule{Chain: name, Stmts: []Stmt{MatchAddr{Source: true, Negate: true, Prefixes: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}}, Verdict{Kind: Jump, Chain: "mark-for-masquerade"}}})
		tx.Add(&Rule{Chain: name, Stmts: []Stmt{NumgenVmap{Chains: eps}}, Comment: fmt.Sprintf("ns%d/svc%d:http", i%50, i)})
		tx.Add(&Element{Set: "service-ips", Key: []Value{{Addr: svc}, {Proto: v1.ProtocolTCP}, {Port: 80}}, Verdict: &Verdict{Kind: Goto, Chain: name}})
	}
	return tx
}

func TestKernelLargeLayout(t *testing.T) {
	ns := newKernelNS(t)
	ctx := context.Background()
	const services = largeServices
	tx := largeTx()
	start := time.Now()
	if err := ns.nl.Apply(ctx, tx); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d operations (%d services) through netlink in %v", tx.Len(), services, time.Since(start))
	chains, err := ns.nl.ListChains(ctx, IPv4, testTable)
	if err != nil {
		t.Fatal(err)
	}
	if want := 2 + 3*services; len(chains) != want {
		t.Errorf("%d chains, want %d", len(chains), want)
	}
	if got := ns.countElements(t, IPv4, "service-ips"); got != services {
		t.Errorf("%d map elements, want %d", got, services)
	}
}
