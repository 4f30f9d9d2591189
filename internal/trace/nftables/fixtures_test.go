package nftables

// Addresses in these tests:
//
//	10.0.0.10, fd00:10::10     this node (Host.LocalAddrs)
//	10.0.0.11                  another node
//	10.96.0.0/16, fd00:96::/112 ClusterIPs
//	10.180.0.0/16, fd00:180::/64 pod network (cluster CIDR); 10.180.1.0/24 is this node's
//	203.0.113.0/24, 2001:db8::/32 clients outside the cluster
//
// Interfaces: eth0 is the node's uplink, cali* are pod veths.

import (
	"net/netip"
	"strings"

	"github.com/kproxy/kproxy/internal/trace"
	v1 "k8s.io/api/core/v1"
)

var (
	node4 = trace.Host{LocalAddrs: []netip.Addr{netip.MustParseAddr("10.0.0.10")}}
	node6 = trace.Host{LocalAddrs: []netip.Addr{netip.MustParseAddr("fd00:10::10")}}
)

// baseV4 is the fixed part of the ip table, laid out like kproxy's
// nftables proxier: base chains at upstream's priorities, the dispatch maps
// and the masquerade mark flow.
const baseV4 = `add table ip kube-proxy { comment "rules for kube-proxy" ; }
add chain ip kube-proxy filter-prerouting { type filter hook prerouting priority -110 ; }
add chain ip kube-proxy filter-input { type filter hook input priority -110 ; }
add chain ip kube-proxy filter-forward { type filter hook forward priority -110 ; }
add chain ip kube-proxy filter-output { type filter hook output priority -110 ; }
add chain ip kube-proxy filter-output-post-dnat { type filter hook output priority -90 ; }
add chain ip kube-proxy nat-prerouting { type nat hook prerouting priority -100 ; }
add chain ip kube-proxy nat-output { type nat hook output priority -100 ; }
add chain ip kube-proxy nat-postrouting { type nat hook postrouting priority 100 ; }
add chain ip kube-proxy services
add chain ip kube-proxy masquerading
add chain ip kube-proxy mark-for-masquerade
add chain ip kube-proxy reject-chain
add chain ip kube-proxy service-endpoints-check
add chain ip kube-proxy nodeport-endpoints-check
add map ip kube-proxy service-ips { type ipv4_addr . inet_proto . inet_service : verdict ; comment "ClusterIP, ExternalIP and LoadBalancer IP traffic" ; }
add map ip kube-proxy service-nodeports { type inet_proto . inet_service : verdict ; comment "NodePort traffic" ; }
add map ip kube-proxy no-endpoint-services { type ipv4_addr . inet_proto . inet_service : verdict ; }
add map ip kube-proxy no-endpoint-nodeports { type inet_proto . inet_service : verdict ; }
add rule ip kube-proxy filter-input ct state new jump nodeport-endpoints-check
add rule ip kube-proxy filter-input ct state new jump service-endpoints-check
add rule ip kube-proxy filter-forward ct state new jump service-endpoints-check
add rule ip kube-proxy filter-output ct state new jump service-endpoints-check
add rule ip kube-proxy filter-output ct state new jump nodeport-endpoints-check
add rule ip kube-proxy service-endpoints-check ip daddr . meta l4proto . th dport vmap @no-endpoint-services
add rule ip kube-proxy nodeport-endpoints-check fib daddr type local meta l4proto . th dport vmap @no-endpoint-nodeports
add rule ip kube-proxy nat-prerouting jump services
add rule ip kube-proxy nat-output jump services
add rule ip kube-proxy nat-postrouting jump masquerading
add rule ip kube-proxy masquerading meta mark & 0x00004000 == 0 return
add rule ip kube-proxy masquerading meta mark set meta mark ^ 0x00004000
add rule ip kube-proxy masquerading masquerade fully-random
add rule ip kube-proxy mark-for-masquerade meta mark set meta mark | 0x00004000
add rule ip kube-proxy reject-chain reject
add rule ip kube-proxy services ip daddr . meta l4proto . th dport vmap @service-ips
add rule ip kube-proxy services fib daddr type local meta l4proto . th dport vmap @service-nodeports
`

// svcA is ns/a tcp 80 on ClusterIP 10.96.0.10, NodePort 30080, with three
// endpoints, the first on this node. Off-cluster sources are masqueraded.
const svcA = `add chain ip kube-proxy service-AAAA-ns/a/tcp/http
add chain ip kube-proxy external-AAAA-ns/a/tcp/http
add chain ip kube-proxy endpoint-A1-ns/a/tcp/http__10.180.1.1/8080
add chain ip kube-proxy endpoint-A2-ns/a/tcp/http__10.180.2.1/8080
add chain ip kube-proxy endpoint-A3-ns/a/tcp/http__10.180.3.1/8080
add element ip kube-proxy service-ips { 10.96.0.10 . tcp . 80 comment "ns/a:http" : goto service-AAAA-ns/a/tcp/http }
add element ip kube-proxy service-nodeports { tcp . 30080 comment "ns/a:http" : goto external-AAAA-ns/a/tcp/http }
add rule ip kube-proxy service-AAAA-ns/a/tcp/http ip daddr 10.96.0.10 tcp dport 80 ip saddr != 10.180.0.0/16 jump mark-for-masquerade
add rule ip kube-proxy service-AAAA-ns/a/tcp/http numgen random mod 3 vmap { 0 : goto endpoint-A1-ns/a/tcp/http__10.180.1.1/8080, 1 : goto endpoint-A2-ns/a/tcp/http__10.180.2.1/8080, 2 : goto endpoint-A3-ns/a/tcp/http__10.180.3.1/8080 }
add rule ip kube-proxy external-AAAA-ns/a/tcp/http jump mark-for-masquerade comment "masquerade traffic from outside"
add rule ip kube-proxy external-AAAA-ns/a/tcp/http goto service-AAAA-ns/a/tcp/http
add rule ip kube-proxy endpoint-A1-ns/a/tcp/http__10.180.1.1/8080 ip saddr 10.180.1.1 jump mark-for-masquerade
add rule ip kube-proxy endpoint-A1-ns/a/tcp/http__10.180.1.1/8080 meta l4proto tcp dnat to 10.180.1.1:8080
add rule ip kube-proxy endpoint-A2-ns/a/tcp/http__10.180.2.1/8080 ip saddr 10.180.2.1 jump mark-for-masquerade
add rule ip kube-proxy endpoint-A2-ns/a/tcp/http__10.180.2.1/8080 meta l4proto tcp dnat to 10.180.2.1:8080
add rule ip kube-proxy endpoint-A3-ns/a/tcp/http__10.180.3.1/8080 ip saddr 10.180.3.1 jump mark-for-masquerade
add rule ip kube-proxy endpoint-A3-ns/a/tcp/http__10.180.3.1/8080 meta l4proto tcp dnat to 10.180.3.1:8080
`

func pkt(proto v1.Protocol, src, dst string, iif string) trace.Packet {
	s := netip.MustParseAddrPort(src)
	d := netip.MustParseAddrPort(dst)
	return trace.Packet{Src: s.Addr(), SrcPort: s.Port(), Dst: d.Addr(), DstPort: d.Port(), Proto: proto, IIF: iif}
}

func join(parts ...string) string { return strings.Join(parts, "") }

// svcB is ns/b with no endpoints: tcp 80 is rejected, udp 53 dropped.
const svcB = `add element ip kube-proxy no-endpoint-services { 10.96.0.20 . tcp . 80 comment "ns/b:http has no endpoints" : goto reject-chain }
add element ip kube-proxy no-endpoint-services { 10.96.0.20 . udp . 53 comment "ns/b:dns has no endpoints" : drop }
add element ip kube-proxy no-endpoint-nodeports { tcp . 30020 : goto reject-chain }
`

// svcC is ns/c tcp 443 on 10.96.0.30 with ClientIP session affinity and
// two endpoints.
const svcC = `add chain ip kube-proxy service-CCCC-ns/c/tcp/https
add chain ip kube-proxy endpoint-C1-ns/c/tcp/https__10.180.2.5/443
add chain ip kube-proxy endpoint-C2-ns/c/tcp/https__10.180.3.5/443
add set ip kube-proxy affinity-C1-ns/c/tcp/https__10.180.2.5/443 { type ipv4_addr ; flags dynamic,timeout ; timeout 10800s ; }
add set ip kube-proxy affinity-C2-ns/c/tcp/https__10.180.3.5/443 { type ipv4_addr ; flags dynamic,timeout ; timeout 10800s ; }
add element ip kube-proxy service-ips { 10.96.0.30 . tcp . 443 : goto service-CCCC-ns/c/tcp/https }
add rule ip kube-proxy service-CCCC-ns/c/tcp/https ip saddr @affinity-C1-ns/c/tcp/https__10.180.2.5/443 goto endpoint-C1-ns/c/tcp/https__10.180.2.5/443
add rule ip kube-proxy service-CCCC-ns/c/tcp/https ip saddr @affinity-C2-ns/c/tcp/https__10.180.3.5/443 goto endpoint-C2-ns/c/tcp/https__10.180.3.5/443
add rule ip kube-proxy service-CCCC-ns/c/tcp/https numgen random mod 2 vmap { 0 : goto endpoint-C1-ns/c/tcp/https__10.180.2.5/443, 1 : goto endpoint-C2-ns/c/tcp/https__10.180.3.5/443 }
add rule ip kube-proxy endpoint-C1-ns/c/tcp/https__10.180.2.5/443 update @affinity-C1-ns/c/tcp/https__10.180.2.5/443 { ip saddr }
add rule ip kube-proxy endpoint-C1-ns/c/tcp/https__10.180.2.5/443 meta l4proto tcp dnat to 10.180.2.5:443
add rule ip kube-proxy endpoint-C2-ns/c/tcp/https__10.180.3.5/443 update @affinity-C2-ns/c/tcp/https__10.180.3.5/443 { ip saddr }
add rule ip kube-proxy endpoint-C2-ns/c/tcp/https__10.180.3.5/443 meta l4proto tcp dnat to 10.180.3.5:443
`

// baseV6 is a small ip6 table: ClusterIP dispatch on a concatenated key,
// masquerade for off-cluster sources, two endpoints.
const baseV6 = `add table ip6 kube-proxy
add chain ip6 kube-proxy nat-prerouting { type nat hook prerouting priority -100 ; }
add chain ip6 kube-proxy nat-output { type nat hook output priority -100 ; }
add chain ip6 kube-proxy nat-postrouting { type nat hook postrouting priority 100 ; }
add chain ip6 kube-proxy services
add chain ip6 kube-proxy masquerading
add chain ip6 kube-proxy mark-for-masquerade
add chain ip6 kube-proxy service-D-ns/d/udp/dns
add chain ip6 kube-proxy endpoint-D1-ns/d/udp/dns__fd00.180..1/53
add chain ip6 kube-proxy endpoint-D2-ns/d/udp/dns__fd00.180..2/53
add map ip6 kube-proxy service-ips { type ipv6_addr . inet_proto . inet_service : verdict ; }
add element ip6 kube-proxy service-ips { fd00:96::a . udp . 53 : goto service-D-ns/d/udp/dns }
add rule ip6 kube-proxy nat-prerouting jump services
add rule ip6 kube-proxy nat-output jump services
add rule ip6 kube-proxy nat-postrouting jump masquerading
add rule ip6 kube-proxy masquerading meta mark & 0x00004000 == 0 return
add rule ip6 kube-proxy masquerading meta mark set meta mark ^ 0x00004000
add rule ip6 kube-proxy masquerading masquerade fully-random
add rule ip6 kube-proxy mark-for-masquerade meta mark set meta mark | 0x00004000
add rule ip6 kube-proxy services ip6 daddr . meta l4proto . th dport vmap @service-ips
add rule ip6 kube-proxy service-D-ns/d/udp/dns ip6 daddr fd00:96::a udp dport 53 ip6 saddr != fd00:180::/64 jump mark-for-masquerade
add rule ip6 kube-proxy service-D-ns/d/udp/dns numgen random mod 2 vmap { 0 : goto endpoint-D1-ns/d/udp/dns__fd00.180..1/53, 1 : goto endpoint-D2-ns/d/udp/dns__fd00.180..2/53 }
add rule ip6 kube-proxy endpoint-D1-ns/d/udp/dns__fd00.180..1/53 meta l4proto udp dnat to [fd00:180::1]:53
add rule ip6 kube-proxy endpoint-D2-ns/d/udp/dns__fd00.180..2/53 meta l4proto udp dnat to [fd00:180::2]:53
`
