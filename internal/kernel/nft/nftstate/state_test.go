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
	if s.Len() != 2 || s.Elems[0].Comment != "new" {
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
