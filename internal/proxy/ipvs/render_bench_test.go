package ipvs

import (
	"fmt"
	"net/netip"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/testutil/fixtures"
)

// bigState is n ClusterIP services (every tenth a NodePort) × 10
// endpoints, two of them local.
func bigState(n int) *model.State {
	var list []svcEps
	for i := range n {
		ip := netip.AddrFrom4([4]byte{198, 19, byte(i >> 8), byte(i)})
		sp := fixtures.ServicePort(fmt.Sprintf("s%d", i), ip.String(), 80, func(sp *model.ServicePort) {
			if i%10 == 0 {
				sp.Type, sp.NodePort = v1.ServiceTypeNodePort, int32(30000+i%2000)
			}
		})
		var eps []*model.Endpoint
		for j := range 10 {
			a := netip.AddrFrom4([4]byte{198, 18, byte(128 + j), byte(i % 250)})
			eps = append(eps, fixtures.Endpoint(a.String(), int32(8000+i/250), j < 2, nil))
		}
		list = append(list, svcEps{sp, eps})
	}
	return stateOf(model.IPv4, list...)
}

// BenchmarkRender: a full render at 1k and 10k services × 10 endpoints
// (go test -run '^$' -bench BenchmarkRender ./internal/proxy/ipvs).
func BenchmarkRender(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		st := bigState(n)
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Render(testConfig(model.IPv4), st, nodeA, Host{Addrs: hostAddrs}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
