package nfnetlink

import (
	"encoding/hex"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/kernel/nft"
)

// Pure lowering tests. That the messages equal nft's is checked against
// the kernel in kernel_test.go; these pin the arithmetic.

func TestConcatRegisters(t *testing.T) {
	// ip daddr . meta l4proto . th dport: slots 0, 1, 2 -> reg 1, 9, 10.
	// ip6 daddr . meta l4proto . th dport: slots 0, 4, 5 -> reg 1, 2, 13.
	for slot, want := range map[int]uint32{0: 1, 1: 9, 2: 10, 3: 11, 4: 2, 5: 13, 8: 3} {
		if got := concatReg(slot); got != want {
			t.Errorf("concatReg(%d) = %d, want %d", slot, got, want)
		}
	}
}

func TestKeyTypeAndBytes(t *testing.T) {
	cases := []struct {
		key     []nft.DataType
		val     []nft.Value
		id      uint32
		length  int
		wantHex string
	}{
		{[]nft.DataType{nft.TypeIPv4Addr, nft.TypeInetProto, nft.TypeInetService},
			[]nft.Value{{Addr: netip.MustParseAddr("10.0.0.1")}, {Proto: v1.ProtocolTCP}, {Port: 80}},
			7<<12 | 12<<6 | 13, 12, "0a000001" + "06000000" + "00500000"},
		{[]nft.DataType{nft.TypeIPv6Addr, nft.TypeInetProto, nft.TypeInetService},
			[]nft.Value{{Addr: netip.MustParseAddr("fd00::1")}, {Proto: v1.ProtocolSCTP}, {Port: 65535}},
			8<<12 | 12<<6 | 13, 24, "fd000000000000000000000000000001" + "84000000" + "ffff0000"},
		{[]nft.DataType{nft.TypeInetProto, nft.TypeInetService}, []nft.Value{{Proto: v1.ProtocolUDP}, {Port: 53}},
			12<<6 | 13, 8, "11000000" + "00350000"},
		{[]nft.DataType{nft.TypeInetService}, []nft.Value{{Port: 53}}, 13, 2, "0035"},
		{[]nft.DataType{nft.TypeInetProto}, []nft.Value{{Proto: v1.ProtocolTCP}}, 12, 1, "06"},
	}
	for _, c := range cases {
		id, length, err := keyType(c.key)
		if err != nil || id != c.id || length != c.length {
			t.Errorf("keyType(%v) = %#x, %d, %v; want %#x, %d", c.key, id, length, err, c.id, c.length)
		}
		b, err := keyBytes(c.key, c.val)
		if err != nil || hex.EncodeToString(b) != c.wantHex {
			t.Errorf("keyBytes(%v) = %x, %v; want %s", c.val, b, err, c.wantHex)
		}
	}
	for _, bad := range [][]nft.Value{
		{{Addr: netip.MustParseAddr("fd00::1")}, {Proto: v1.ProtocolTCP}, {Port: 80}},
		{{Addr: netip.MustParseAddr("10.0.0.1")}, {Port: 6}, {Port: 80}},
		{{Addr: netip.MustParseAddr("10.0.0.1")}, {Proto: v1.ProtocolTCP}},
	} {
		if _, err := keyBytes([]nft.DataType{nft.TypeIPv4Addr, nft.TypeInetProto, nft.TypeInetService}, bad); err == nil {
			t.Errorf("keyBytes(%v) succeeded, want an error", bad)
		}
	}
}

func rangesString(rs []addrRange) string {
	var parts []string
	for _, r := range rs {
		parts = append(parts, r.lo.String()+"-"+r.hi.String())
	}
	return strings.Join(parts, " ")
}

func TestMergeRanges(t *testing.T) {
	p := func(s string) addrRange { return prefixRange(netip.MustParsePrefix(s)) }
	cases := []struct {
		in   []addrRange
		want string
	}{
		{[]addrRange{p("10.128.0.0/9"), p("10.0.0.0/9")}, "10.0.0.0-10.255.255.255"},
		{[]addrRange{p("10.0.0.0/8"), p("10.1.0.0/16")}, "10.0.0.0-10.255.255.255"},
		{[]addrRange{p("192.168.1.2/32"), p("192.168.1.1/32"), p("10.0.0.0/8")}, "10.0.0.0-10.255.255.255 192.168.1.1-192.168.1.2"},
		{[]addrRange{p("10.0.0.0/24"), p("10.0.2.0/24")}, "10.0.0.0-10.0.0.255 10.0.2.0-10.0.2.255"},
		{[]addrRange{p("2001:db8::/33"), p("2001:db8:8000::/33")}, "2001:db8::-2001:db8:ffff:ffff:ffff:ffff:ffff:ffff"},
		{[]addrRange{p("255.255.255.0/24"), p("255.0.0.0/8")}, "255.0.0.0-255.255.255.255"},
	}
	for _, c := range cases {
		if got := rangesString(mergeRanges(c.in)); got != c.want {
			t.Errorf("mergeRanges = %s, want %s", got, c.want)
		}
	}
}

func elemsString(es []elemAttr) string {
	var parts []string
	for _, e := range es {
		s := hex.EncodeToString(e.key)
		if e.end {
			s += " end"
		}
		if e.open {
			s += " open"
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, ", ")
}

func TestIntervalElements(t *testing.T) {
	p := func(s string) addrRange { return prefixRange(netip.MustParsePrefix(s)) }
	cases := []struct {
		rs    []addrRange
		first bool
		want  string
	}{
		{[]addrRange{p("10.0.0.0/8")}, true, "00000000 end, 0a000000, 0b000000 end"},
		{[]addrRange{p("10.0.0.0/8")}, false, "0a000000, 0b000000 end"},
		{[]addrRange{p("0.0.0.0/8")}, true, "00000000, 01000000 end"},
		{[]addrRange{p("255.255.255.0/24")}, false, "ffffff00 open"},
		{[]addrRange{p("0.0.0.0/0")}, true, "00000000 open"},
		{[]addrRange{p("fd00::/64")}, true, "00000000000000000000000000000000 end, fd000000000000000000000000000000, fd000000000000010000000000000000 end"},
	}
	for _, c := range cases {
		if got := elemsString(intervalElems(c.rs, c.first, nil)); got != c.want {
			t.Errorf("intervalElems(%s, %v) = %s, want %s", rangesString(c.rs), c.first, got, c.want)
		}
	}
}

// fakeView is a kernel with some sets, all of them holding elements,
// keyed by "TABLE SET".
type fakeView map[string]*nft.Set

func (v fakeView) setDef(table, name string) (*nft.Set, error) { return v[table+" "+name], nil }
func (v fakeView) setEmpty(table, name string) (bool, error) {
	return v[table+" "+name] == nil, nil
}

func TestExplainMapsKernelErrorsToOperations(t *testing.T) {
	tx := nft.NewTransaction(nft.IPv4, "t")
	tx.Add(&nft.Set{Name: "m", Key: []nft.DataType{nft.TypeIPv4Addr, nft.TypeInetProto, nft.TypeInetService}, Data: nft.TypeVerdict})
	a := netip.MustParseAddr("10.0.0.0")
	for i := 0; i < 3000; i++ { // more than one message
		a = a.Next()
		tx.Add(&nft.Element{Set: "m", Key: []nft.Value{{Addr: a}, {Proto: v1.ProtocolTCP}, {Port: 80}}, Verdict: &nft.Verdict{Kind: nft.Goto, Chain: "some-chain-with-a-long-name"}})
	}
	tx.Add(&nft.Rule{Chain: "c", Stmts: []nft.Stmt{nft.MatchCtStateNew{}, nft.MatchDport{Proto: v1.ProtocolTCP, Port: 80}, nft.Verdict{Kind: nft.Jump, Chain: "x"}}})
	l := newLowerer(tx, nil)
	if err := l.lower(); err != nil {
		t.Fatal(err)
	}
	if len(l.msgs) < 4 {
		t.Fatalf("expected the elements to be split over several messages, got %d messages", len(l.msgs))
	}
	for _, m := range l.msgs {
		if len(m.attrs) > 65535 {
			t.Errorf("message of %d bytes of attributes", len(m.attrs))
		}
	}
	// Element 2500 is somewhere in a later message.
	wantOp := 2501
	var errs []batchError
	for mi, m := range l.msgs {
		for k, op := range m.elemOps {
			if op == wantOp {
				errs = append(errs, batchError{msg: mi, errno: unix.EEXIST, offset: m.elemStarts[k] + 12})
			}
		}
	}
	last := len(l.msgs) - 1
	rm := l.msgs[last]
	errs = append(errs, batchError{msg: last, errno: unix.ENOENT, offset: rm.exprStarts[len(rm.exprStarts)-1] + 4, text: "bad"})
	errs = append(errs, batchError{msg: -1, errno: unix.EOPNOTSUPP, offset: -1})

	err := l.explain(errs)
	var oes []*nft.OpError
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		var oe *nft.OpError
		if !errors.As(e, &oe) {
			t.Fatalf("%v is not an OpError", e)
		}
		oes = append(oes, oe)
	}
	if len(oes) != 3 {
		t.Fatalf("got %d errors, want 3: %v", len(oes), err)
	}
	if oes[0].Index != -1 || !errors.Is(oes[0], nft.ErrNotSupported) {
		t.Errorf("batch error: %v, want ErrNotSupported for the whole transaction", oes[0])
	}
	if oes[1].Index != wantOp || oes[1].Op != tx.OpText(wantOp) || !errors.Is(oes[1], unix.EEXIST) {
		t.Errorf("element error names %d %q, want %d %q", oes[1].Index, oes[1].Op, wantOp, tx.OpText(wantOp))
	}
	if oes[2].Index != tx.Len()-1 || oes[2].Detail != "statement jump x" || oes[2].Message != "bad" {
		t.Errorf("rule error: %+v, want the last operation at statement jump x", oes[2])
	}
}

func TestLowerRejects(t *testing.T) {
	cases := []struct {
		name string
		fam  nft.Family
		op   func(tx *nft.Transaction)
		want string
	}{
		{"ipv6 address in an ip table", nft.IPv4, func(tx *nft.Transaction) {
			tx.Add(&nft.Rule{Chain: "c", Stmts: []nft.Stmt{nft.MatchAddr{Prefixes: []netip.Prefix{netip.MustParsePrefix("fd00::/64")}}}})
		}, "does not belong"},
		{"conflicting protocols", nft.IPv4, func(tx *nft.Transaction) {
			tx.Add(&nft.Rule{Chain: "c", Stmts: []nft.Stmt{nft.MatchL4Proto{Proto: v1.ProtocolTCP}, nft.MatchDport{Proto: v1.ProtocolUDP, Port: 53}}})
		}, "conflicting protocols"},
		{"wildcard only", nft.IPv4, func(tx *nft.Transaction) {
			tx.Add(&nft.Rule{Chain: "c", Stmts: []nft.Stmt{nft.MatchIifname{Prefix: true}}})
		}, "wildcard"},
		{"dnat to the wrong family", nft.IPv6, func(tx *nft.Transaction) {
			tx.Add(&nft.Rule{Chain: "c", Stmts: []nft.Stmt{nft.DNAT{Proto: v1.ProtocolTCP, To: netip.MustParseAddrPort("10.0.0.1:80")}}})
		}, "does not belong"},
		{"rule deletion", nft.IPv4, func(tx *nft.Transaction) {
			tx.Delete(&nft.Rule{Chain: "c"})
		}, "can only be added"},
		{"prefix in a plain set", nft.IPv4, func(tx *nft.Transaction) {
			tx.Add(&nft.Set{Name: "s", Key: []nft.DataType{nft.TypeIPv4Addr}})
			tx.Add(&nft.Element{Set: "s", Key: []nft.Value{{Prefix: netip.MustParsePrefix("10.0.0.0/8")}}})
		}, "interval flag"},
		{"map element without verdict", nft.IPv4, func(tx *nft.Transaction) {
			tx.Add(&nft.Set{Name: "m", Key: []nft.DataType{nft.TypeInetService}, Data: nft.TypeVerdict})
			tx.Add(&nft.Element{Set: "m", Key: []nft.Value{{Port: 1}}})
		}, "without a verdict"},
		{"concatenated interval set", nft.IPv4, func(tx *nft.Transaction) {
			tx.Add(&nft.Set{Name: "s", Key: []nft.DataType{nft.TypeIPv4Addr, nft.TypeInetService}, Interval: true})
		}, "not supported"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tx := nft.NewTransaction(c.fam, "t")
			c.op(tx)
			err := newLowerer(tx, fakeView{}).lower()
			var oe *nft.OpError
			if !errors.As(err, &oe) || oe.Index != tx.Len()-1 || !strings.Contains(err.Error(), c.want) {
				t.Errorf("got %v, want an OpError at operation %d containing %q", err, tx.Len()-1, c.want)
			}
		})
	}
}

func TestLowerAsksTheKernelAboutExistingSets(t *testing.T) {
	view := fakeView{"t full": {Name: "full", Key: []nft.DataType{nft.TypeIPv4Addr}, Interval: true}}
	tx := nft.NewTransaction(nft.IPv4, "t")
	tx.Add(&nft.Element{Set: "full", Key: []nft.Value{{Prefix: netip.MustParsePrefix("10.0.0.0/8")}}})
	tx.Flush(&nft.Set{Name: "full"})
	tx.Add(&nft.Element{Set: "full", Key: []nft.Value{{Prefix: netip.MustParsePrefix("10.0.0.0/8")}}})
	// "full" has elements, so the first add gets no first segment
	// (2 elements: start and end); after the flush it does (3).
	l := newLowerer(tx, view)
	if err := l.lower(); err != nil {
		t.Fatal(err)
	}
	var got []int
	for _, m := range l.msgs {
		if m.typ == unix.NFT_MSG_NEWSETELEM {
			got = append(got, len(m.elemOps))
		}
	}
	if d := cmp.Diff([]int{2, 3}, got); d != "" {
		t.Errorf("element counts per message (-want +got):\n%s", d)
	}
}

// msgTable is the table a batch message is about (the first attribute of
// every message lowering writes names it).
func msgTable(m nlMsg) string {
	var name string
	forEachAttr(m.attrs, func(typ uint16, data []byte) {
		if name == "" && typ == 1 { // NFTA_{TABLE_NAME,CHAIN_TABLE,SET_TABLE,RULE_TABLE,SET_ELEM_LIST_TABLE}
			name = cString(data)
		}
	})
	return name
}

func TestLowerSeveralTables(t *testing.T) {
	// Set "s" exists with elements in the kernel's table t only; table u
	// declares its own "s" in the batch; table v is deleted first, so its
	// "s" is not asked about.
	view := fakeView{
		"t s": {Name: "s", Key: []nft.DataType{nft.TypeIPv4Addr}, Interval: true},
		"v s": {Name: "s", Key: []nft.DataType{nft.TypeIPv4Addr}, Interval: true},
	}
	p := []nft.Value{{Prefix: netip.MustParsePrefix("10.0.0.0/8")}}
	tx := nft.NewTransaction(nft.IPv4, "t")
	u, v := tx.In("u"), tx.In("v")
	v.Delete(&nft.Table{})
	u.Add(&nft.Table{})
	u.Add(&nft.Set{Name: "s", Key: []nft.DataType{nft.TypeIPv4Addr}, Interval: true})
	tx.Add(&nft.Element{Set: "s", Key: p}) // t: has elements, no first segment
	u.Add(&nft.Element{Set: "s", Key: p})  // u: new and empty, first segment
	v.Add(&nft.Table{})
	v.Add(&nft.Set{Name: "s", Key: []nft.DataType{nft.TypeIPv4Addr}, Interval: true})
	v.Add(&nft.Element{Set: "s", Key: p}) // v: recreated, empty
	l := newLowerer(tx, view)
	if err := l.lower(); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range l.msgs {
		if m.typ == unix.NFT_MSG_NEWSETELEM {
			got = append(got, msgTable(m)+" "+strings.Repeat("e", len(m.elemOps)))
		}
	}
	if d := cmp.Diff([]string{"t ee", "u eee", "v eee"}, got); d != "" {
		t.Errorf("element messages per table (-want +got):\n%s", d)
	}
	var tables []string
	for _, m := range l.msgs {
		tables = append(tables, msgTable(m))
	}
	want := []string{"v", "u", "u", "t", "u", "v", "v", "v"}
	if d := cmp.Diff(want, tables); d != "" {
		t.Errorf("tables of the messages (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]string{"t", "v", "u"}, tx.Tables()); d != "" {
		t.Errorf("Tables() (-want +got):\n%s", d)
	}
}

// TestServiceEndpointMapUdata pins the user data of an endpoint map keyed
// by service to the bytes nft 1.0.6 sent for "add map ip kp m { typeof ip
// daddr . tcp dport . numgen random mod 1 : ip daddr . tcp dport ; }"
// (captured with nft --debug=mnl): nft needs it to list the map and to
// accept rules using it, and decodeSet recognizes the map by it.
func TestServiceEndpointMapUdata(t *testing.T) {
	const captured = "000400000000010400000000035000040d00000001480014000407000000010c00040c00000001040c0000000114000407000000010c000408000000010402000000021a0004170000000112000401000000010401000000020400000000043400040d000000012c00140004070000" +
		"00010c00040c00000001040c0000000114000407000000010c000408000000010402000000060400000000"
	got := hex.EncodeToString(serviceEndpointMapUdata(unix.NFPROTO_IPV4, unix.IPPROTO_TCP))
	if got != captured {
		t.Errorf("user data\n got %s\nwant %s", got, captured)
	}
}
