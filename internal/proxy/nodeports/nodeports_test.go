package nodeports

// Addresses: 198.18.0.10 / fd00:18::10 the node's primary IPs (LAN),
// 198.18.129.1 / fd00:18:1:a::1 its pod gateway, 198.19.0.0/16 service IPs
// (never local), 127.0.0.1 and ::1 loopback.

import (
	"net/netip"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kproxy/kproxy/internal/model"
)

var local = []netip.Addr{
	netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("198.18.0.10"), netip.MustParseAddr("198.18.129.1"),
	netip.MustParseAddr("::1"), netip.MustParseAddr("fd00:18::10"), netip.MustParseAddr("fd00:18:1:a::1"),
}

func addrs(s ...string) []netip.Addr {
	var out []netip.Addr
	for _, a := range s {
		out = append(out, netip.MustParseAddr(a))
	}
	return out
}

func TestNew(t *testing.T) {
	v4, v6 := netip.MustParseAddr("198.18.0.10"), netip.MustParseAddr("fd00:18::10")
	for _, tc := range []struct {
		name       string
		configured []string
		nodeIP4    netip.Addr
		nodeIP6    netip.Addr
		// want4/want6: the matched local addresses; nil with all4/all6.
		all4, all6       bool
		want4, want6     []netip.Addr
		ipv4Loopback     bool
		explicitLoopback bool
	}{
		{name: "unset: all", nodeIP4: v4, nodeIP6: v6, all4: true, all6: true, ipv4Loopback: true},
		{name: "all", configured: []string{"all"}, nodeIP4: v4, nodeIP6: v6, all4: true, all6: true, ipv4Loopback: true},
		{name: "primary", configured: []string{"primary"}, nodeIP4: v4, nodeIP6: v6,
			want4: addrs("198.18.0.10"), want6: addrs("fd00:18::10")},
		// A family without a known primary IP has no CIDR: all, as upstream.
		{name: "primary, IPv4 node IP only", configured: []string{"primary"}, nodeIP4: v4,
			want4: addrs("198.18.0.10"), all6: true},
		{name: "primary, loopback node IP skipped", configured: []string{"primary"}, nodeIP4: netip.MustParseAddr("127.0.0.1"), nodeIP6: v6,
			all4: true, ipv4Loopback: true, want6: addrs("fd00:18::10")},
		{name: "localhost", configured: []string{"localhost"}, nodeIP4: v4, nodeIP6: v6,
			want4: addrs("127.0.0.1"), want6: addrs("::1"), ipv4Loopback: true, explicitLoopback: true},
		{name: "primary and localhost", configured: []string{"primary", "localhost"}, nodeIP4: v4, nodeIP6: v6,
			want4: addrs("127.0.0.1", "198.18.0.10"), want6: addrs("::1", "fd00:18::10"), ipv4Loopback: true, explicitLoopback: true},
		// CIDRs of one family only: the other family on all its addresses.
		{name: "IPv4 CIDR only", configured: []string{"198.18.129.0/24"}, nodeIP4: v4, nodeIP6: v6,
			want4: addrs("198.18.129.1"), all6: true},
		{name: "IPv6 CIDR only", configured: []string{"fd00:18:1:a::/64"}, nodeIP4: v4, nodeIP6: v6,
			all4: true, ipv4Loopback: true, want6: addrs("fd00:18:1:a::1")},
		{name: "CIDRs of both families", configured: []string{"198.18.0.0/24", "fd00:18:1:a::/64"}, nodeIP4: v4, nodeIP6: v6,
			want4: addrs("198.18.0.10"), want6: addrs("fd00:18:1:a::1")},
		{name: "primary and a CIDR", configured: []string{"primary", "198.18.129.0/24"}, nodeIP4: v4, nodeIP6: v6,
			want4: addrs("198.18.0.10", "198.18.129.1"), want6: addrs("fd00:18::10")},
		// The zero CIDR wins over everything listed with it.
		{name: "all and a CIDR", configured: []string{"198.18.129.0/24", "all"}, nodeIP4: v4, nodeIP6: v6,
			all4: true, all6: true, ipv4Loopback: true},
		{name: "zero CIDR of one family", configured: []string{"0.0.0.0/0", "fd00:18::/64"}, nodeIP4: v4, nodeIP6: v6,
			all4: true, ipv4Loopback: true, want6: addrs("fd00:18::10")},
		{name: "explicit loopback after the zero CIDR", configured: []string{"all", "127.0.0.1/32"},
			all4: true, all6: true, ipv4Loopback: true, explicitLoopback: true},
		{name: "a CIDR matching nothing local", configured: []string{"198.19.0.0/16", "fd00:19::/112"}, nodeIP4: v4, nodeIP6: v6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, f := range []struct {
				fam  v1.IPFamily
				ip   netip.Addr
				all  bool
				want []netip.Addr
			}{{model.IPv4, tc.nodeIP4, tc.all4, tc.want4}, {model.IPv6, tc.nodeIP6, tc.all6, tc.want6}} {
				a := New(f.fam, tc.configured, f.ip)
				if a.MatchAll != f.all {
					t.Errorf("%s: MatchAll = %v, want %v (CIDRs %v)", f.fam, a.MatchAll, f.all, a.CIDRs)
				}
				if !f.all {
					if got := a.Match(local); !slices.Equal(got, f.want) {
						t.Errorf("%s: Match = %v, want %v (CIDRs %v)", f.fam, got, f.want, a.CIDRs)
					}
				}
				if f.fam == model.IPv4 {
					if a.ContainsIPv4Loopback != tc.ipv4Loopback {
						t.Errorf("ContainsIPv4Loopback = %v, want %v", a.ContainsIPv4Loopback, tc.ipv4Loopback)
					}
					if a.ContainsExplicitLoopback != tc.explicitLoopback {
						t.Errorf("IPv4 ContainsExplicitLoopback = %v, want %v", a.ContainsExplicitLoopback, tc.explicitLoopback)
					}
				}
			}
		})
	}
}

func TestExpand(t *testing.T) {
	got := Expand([]string{"primary", "localhost", "all", "198.18.0.0/24"}, map[v1.IPFamily]netip.Addr{
		model.IPv4: netip.MustParseAddr("198.18.0.10"), model.IPv6: netip.MustParseAddr("fd00:18::10"),
	})
	want := []string{"198.18.0.10/32", "fd00:18::10/128", "127.0.0.0/8", "::1/128", "0.0.0.0/0", "::/0", "198.18.0.0/24"}
	if !slices.Equal(got, want) {
		t.Fatalf("Expand = %v, want %v", got, want)
	}
}

// TestNodeIPs: the primary IP is the first InternalIP of the family, then
// the first ExternalIP (upstream's GetNodeHostIPs), whatever the order in
// the Node's status; bindAddress overrides it.
func TestNodeIPs(t *testing.T) {
	n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}, Status: v1.NodeStatus{Addresses: []v1.NodeAddress{
		{Type: v1.NodeHostName, Address: "node-a"},
		{Type: v1.NodeExternalIP, Address: "203.0.113.10"},
		{Type: v1.NodeExternalIP, Address: "fd00:18::99"},
		{Type: v1.NodeInternalIP, Address: "198.18.0.10"},
		{Type: v1.NodeInternalIP, Address: "198.18.0.12"},
	}}}
	node, errs := model.ConvertNode(n)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	if got := NodeIPs(model.IPv4, nil, node); !slices.Equal(got, addrs("198.18.0.10")) {
		t.Errorf("IPv4 = %v, want [198.18.0.10] (InternalIP before ExternalIP)", got)
	}
	if got := NodeIPs(model.IPv6, nil, node); !slices.Equal(got, addrs("fd00:18::99")) {
		t.Errorf("IPv6 = %v, want [fd00:18::99] (the only IPv6 address, an ExternalIP)", got)
	}
	if got := NodeIPs(model.IPv4, addrs("198.18.0.50"), node); !slices.Equal(got, addrs("198.18.0.50")) {
		t.Errorf("IPv4 with bindAddress = %v, want [198.18.0.50]", got)
	}
	if got := NodeIPs(model.IPv4, nil, nil); got != nil {
		t.Errorf("no node: %v, want none", got)
	}
}

func TestCoversIPv4Loopback(t *testing.T) {
	for _, tc := range []struct {
		configured []string
		want       bool
	}{
		{nil, true},
		{[]string{"all"}, true},
		{[]string{"localhost"}, true},
		{[]string{"primary"}, false},
		{[]string{"primary", "localhost"}, true},
		{[]string{"198.18.0.0/24"}, false},
		{[]string{"fd00:18::/64"}, true}, // IPv4 left on all its addresses
		{[]string{"127.0.0.1/32"}, true},
	} {
		if got := CoversIPv4Loopback(tc.configured); got != tc.want {
			t.Errorf("CoversIPv4Loopback(%q) = %v, want %v", tc.configured, got, tc.want)
		}
	}
}
