package nodeports

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/model"
)

// TestHealthCheckAddrs: the health check node ports listen where the node
// ports answer (upstream's service health server on nodePortAddresses).
// Addresses: node 198.18.0.10 / fd00:18::10, a second address 198.18.5.1.
func TestHealthCheckAddrs(t *testing.T) {
	a := netip.MustParseAddr
	local := []netip.Addr{a("127.0.0.1"), a("::1"), a("198.18.0.10"), a("198.18.5.1"), a("fd00:18::10")}
	node := &model.Node{Name: "node-a", Addresses: []netip.Addr{a("198.18.0.10"), a("fd00:18::10")}}
	both := []v1.IPFamily{model.IPv4, model.IPv6}
	all4, all6 := netip.IPv4Unspecified(), netip.IPv6Unspecified()
	for _, tc := range []struct {
		name     string
		npa      []string
		bind     string
		node     *model.Node
		localErr error
		fams     []v1.IPFamily
		want     []netip.Addr
	}{
		{name: "nftables default (primary): the primary IPs", npa: []string{"primary"}, node: node, fams: both,
			want: []netip.Addr{a("198.18.0.10"), a("fd00:18::10")}},
		{name: "iptables default (none): every address", node: node, fams: both,
			want: []netip.Addr{all4, all6}},
		{name: "a CIDR of one family; the other family on all", npa: []string{"198.18.5.0/24"}, node: node, fams: both,
			want: []netip.Addr{a("198.18.5.1"), all6}},
		{name: "a CIDR that matches no local address", npa: []string{"198.18.9.0/24", "fd00:99::/64"}, node: node, fams: both,
			want: nil},
		{name: "primary with bindAddress", npa: []string{"primary"}, bind: "198.18.5.1", node: node, fams: []v1.IPFamily{model.IPv4},
			want: []netip.Addr{a("198.18.5.1")}},
		{name: "all keyword", npa: []string{"all"}, node: node, fams: both,
			want: []netip.Addr{all4, all6}},
		{name: "the node's IP changed", npa: []string{"primary"}, node: &model.Node{Name: "node-a", Addresses: []netip.Addr{a("198.18.5.1")}}, fams: []v1.IPFamily{model.IPv4},
			want: []netip.Addr{a("198.18.5.1")}},
		{name: "local addresses unreadable: every address", npa: []string{"primary"}, node: node, fams: both, localErr: errors.New("boom"),
			want: []netip.Addr{all4, all6}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := HealthCheckAddrs(tc.npa, tc.bind, tc.fams, tc.node, func() ([]netip.Addr, error) { return local, tc.localErr })
			if diff := cmp.Diff(tc.want, got, cmpopts.EquateEmpty(), cmp.Comparer(func(x, y netip.Addr) bool { return x == y })); diff != "" {
				t.Errorf("addresses (-want +got):\n%s", diff)
			}
		})
	}
}
