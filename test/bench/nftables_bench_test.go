// Package bench measures kproxy's nftables mode against a real kernel, in
// network namespaces the benchmarks create: full syncs and one-endpoint
// changes at 1k, 10k and 50k services × 10 endpoints.
//
// Run (as root):
//
//	go test ./test/bench -run '^$' -bench . -benchtime 5x
//
// Address plan: 198.18.0.0/16 endpoints (pods), 198.19.0.0/16 and the
// 198.20.0.0/16 overflow... no: service IPs are 198.19.x.y, one per service
// (up to 65k services).
package bench

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/kproxy/kproxy/internal/config"
	"github.com/kproxy/kproxy/internal/kernel/nft/nfnetlink"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy"
	"github.com/kproxy/kproxy/internal/proxy/localdetect"
	"github.com/kproxy/kproxy/internal/proxy/nftables"
)

const endpointsPerService = 10

var sizes = []int{1000, 10000, 50000}

func needRoot(b *testing.B) {
	b.Helper()
	if os.Geteuid() != 0 {
		b.Skip("needs root: creates network namespaces")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		b.Skip("needs iproute2's ip")
	}
}

// newNetns creates a named network namespace and deletes it at cleanup.
func newNetns(b *testing.B) string {
	b.Helper()
	name := fmt.Sprintf("kpbench-%d-%d", os.Getpid(), time.Now().UnixNano()%1e9)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		b.Fatalf("ip netns add: %v: %s", err, out)
	}
	b.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	return name
}

// addr returns the i-th address of a /16 starting at base.
func addr(base [2]byte, i int) netip.Addr {
	return netip.AddrFrom4([4]byte{base[0], base[1], byte(i >> 8), byte(i)})
}

func spn(i int) model.ServicePortName {
	return model.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "bench", Name: "svc-" + strconv.Itoa(i)}, Port: "http", Protocol: model.TCP}
}

// state builds n ClusterIP services with 10 endpoints each, as the proxy
// would hold them. Endpoint j of service i is 198.18.(k>>8).(k) with
// k = i*10+j spread over 198.18.0.0/15 (198.18 and 198.19 would collide
// with service IPs, so endpoints use distinct ports instead of distinct
// addresses beyond 65k).
func state(n int) *model.State {
	st := model.NewState(model.IPv4)
	for i := range n {
		name := spn(i)
		st.Services[name] = &model.ServicePort{
			Name: name, Family: model.IPv4, Type: "ClusterIP",
			ClusterIP: addr([2]byte{198, 19}, i), Port: 80, Protocol: model.TCP,
		}
		eps := make([]*model.Endpoint, endpointsPerService)
		for j := range eps {
			k := i*endpointsPerService + j
			eps[j] = &model.Endpoint{
				IP: addr([2]byte{198, 18}, k%65536), Port: int32(8000 + k/65536),
				Ready: true, Serving: true, NodeName: "node-b",
			}
		}
		st.Endpoints[name] = eps
	}
	return st
}

func newProxier(b *testing.B, ns string) *nftables.Proxier {
	b.Helper()
	iface, err := nfnetlink.NewNetlink(nfnetlink.WithNetNSPath("/run/netns/" + ns))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = iface.Close() })
	opts := nftables.Options{
		Family: model.IPv4,
		ModeOptions: config.ModeOptions{
			MasqueradeBit: 14,
			LocalDetect:   localdetect.Config{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("198.18.0.0/16")}},
			NodeIPs:       []netip.Addr{netip.MustParseAddr("198.17.0.10")},
		},
	}
	p, err := nftables.NewProxier(opts, nftables.Handles{NFT: iface})
	if err != nil {
		b.Fatal(err)
	}
	return p
}

// BenchmarkNFTablesFullSync: the first sync of a node, into an empty
// namespace, through netlink: render + one transaction.
func BenchmarkNFTablesFullSync(b *testing.B) {
	needRoot(b)
	for _, n := range sizes {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			st := state(n)
			all := sets.New[model.ServicePortName]()
			for name := range st.Services {
				all.Insert(name)
			}
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				ns := newNetns(b)
				p := newProxier(b, ns)
				b.StartTimer()
				if _, err := p.Sync(context.Background(), &proxy.Request{State: st, Changed: all, Full: true, Now: time.Now()}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkNFTablesEndpointChange: one endpoint of one service replaced,
// then a partial sync, with N services programmed.
func BenchmarkNFTablesEndpointChange(b *testing.B) {
	needRoot(b)
	for _, n := range sizes {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			st := state(n)
			ns := newNetns(b)
			p := newProxier(b, ns)
			if _, err := p.Sync(context.Background(), &proxy.Request{State: st, Changed: sets.New[model.ServicePortName](), Full: true, Now: time.Now()}); err != nil {
				b.Fatal(err)
			}
			// A large full sync returns its memory to the OS in the
			// background (a forced collection, ~0.2 s at 10k); the
			// runner's minimum sync interval (1 s) keeps the next sync
			// from running into it, so the benchmark waits as long.
			time.Sleep(time.Second)
			b.ResetTimer()
			for i := range b.N {
				name := spn((i * 7919) % n)
				eps := append([]*model.Endpoint(nil), st.Endpoints[name]...)
				e := *eps[0]
				e.Port = int32(20000 + i%20000)
				eps[0] = &e
				st.Endpoints[name] = eps
				if _, err := p.Sync(context.Background(), &proxy.Request{State: st, Changed: sets.New(name), Now: time.Now()}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
