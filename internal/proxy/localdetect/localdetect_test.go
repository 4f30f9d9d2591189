package localdetect

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kproxy/kproxy/internal/model"
)

func TestNewIPTables(t *testing.T) {
	node := &model.Node{Name: "node-a", PodCIDRs: []netip.Prefix{netip.MustParsePrefix("198.18.129.0/24"), netip.MustParsePrefix("fd00:18:1:a::/64")}}
	cidrs := []netip.Prefix{netip.MustParsePrefix("198.18.128.1/17")}
	for _, tc := range []struct {
		name string
		c    Config
		node *model.Node
		want IPTables
	}{
		{"cluster CIDR, masked", Config{Mode: ClusterCIDR, Family: model.IPv4, ClusterCIDRs: cidrs}, nil,
			IPTables{IfLocal: []string{"-s", "198.18.128.0/17"}, IfNotLocal: []string{"!", "-s", "198.18.128.0/17"}}},
		{"empty mode is ClusterCIDR", Config{Family: model.IPv4, ClusterCIDRs: cidrs}, nil,
			IPTables{IfLocal: []string{"-s", "198.18.128.0/17"}, IfNotLocal: []string{"!", "-s", "198.18.128.0/17"}}},
		{"no cluster CIDR", Config{Mode: ClusterCIDR, Family: model.IPv4}, nil, IPTables{}},
		{"node CIDR of the family", Config{Mode: NodeCIDR, Family: model.IPv6}, node,
			IPTables{IfLocal: []string{"-s", "fd00:18:1:a::/64"}, IfNotLocal: []string{"!", "-s", "fd00:18:1:a::/64"}}},
		{"node CIDR, node unknown", Config{Mode: NodeCIDR, Family: model.IPv4}, nil, IPTables{}},
		{"bridge", Config{Mode: BridgeInterface, BridgeInterface: "cbr0"}, nil,
			IPTables{IfLocal: []string{"-i", "cbr0"}, IfNotLocal: []string{"!", "-i", "cbr0"}}},
		{"prefix", Config{Mode: InterfaceNamePrefix, InterfaceNamePrefix: "veth"}, nil,
			IPTables{IfLocal: []string{"-i", "veth+"}, IfNotLocal: []string{"!", "-i", "veth+"}}},
		{"empty prefix", Config{Mode: InterfaceNamePrefix}, nil, IPTables{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := NewIPTables(tc.c, tc.node)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
			if got.Implemented() != (len(tc.want.IfNotLocal) > 0) {
				t.Errorf("Implemented() = %v", got.Implemented())
			}
		})
	}
}

// Resolve is what every mode's detector is written from. For ClusterCIDR
// it is the family's first cluster CIDR, as upstream's getLocalDetectors
// (cidrs[0]): a second one of the family is not local.
func TestResolve(t *testing.T) {
	node := &model.Node{Name: "node-a", PodCIDRs: []netip.Prefix{
		netip.MustParsePrefix("198.18.129.0/24"), netip.MustParsePrefix("198.18.130.0/24"), netip.MustParsePrefix("fd00:18:1:a::/64")}}
	cidrs := []netip.Prefix{netip.MustParsePrefix("198.18.128.0/17"), netip.MustParsePrefix("198.18.0.0/17")}
	for _, tc := range []struct {
		name string
		c    Config
		node *model.Node
		want Match
	}{
		{"cluster CIDRs: the first of the family", Config{Mode: ClusterCIDR, Family: model.IPv4, ClusterCIDRs: cidrs}, node, Match{CIDRs: cidrs[:1]}},
		{"empty mode is ClusterCIDR", Config{Family: model.IPv4, ClusterCIDRs: cidrs}, nil, Match{CIDRs: cidrs[:1]}},
		{"node CIDR: the first of the family", Config{Mode: NodeCIDR, Family: model.IPv4}, node, Match{CIDRs: []netip.Prefix{netip.MustParsePrefix("198.18.129.0/24")}}},
		{"node CIDR, IPv6", Config{Mode: NodeCIDR, Family: model.IPv6}, node, Match{CIDRs: []netip.Prefix{netip.MustParsePrefix("fd00:18:1:a::/64")}}},
		{"node CIDR, node unknown", Config{Mode: NodeCIDR, Family: model.IPv4}, nil, Match{}},
		{"bridge", Config{Mode: BridgeInterface, BridgeInterface: "cbr0"}, nil, Match{Interface: "cbr0"}},
		{"prefix", Config{Mode: InterfaceNamePrefix, InterfaceNamePrefix: "veth"}, nil, Match{Interface: "veth", Prefix: true}},
	} {
		got := Resolve(tc.c, tc.node)
		if diff := cmp.Diff(tc.want, got, cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); diff != "" {
			t.Errorf("%s: (-want +got):\n%s", tc.name, diff)
		}
	}
}
