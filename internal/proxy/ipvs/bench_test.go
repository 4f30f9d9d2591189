package ipvs

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/kproxy/kproxy/internal/kernel/conntrack"
	"github.com/kproxy/kproxy/internal/kernel/ipset"
	"github.com/kproxy/kproxy/internal/kernel/ipset/ipsettest"
	"github.com/kproxy/kproxy/internal/kernel/ipvs"
	"github.com/kproxy/kproxy/internal/kernel/ipvs/ipvstest"
	"github.com/kproxy/kproxy/internal/kernel/netdev/netdevtest"
	"github.com/kproxy/kproxy/internal/kernel/xtables"
	"github.com/kproxy/kproxy/internal/kernel/xtables/xtablestest"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy"
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

// bigPlan has n TCP services of 10 endpoints each, on 198.19.x.y:80.
func bigPlan(n int) *Plan {
	d := &Plan{Services: map[ipvs.VirtualServer]*VirtualServer{}, Sets: map[string]*Set{
		"KUBE-CLUSTER-IP": {Set: ipset.Set{Name: "KUBE-CLUSTER-IP", Type: "hash:ip,port"}},
	}, IPTables: []byte("*nat\n:KUBE-SERVICES - [0:0]\nCOMMIT\n")}
	for i := 0; i < n; i++ {
		a := netip.AddrFrom4([4]byte{198, 19, byte(i >> 8), byte(i)})
		vs := vsOf(protoTCP, a, 80)
		var rs []ipvs.Destination
		for j := 0; j < 10; j++ {
			rs = append(rs, ipvs.Destination{Addr: netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)}), Port: uint16(8000 + j), Weight: 1})
		}
		d.Addresses = append(d.Addresses, a)
		d.Services[vs] = &VirtualServer{Service: ipvs.Service{VirtualServer: vs, Scheduler: "rr"}, Reals: rs}
		d.Sets["KUBE-CLUSTER-IP"].Entries = append(d.Sets["KUBE-CLUSTER-IP"].Entries, a.String()+",tcp:80")
	}
	return d
}

// BenchmarkProxierOneChange: one endpoint change (one real server's
// port) in n services × 10 endpoints, on the fakes: the proxier's own
// cost, which must not grow with n. (Kernel figures come from the VM.)
func BenchmarkProxierOneChange(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			d := bigPlan(n)
			p := newProxier(Options{Config: Config{Family: model.IPv4}}, FullRenderer(func(*proxy.Request, Host) (*Plan, error) { return d, nil }),
				Handles{IPVS: ipvstest.New(), IPSet: ipsettest.New(), NetDev: netdevtest.New(), IPTables: xtablestest.NewFake(xtables.Legacy, xtables.IPv4), Conntrack: &conntrack.Fake{}})
			req := &proxy.Request{State: model.NewState(model.IPv4), Full: true}
			if _, err := p.Sync(context.Background(), req); err != nil {
				b.Fatal(err)
			}
			req.Full = false
			vs := vsOf(protoTCP, netip.AddrFrom4([4]byte{198, 19, 0, 7}), 80)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				d.Services[vs].Reals[0].Port = uint16(9000 + i%2)
				if _, err := p.Sync(context.Background(), req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkSyncOneEndpointChange: the whole partial sync of one endpoint
// change (render of the changed service port, diff, apply) in n services
// × 10 endpoints, on the fakes, with the renderer kproxy runs. Its cost
// follows the change: the same at 1k, 10k and 50k.
//
//	go test -run '^$' -bench BenchmarkSyncOneEndpointChange ./internal/proxy/ipvs
func BenchmarkSyncOneEndpointChange(b *testing.B) {
	for _, n := range []int{1000, 10000, 50000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			st := bigState(n)
			k := newKernel(model.IPv4)
			p := newProxier(Options{Config: Config{Family: model.IPv4}}, NewPartialRenderer(testConfig(model.IPv4)), k.handles(model.IPv4))
			if _, err := p.Sync(context.Background(), &proxy.Request{State: st, Node: nodeA, Full: true}); err != nil {
				b.Fatal(err)
			}
			name := st.SortedNames()[n/2]
			eps := st.Endpoints[name]
			req := &proxy.Request{State: st, Node: nodeA, Changed: sets.New(name)}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				// An endpoint goes not ready, then comes back.
				e := *eps[3]
				e.Ready = i%2 == 1
				next := slices.Clone(eps)
				next[3] = &e
				st.Endpoints[name] = next
				if _, err := p.Sync(context.Background(), req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkFullSync: the first sync (render and program everything) of n
// services × 10 endpoints on the fakes.
func BenchmarkFullSync(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			st := bigState(n)
			b.ReportAllocs()
			for b.Loop() {
				k := newKernel(model.IPv4)
				p := newProxier(Options{Config: Config{Family: model.IPv4}}, NewPartialRenderer(testConfig(model.IPv4)), k.handles(model.IPv4))
				if _, err := p.Sync(context.Background(), &proxy.Request{State: st, Node: nodeA, Full: true}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
