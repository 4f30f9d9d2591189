package bench

// ipvs mode's render on the same synthetic clusters as the other modes'
// (N ClusterIP services × 10 endpoints, IPv4). Its syncs against a kernel
// need IPVS and ipset modules; on the fakes they are guarded beside the
// package (internal/proxy/ipvs/bench_test.go).

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy/ipvs"
	"github.com/kproxy/kproxy/internal/proxy/localdetect"
)

// BenchmarkIPVSRender: the pure part of a full sync (no root needed):
// virtual and real servers, ipset members and the iptables-restore input.
//
//	go test ./test/bench -run '^$' -bench 'IPVSRender' -benchtime 5x
func BenchmarkIPVSRender(b *testing.B) {
	nodeIP := netip.MustParseAddr("198.17.0.10")
	node := &model.Node{Name: "node-a", Addresses: []netip.Addr{nodeIP}}
	cfg := &ipvs.Config{
		Family: model.IPv4, NodeName: node.Name, MasqueradeBit: 14,
		LocalDetect: localdetect.Config{Mode: localdetect.ClusterCIDR, ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("198.18.0.0/16")}},
		NodeIPs:     []netip.Addr{nodeIP},
	}
	for _, n := range sizes {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			st := state(n)
			b.ReportAllocs()
			b.ResetTimer()
			var servers int
			for range b.N {
				p, err := ipvs.Render(cfg, st, node, ipvs.Host{Addrs: node.Addresses})
				if err != nil {
					b.Fatal(err)
				}
				servers = len(p.Services)
			}
			b.ReportMetric(float64(servers), "virtual-servers")
		})
	}
}
