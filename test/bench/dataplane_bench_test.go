package bench

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/kproxy/kproxy/internal/config"
	"github.com/kproxy/kproxy/internal/kernel/nft/nfnetlink"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy"
	"github.com/kproxy/kproxy/internal/proxy/localdetect"
	"github.com/kproxy/kproxy/internal/proxy/nftables"
	"github.com/kproxy/kproxy/internal/testutil/netns"
)

// BenchmarkNFTablesDataPlane connects through kproxy's rules to a service
// of the first, the middle and the last of the shard tables of 20000
// services: verdict maps make the cost of a new connection independent of
// the service's position (iptables' linear KUBE-SERVICES chain would not),
// and the shards add one map lookup each, a small constant. The node namespace holds the rules and
// the client; every service's single endpoint is a server in a pod
// namespace behind a veth (198.18.129.2:8080).
func BenchmarkNFTablesDataPlane(b *testing.B) {
	needRoot(b)
	const n = 20000
	id := netns.RandomID(6)
	node := netns.New(b, id, "node")
	pod := netns.New(b, id, "pod")
	if err := netns.Veth(node, "veth-pod", pod, "eth0"); err != nil {
		b.Fatal(err)
	}
	nodeIP, podIP := netip.MustParsePrefix("198.18.129.1/24"), netip.MustParsePrefix("198.18.129.2/24")
	for _, step := range []error{
		node.AddAddr("veth-pod", nodeIP), pod.AddAddr("eth0", podIP),
		node.LinkUp("veth-pod"), pod.LinkUp("eth0"),
		pod.AddRoute(netip.MustParsePrefix("0.0.0.0/0"), nodeIP.Addr()),
		// A node has a route for service IPs (usually its default route);
		// the connect needs one before the rules DNAT it.
		node.AddRoute(netip.MustParsePrefix("198.19.0.0/16"), podIP.Addr()),
	} {
		if step != nil {
			b.Fatal(step)
		}
	}
	netns.ServeEcho(b, pod, "pod", "tcp", 8080)

	st := model.NewState(model.IPv4)
	for i := range n {
		name := spn(i)
		st.Services[name] = &model.ServicePort{Name: name, Family: model.IPv4, Type: "ClusterIP",
			ClusterIP: addr([2]byte{198, 19}, i), Port: 80, Protocol: model.TCP}
		st.Endpoints[name] = []*model.Endpoint{{IP: podIP.Addr(), Port: 8080, Ready: true, Serving: true, NodeName: "node-b"}}
	}
	iface, err := nfnetlink.NewNetlink(nfnetlink.WithNetNSPath("/run/netns/" + node.Name))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = iface.Close() })
	p, err := nftables.NewProxier(nftables.Options{Family: model.IPv4, ModeOptions: config.ModeOptions{MasqueradeBit: 14,
		LocalDetect: localdetect.Config{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("198.18.128.0/17")}}}}, nftables.Handles{NFT: iface})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := p.Sync(context.Background(), &proxy.Request{State: st, Changed: sets.New[model.ServicePortName](), Full: true, Now: time.Now()}); err != nil {
		b.Fatal(err)
	}
	// Services are spread over shard tables whose nat chains a new
	// connection passes in order until one DNATs: take one service of
	// the first, the middle and the last shard (and the first, middle and
	// last service of the map otherwise).
	k := nftablesShards(n)
	inShard := func(shard int) int {
		for i := range n {
			if nftables.ShardOf(spn(i), k) == shard {
				return i
			}
		}
		return 0
	}
	for _, tc := range []struct {
		name string
		i    int
	}{{"first", inShard(0)}, {"middle", inShard(k / 2)}, {"last", inShard(k - 1)}} {
		b.Run(fmt.Sprintf("services=%d/%s", n, tc.name), func(b *testing.B) {
			dst := netip.AddrPortFrom(addr([2]byte{198, 19}, tc.i), 80)
			b.ResetTimer()
			for range b.N {
				c, err := node.DialTCP(dst, netns.DialOptions{Timeout: 2 * time.Second})
				if err != nil {
					b.Fatalf("connect to %s: %v", dst, err)
				}
				c.Close()
			}
		})
	}
}
