package nftstate

import (
	"net/netip"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/kernel/nft"
)

func TestSetIdentityAndLookup(t *testing.T) {
	a, p := netip.MustParseAddr, netip.MustParsePrefix
	s := NewSet(nft.Set{Name: "s", Key: []nft.DataType{nft.TypeIPv4Addr}, Interval: true}, nft.IPv4)
	s.Add(NewElement(&nft.Element{Key: []nft.Value{{Prefix: p("10.1.2.3/8")}}}))
	s.Add(NewElement(&nft.Element{Key: []nft.Value{{Addr: a("192.0.2.1")}}}))
	// A full-length prefix is its address; host bits do not count.
	if s.Get(KeyID([]nft.Value{{Prefix: p("192.0.2.1/32")}})) == nil || s.Get(KeyID([]nft.Value{{Prefix: p("10.0.0.0/8")}})) == nil {
		t.Errorf("identities: %v", s.index)
	}
	if e := s.Lookup([]nft.Value{{Addr: a("10.9.9.9")}}); e == nil || e.Key()[0].Prefix != p("10.0.0.0/8") {
		t.Errorf("Lookup(10.9.9.9) = %v, want the /8", e)
	}
	if s.Lookup([]nft.Value{{Addr: a("11.0.0.1")}}) != nil {
		t.Error("Lookup(11.0.0.1) found an element")
	}
	// Re-adding replaces in place; removing reindexes.
	s.Add(NewElement(&nft.Element{Key: []nft.Value{{Prefix: p("10.0.0.0/8")}}, Comment: "new"}))
	if s.Len() != 2 || s.Elems[0].Comment() != "new" {
		t.Errorf("after re-add: %d elements, first %+v", s.Len(), s.Elems[0])
	}
	slash8, one := KeyID([]nft.Value{{Prefix: p("10.0.0.0/8")}}), KeyID([]nft.Value{{Addr: a("192.0.2.1")}})
	if !s.Remove(slash8) || s.Remove(slash8) || s.Get(one) != s.Elems[0] {
		t.Error("Remove did not reindex")
	}

	m := NewSet(nft.Set{Name: "m", Endpoints: v1.ProtocolTCP, ByService: true}, nft.IPv4)
	svc := []nft.Value{{Addr: a("10.96.0.1")}, {Port: 80}}
	m.Add(NewElement(&nft.Element{Key: svc, Index: 3, To: netip.MustParseAddrPort("10.0.0.1:8080")}))
	if e := m.Get(EndpointID(svc, 3)); e == nil || e.Index() != 3 || !slices.Equal(e.Key(), svc) || m.Get(EndpointID(nil, 3)) != nil || m.Get(EndpointID(svc, 4)) != nil {
		t.Errorf("endpoint identity: %v", m.index)
	}
}

func TestCloneIsolates(t *testing.T) {
	st := &State{}
	tb := NewTable(nft.IPv4, "t")
	tb.AddChain(&Chain{Def: nft.Chain{Name: "c"}})
	tb.AddSet(NewSet(nft.Set{Name: "s", Key: []nft.DataType{nft.TypeInetService}}, nft.IPv4))
	st.Put(tb)
	c := st.Clone()
	ct := c.Table(nft.IPv4, "t")
	ct.NewRule(nft.Rule{Chain: "c", Stmts: []nft.Stmt{nft.Verdict{Kind: nft.Accept}}}, false, 0, 0)
	ct.Sets["s"].Add(NewElement(&nft.Element{Key: []nft.Value{{Port: 80}}}))
	ct.DeleteChain("c")
	c.Delete(nft.IPv4, "t")
	if len(tb.Chains["c"].Rules) != 0 || tb.Sets["s"].Len() != 0 || tb.Chains["c"] == nil || st.Table(nft.IPv4, "t") == nil {
		t.Error("changes to the clone reached the original")
	}
	if c.Table(nft.IPv4, "t") != nil {
		t.Error("Delete left the table")
	}
}

// TestTxnCopiesOnlyChangedSets: a transaction copies a set when it
// changes it, so the State's sets stay as they were until Commit (and
// after it for a copy taken before), while the sets it does not change
// are the State's own, not copied for every transaction.
func TestTxnCopiesOnlyChangedSets(t *testing.T) {
	st := &State{}
	if err := run(st, Netlink, "add table ip t\nadd set ip t a { type ipv4_addr ; }\nadd set ip t b { type ipv4_addr ; }\n"+
		"add element ip t a { 10.0.0.1, 10.0.0.2 }\nadd element ip t b { 10.0.0.3 }\n"); err != nil {
		t.Fatal(err)
	}
	before := st.Clone()
	a, b := st.Table(nft.IPv4, "t").Sets["a"], st.Table(nft.IPv4, "t").Sets["b"]
	change := "add element ip t a { 10.0.0.4 }\ndelete element ip t a { 10.0.0.1 }\n"

	x := st.Begin(Netlink, 2)
	if err := nft.Read(change, x.SetDef, x.Apply); err != nil {
		t.Fatal(err)
	}
	if a.Len() != 2 || a.Get(KeyID([]nft.Value{{Addr: netip.MustParseAddr("10.0.0.1")}})) == nil {
		t.Error("a transaction not committed changed the State's set")
	}
	if err := x.Commit(); err != nil {
		t.Fatal(err)
	}
	nt := st.Table(nft.IPv4, "t")
	got := []string{}
	for _, e := range nt.Sets["a"].Elems {
		got = append(got, KeyText(e.Key()))
	}
	if !slices.Equal(got, []string{"10.0.0.2", "10.0.0.4"}) {
		t.Errorf("after commit set a holds %v, want 10.0.0.2 and 10.0.0.4", got)
	}
	if nt.Sets["b"] != b {
		t.Error("the transaction copied set b, which it did not change")
	}
	if a.Len() != 2 || before.Table(nft.IPv4, "t").Sets["a"].Len() != 2 {
		t.Error("the commit changed the set a copy taken before holds")
	}
	// A flush and a timeout change copy the set too.
	if err := run(st, Netlink, "flush set ip t b\n"); err != nil {
		t.Fatal(err)
	}
	if b.Len() != 1 || st.Table(nft.IPv4, "t").Sets["b"].Len() != 0 {
		t.Error("flush: the old set changed, or the new one was not flushed")
	}
}
