package nftstate

import (
	"net/netip"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/kernel/nft"
)

// TestPackedKeys: a stored element gives back the key it was added with
// (prefixes masked, protocols in Kubernetes' spelling), and its identity
// is the kernel's: a full-length prefix is its address, nft's "tcp" is
// "TCP", an endpoint map element is its service and index.
func TestPackedKeys(t *testing.T) {
	a, p := netip.MustParseAddr, netip.MustParsePrefix
	for _, key := range [][]nft.Value{
		{{Addr: a("198.19.0.1")}, {Proto: v1.ProtocolTCP}, {Port: 80}},
		{{Addr: a("fd00:19::1")}, {Proto: v1.ProtocolSCTP}, {Port: 65535}},
		{{Prefix: p("198.18.0.0/15")}},
		{{Prefix: p("fd00:18::/64")}},
		{{Addr: a("::ffff:198.18.0.1")}, {Addr: a("198.18.0.1")}},
		{{Port: 0}},
	} {
		e := NewElement(&nft.Element{Key: key})
		if got := e.Key(); !slices.Equal(got, key) {
			t.Errorf("key %v came back as %v", key, got)
		}
		if e.ID() != KeyID(key) {
			t.Errorf("key %v: element ID differs from KeyID", key)
		}
	}
	masked := NewElement(&nft.Element{Key: []nft.Value{{Prefix: p("10.1.2.3/8")}}})
	if got := masked.Key(); got[0].Prefix != p("10.0.0.0/8") {
		t.Errorf("prefix stored as %v, want it masked", got)
	}
	full := NewElement(&nft.Element{Key: []nft.Value{{Prefix: p("192.0.2.1/32")}, {Proto: "tcp"}}})
	if got := full.Key(); got[0].Prefix != p("192.0.2.1/32") || got[1].Proto != v1.ProtocolTCP {
		t.Errorf("key came back as %v, want the /32 and TCP", got)
	}
	if full.ID() != KeyID([]nft.Value{{Addr: a("192.0.2.1")}, {Proto: v1.ProtocolTCP}}) {
		t.Error("a full-length prefix and its address are not one identity")
	}
	svc := []nft.Value{{Addr: a("198.19.0.1")}, {Port: 80}}
	ep := NewElement(&nft.Element{Key: svc, Index: 7, To: netip.MustParseAddrPort("198.18.16.1:8080")})
	if ep.ID() != EndpointID(svc, 7) || ep.ID() == EndpointID(svc, 8) || ep.ID() == KeyID(svc) || !slices.Equal(ep.Key(), svc) ||
		ep.Index() != 7 || ep.To() != netip.MustParseAddrPort("198.18.16.1:8080") {
		t.Errorf("endpoint element: ID %q, key %v, index %d, to %s", ep.ID(), ep.Key(), ep.Index(), ep.To())
	}
	ep6 := NewElement(&nft.Element{Index: 2, To: netip.MustParseAddrPort("[fd00:18:1::1]:443")})
	if ep6.To() != netip.MustParseAddrPort("[fd00:18:1::1]:443") || ep6.Index() != 2 || ep6.ID() != EndpointID(nil, 2) {
		t.Errorf("IPv6 endpoint element: ID %q, index %d, to %s", ep6.ID(), ep6.Index(), ep6.To())
	}
	if plain := NewElement(&nft.Element{Key: svc}); plain.To().IsValid() || plain.Comment() != "" {
		t.Errorf("an element of a set has data %s, comment %q", plain.To(), plain.Comment())
	}
	commented := NewElement(&nft.Element{Key: svc, Index: 3, To: netip.MustParseAddrPort("198.18.16.1:80"), Comment: "ns/svc:http"})
	if got := commented.Elem("m"); got.Comment != "ns/svc:http" || got.Index != 3 || !slices.Equal(got.Key, svc) || commented.ID() != EndpointID(svc, 3) {
		t.Errorf("commented endpoint element: %+v, ID %q", got, commented.ID())
	}
	if idx := NewElement(&nft.Element{Index: 1 << 30, To: netip.MustParseAddrPort("198.18.16.1:80")}); idx.ID() != EndpointID(nil, 1<<30) || len(idx.Key()) != 0 {
		t.Errorf("endpoint element of a map not keyed by service: ID %q, key %v", idx.ID(), idx.Key())
	}
}
