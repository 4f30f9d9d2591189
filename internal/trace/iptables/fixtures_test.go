package iptables

// Addresses in these tests:
//
//	10.0.0.10                  this node (Host.LocalAddrs)
//	10.96.0.0/16               ClusterIPs
//	10.180.0.0/16              pod network (cluster CIDR); 10.180.1.0/24 is this node's
//	192.0.2.0/24               external IPs and load balancer IPs (not on the node)
//	203.0.113.0/24             clients outside the cluster; 203.0.113.0/25 may reach svc4's LB
//	fd00:96::/112, fd00:180::/64, fd00:10::10   the IPv6 equivalents
//
// Interfaces: eth0 is the node's uplink, cali* are pod veths.
//
// The rulesets are laid out as upstream kube-proxy's iptables mode writes
// them (pkg/proxy/iptables/proxier.go): the jumps from the built-in chains
// it adds with `iptables -I`, then what its restore writes. Chain hashes
// are made up.

import (
	"net/netip"
	"strings"

	"github.com/kproxy/kproxy/internal/trace"
)

var (
	nodeIP = netip.MustParseAddr("10.0.0.10")
	node4  = trace.Host{LocalAddrs: []netip.Addr{nodeIP}}
)

// svcRules is one service port's share of a dump.
type svcRules struct {
	filter    string // rules in the filter table
	natChains string // its nat chain lines
	nat       string // rules in nat KUBE-SERVICES and KUBE-NODEPORTS
	natOwn    string // rules in its own nat chains
}

// dump assembles a full iptables-save from the fixed kube-proxy chains and
// the given services, keeping upstream's order (the nodeports jump last
// in KUBE-SERVICES).
func dump(svcs ...svcRules) string {
	var filter, natChains, nat, natOwn strings.Builder
	for _, s := range svcs {
		filter.WriteString(s.filter)
		natChains.WriteString(s.natChains)
		nat.WriteString(s.nat)
		natOwn.WriteString(s.natOwn)
	}
	return `*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-EXTERNAL-SERVICES - [0:0]
:KUBE-FIREWALL - [0:0]
:KUBE-FORWARD - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-PROXY-FIREWALL - [0:0]
:KUBE-SERVICES - [0:0]
-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
-A INPUT -m comment --comment "kubernetes health check service ports" -j KUBE-NODEPORTS
-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES
-A INPUT -j KUBE-FIREWALL
-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
-A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES
-A OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
-A OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -j KUBE-FIREWALL
-A KUBE-FIREWALL -m comment --comment "block incoming localnet connections" -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP
-A KUBE-FORWARD -m conntrack --ctstate INVALID -m nfacct --nfacct-name ct_state_invalid_dropped_pkts -j DROP
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x4000/0x4000 -j ACCEPT
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
` + filter.String() + `COMMIT
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-SERVICES - [0:0]
` + natChains.String() + `-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully
` + nat.String() + `-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
` + natOwn.String() + `COMMIT
`
}

// svc1: ClusterIP 10.96.0.1:80 and NodePort 30080 (Cluster policy), three
// endpoints, one of them (10.180.1.1) on this node; the localhost NodePort
// rule counts with nfacct as upstream writes it when the counter exists.
var svc1 = svcRules{
	natChains: `:KUBE-EXT-AAAAAAAAAAAAAAAA - [0:0]
:KUBE-SVC-AAAAAAAAAAAAAAAA - [0:0]
:KUBE-SEP-AAAAAAAAAAAAAAA1 - [0:0]
:KUBE-SEP-AAAAAAAAAAAAAAA2 - [0:0]
:KUBE-SEP-AAAAAAAAAAAAAAA3 - [0:0]
`,
	nat: `-A KUBE-NODEPORTS -m comment --comment ns1/svc1:p80 -m tcp -p tcp -d 127.0.0.0/8 --dport 30080 -m nfacct --nfacct-name localhost_nps_accepted_pkts -j KUBE-EXT-AAAAAAAAAAAAAAAA
-A KUBE-NODEPORTS -m comment --comment ns1/svc1:p80 -m tcp -p tcp --dport 30080 -j KUBE-EXT-AAAAAAAAAAAAAAAA
-A KUBE-SERVICES -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp -p tcp -d 10.96.0.1 --dport 80 -j KUBE-SVC-AAAAAAAAAAAAAAAA
`,
	natOwn: `-A KUBE-EXT-AAAAAAAAAAAAAAAA -m comment --comment "masquerade traffic for ns1/svc1:p80 external destinations" -j KUBE-MARK-MASQ
-A KUBE-EXT-AAAAAAAAAAAAAAAA -j KUBE-SVC-AAAAAAAAAAAAAAAA
-A KUBE-SVC-AAAAAAAAAAAAAAAA -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp -p tcp -d 10.96.0.1 --dport 80 ! -s 10.180.0.0/16 -j KUBE-MARK-MASQ
-A KUBE-SVC-AAAAAAAAAAAAAAAA -m comment --comment "ns1/svc1:p80 -> 10.180.1.1:8080" -m statistic --mode random --probability 0.3333333333 -j KUBE-SEP-AAAAAAAAAAAAAAA1
-A KUBE-SVC-AAAAAAAAAAAAAAAA -m comment --comment "ns1/svc1:p80 -> 10.180.2.1:8080" -m statistic --mode random --probability 0.5000000000 -j KUBE-SEP-AAAAAAAAAAAAAAA2
-A KUBE-SVC-AAAAAAAAAAAAAAAA -m comment --comment "ns1/svc1:p80 -> 10.180.3.1:8080" -j KUBE-SEP-AAAAAAAAAAAAAAA3
-A KUBE-SEP-AAAAAAAAAAAAAAA1 -m comment --comment ns1/svc1:p80 -s 10.180.1.1 -j KUBE-MARK-MASQ
-A KUBE-SEP-AAAAAAAAAAAAAAA1 -m comment --comment ns1/svc1:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.1.1:8080
-A KUBE-SEP-AAAAAAAAAAAAAAA2 -m comment --comment ns1/svc1:p80 -s 10.180.2.1 -j KUBE-MARK-MASQ
-A KUBE-SEP-AAAAAAAAAAAAAAA2 -m comment --comment ns1/svc1:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.2.1:8080
-A KUBE-SEP-AAAAAAAAAAAAAAA3 -m comment --comment ns1/svc1:p80 -s 10.180.3.1 -j KUBE-MARK-MASQ
-A KUBE-SEP-AAAAAAAAAAAAAAA3 -m comment --comment ns1/svc1:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.3.1:8080
`,
}

// svc2: externalTrafficPolicy Local; ClusterIP 10.96.0.2:80, NodePort
// 30081, LoadBalancer IP 192.0.2.2, health check node port 30500; one
// endpoint on this node (10.180.1.2) and one elsewhere (10.180.2.2).
var svc2 = svcRules{
	filter: `-A KUBE-NODEPORTS -m comment --comment "ns2/svc2:p80 health check node port" -m tcp -p tcp --dport 30500 -j ACCEPT
`,
	natChains: `:KUBE-EXT-BBBBBBBBBBBBBBBB - [0:0]
:KUBE-SVC-BBBBBBBBBBBBBBBB - [0:0]
:KUBE-SVL-BBBBBBBBBBBBBBBB - [0:0]
:KUBE-SEP-BBBBBBBBBBBBBBB1 - [0:0]
:KUBE-SEP-BBBBBBBBBBBBBBB2 - [0:0]
`,
	nat: `-A KUBE-NODEPORTS -m comment --comment ns2/svc2:p80 -m tcp -p tcp --dport 30081 -j KUBE-EXT-BBBBBBBBBBBBBBBB
-A KUBE-SERVICES -m comment --comment "ns2/svc2:p80 cluster IP" -m tcp -p tcp -d 10.96.0.2 --dport 80 -j KUBE-SVC-BBBBBBBBBBBBBBBB
-A KUBE-SERVICES -m comment --comment "ns2/svc2:p80 loadbalancer IP" -m tcp -p tcp -d 192.0.2.2 --dport 80 -j KUBE-EXT-BBBBBBBBBBBBBBBB
`,
	natOwn: `-A KUBE-EXT-BBBBBBBBBBBBBBBB -m comment --comment "pod traffic for ns2/svc2:p80 external destinations" -s 10.180.0.0/16 -j KUBE-SVC-BBBBBBBBBBBBBBBB
-A KUBE-EXT-BBBBBBBBBBBBBBBB -m comment --comment "masquerade LOCAL traffic for ns2/svc2:p80 external destinations" -m addrtype --src-type LOCAL -j KUBE-MARK-MASQ
-A KUBE-EXT-BBBBBBBBBBBBBBBB -m comment --comment "route LOCAL traffic for ns2/svc2:p80 external destinations" -m addrtype --src-type LOCAL -j KUBE-SVC-BBBBBBBBBBBBBBBB
-A KUBE-EXT-BBBBBBBBBBBBBBBB -j KUBE-SVL-BBBBBBBBBBBBBBBB
-A KUBE-SVC-BBBBBBBBBBBBBBBB -m comment --comment "ns2/svc2:p80 cluster IP" -m tcp -p tcp -d 10.96.0.2 --dport 80 ! -s 10.180.0.0/16 -j KUBE-MARK-MASQ
-A KUBE-SVC-BBBBBBBBBBBBBBBB -m comment --comment "ns2/svc2:p80 -> 10.180.1.2:80" -m statistic --mode random --probability 0.5000000000 -j KUBE-SEP-BBBBBBBBBBBBBBB1
-A KUBE-SVC-BBBBBBBBBBBBBBBB -m comment --comment "ns2/svc2:p80 -> 10.180.2.2:80" -j KUBE-SEP-BBBBBBBBBBBBBBB2
-A KUBE-SVL-BBBBBBBBBBBBBBBB -m comment --comment "ns2/svc2:p80 -> 10.180.1.2:80" -j KUBE-SEP-BBBBBBBBBBBBBBB1
-A KUBE-SEP-BBBBBBBBBBBBBBB1 -m comment --comment ns2/svc2:p80 -s 10.180.1.2 -j KUBE-MARK-MASQ
-A KUBE-SEP-BBBBBBBBBBBBBBB1 -m comment --comment ns2/svc2:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.1.2:80
-A KUBE-SEP-BBBBBBBBBBBBBBB2 -m comment --comment ns2/svc2:p80 -s 10.180.2.2 -j KUBE-MARK-MASQ
-A KUBE-SEP-BBBBBBBBBBBBBBB2 -m comment --comment ns2/svc2:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.2.2:80
`,
}

// svc3: no endpoints at all; ClusterIP 10.96.0.3:80, external IP
// 192.0.2.3, NodePort 30082: only filter rules, rejecting.
var svc3 = svcRules{
	filter: `-A KUBE-SERVICES -m comment --comment "ns3/svc3:p80 has no endpoints" -m tcp -p tcp -d 10.96.0.3 --dport 80 -j REJECT --reject-with icmp-port-unreachable
-A KUBE-EXTERNAL-SERVICES -m comment --comment "ns3/svc3:p80 has no endpoints" -m tcp -p tcp -d 192.0.2.3 --dport 80 -j REJECT --reject-with icmp-port-unreachable
-A KUBE-EXTERNAL-SERVICES -m comment --comment "ns3/svc3:p80 has no endpoints" -m addrtype --dst-type LOCAL -m tcp -p tcp --dport 30082 -j REJECT --reject-with icmp-port-unreachable
`,
}

// svc4: LoadBalancer 192.0.2.4:80 with loadBalancerSourceRanges
// 203.0.113.0/25; ClusterIP 10.96.0.4; one endpoint 10.180.2.4:80.
var svc4 = svcRules{
	filter: `-A KUBE-PROXY-FIREWALL -m comment --comment "ns4/svc4:p80 traffic not accepted by KUBE-FW-DDDDDDDDDDDDDDDD" -m tcp -p tcp -d 192.0.2.4 --dport 80 -j DROP
`,
	natChains: `:KUBE-EXT-DDDDDDDDDDDDDDDD - [0:0]
:KUBE-FW-DDDDDDDDDDDDDDDD - [0:0]
:KUBE-SVC-DDDDDDDDDDDDDDDD - [0:0]
:KUBE-SEP-DDDDDDDDDDDDDDD1 - [0:0]
`,
	nat: `-A KUBE-SERVICES -m comment --comment "ns4/svc4:p80 cluster IP" -m tcp -p tcp -d 10.96.0.4 --dport 80 -j KUBE-SVC-DDDDDDDDDDDDDDDD
-A KUBE-SERVICES -m comment --comment "ns4/svc4:p80 loadbalancer IP" -m tcp -p tcp -d 192.0.2.4 --dport 80 -j KUBE-FW-DDDDDDDDDDDDDDDD
`,
	natOwn: `-A KUBE-EXT-DDDDDDDDDDDDDDDD -m comment --comment "masquerade traffic for ns4/svc4:p80 external destinations" -j KUBE-MARK-MASQ
-A KUBE-EXT-DDDDDDDDDDDDDDDD -j KUBE-SVC-DDDDDDDDDDDDDDDD
-A KUBE-FW-DDDDDDDDDDDDDDDD -m comment --comment "ns4/svc4:p80 loadbalancer IP" -s 203.0.113.0/25 -j KUBE-EXT-DDDDDDDDDDDDDDDD
-A KUBE-FW-DDDDDDDDDDDDDDDD -m comment --comment "other traffic to ns4/svc4:p80 will be dropped by KUBE-PROXY-FIREWALL"
-A KUBE-SVC-DDDDDDDDDDDDDDDD -m comment --comment "ns4/svc4:p80 cluster IP" -m tcp -p tcp -d 10.96.0.4 --dport 80 ! -s 10.180.0.0/16 -j KUBE-MARK-MASQ
-A KUBE-SVC-DDDDDDDDDDDDDDDD -m comment --comment "ns4/svc4:p80 -> 10.180.2.4:80" -j KUBE-SEP-DDDDDDDDDDDDDDD1
-A KUBE-SEP-DDDDDDDDDDDDDDD1 -m comment --comment ns4/svc4:p80 -s 10.180.2.4 -j KUBE-MARK-MASQ
-A KUBE-SEP-DDDDDDDDDDDDDDD1 -m comment --comment ns4/svc4:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.2.4:80
`,
}

// svc5: sessionAffinity ClientIP (10800 s); ClusterIP 10.96.0.5:80, two
// endpoints elsewhere; written the way iptables-save prints the recent
// match (with --mask and --rsource).
var svc5 = svcRules{
	natChains: `:KUBE-SVC-EEEEEEEEEEEEEEEE - [0:0]
:KUBE-SEP-EEEEEEEEEEEEEEE1 - [0:0]
:KUBE-SEP-EEEEEEEEEEEEEEE2 - [0:0]
`,
	nat: `-A KUBE-SERVICES -m comment --comment "ns5/svc5:p80 cluster IP" -m tcp -p tcp -d 10.96.0.5 --dport 80 -j KUBE-SVC-EEEEEEEEEEEEEEEE
`,
	natOwn: `-A KUBE-SVC-EEEEEEEEEEEEEEEE -m comment --comment "ns5/svc5:p80 cluster IP" -m tcp -p tcp -d 10.96.0.5 --dport 80 ! -s 10.180.0.0/16 -j KUBE-MARK-MASQ
-A KUBE-SVC-EEEEEEEEEEEEEEEE -m comment --comment "ns5/svc5:p80 -> 10.180.2.5:80" -m recent --name KUBE-SEP-EEEEEEEEEEEEEEE1 --mask 255.255.255.255 --rsource --rcheck --seconds 10800 --reap -j KUBE-SEP-EEEEEEEEEEEEEEE1
-A KUBE-SVC-EEEEEEEEEEEEEEEE -m comment --comment "ns5/svc5:p80 -> 10.180.3.5:80" -m recent --name KUBE-SEP-EEEEEEEEEEEEEEE2 --mask 255.255.255.255 --rsource --rcheck --seconds 10800 --reap -j KUBE-SEP-EEEEEEEEEEEEEEE2
-A KUBE-SVC-EEEEEEEEEEEEEEEE -m comment --comment "ns5/svc5:p80 -> 10.180.2.5:80" -m statistic --mode random --probability 0.5000000000 -j KUBE-SEP-EEEEEEEEEEEEEEE1
-A KUBE-SVC-EEEEEEEEEEEEEEEE -m comment --comment "ns5/svc5:p80 -> 10.180.3.5:80" -j KUBE-SEP-EEEEEEEEEEEEEEE2
-A KUBE-SEP-EEEEEEEEEEEEEEE1 -m comment --comment ns5/svc5:p80 -s 10.180.2.5 -j KUBE-MARK-MASQ
-A KUBE-SEP-EEEEEEEEEEEEEEE1 -m comment --comment ns5/svc5:p80 -m recent --set --name KUBE-SEP-EEEEEEEEEEEEEEE1 --mask 255.255.255.255 --rsource -m tcp -p tcp -j DNAT --to-destination 10.180.2.5:80
-A KUBE-SEP-EEEEEEEEEEEEEEE2 -m comment --comment ns5/svc5:p80 -s 10.180.3.5 -j KUBE-MARK-MASQ
-A KUBE-SEP-EEEEEEEEEEEEEEE2 -m comment --comment ns5/svc5:p80 -m recent --set --name KUBE-SEP-EEEEEEEEEEEEEEE2 --mask 255.255.255.255 --rsource -m tcp -p tcp -j DNAT --to-destination 10.180.3.5:80
`,
}

// svc6: externalTrafficPolicy Local with no endpoint on this node;
// NodePort 30086, one endpoint elsewhere (10.180.2.6): external traffic is
// dropped, pod traffic still reaches the endpoint.
var svc6 = svcRules{
	filter: `-A KUBE-EXTERNAL-SERVICES -m comment --comment "ns6/svc6:p80 has no local endpoints" -m addrtype --dst-type LOCAL -m tcp -p tcp --dport 30086 -j DROP
`,
	natChains: `:KUBE-EXT-FFFFFFFFFFFFFFFF - [0:0]
:KUBE-SVC-FFFFFFFFFFFFFFFF - [0:0]
:KUBE-SEP-FFFFFFFFFFFFFFF1 - [0:0]
`,
	nat: `-A KUBE-NODEPORTS -m comment --comment ns6/svc6:p80 -m tcp -p tcp --dport 30086 -j KUBE-EXT-FFFFFFFFFFFFFFFF
-A KUBE-SERVICES -m comment --comment "ns6/svc6:p80 cluster IP" -m tcp -p tcp -d 10.96.0.6 --dport 80 -j KUBE-SVC-FFFFFFFFFFFFFFFF
`,
	natOwn: `-A KUBE-EXT-FFFFFFFFFFFFFFFF -m comment --comment "pod traffic for ns6/svc6:p80 external destinations" -s 10.180.0.0/16 -j KUBE-SVC-FFFFFFFFFFFFFFFF
-A KUBE-EXT-FFFFFFFFFFFFFFFF -m comment --comment "masquerade LOCAL traffic for ns6/svc6:p80 external destinations" -m addrtype --src-type LOCAL -j KUBE-MARK-MASQ
-A KUBE-EXT-FFFFFFFFFFFFFFFF -m comment --comment "route LOCAL traffic for ns6/svc6:p80 external destinations" -m addrtype --src-type LOCAL -j KUBE-SVC-FFFFFFFFFFFFFFFF
-A KUBE-SVC-FFFFFFFFFFFFFFFF -m comment --comment "ns6/svc6:p80 cluster IP" -m tcp -p tcp -d 10.96.0.6 --dport 80 ! -s 10.180.0.0/16 -j KUBE-MARK-MASQ
-A KUBE-SVC-FFFFFFFFFFFFFFFF -m comment --comment "ns6/svc6:p80 -> 10.180.2.6:80" -j KUBE-SEP-FFFFFFFFFFFFFFF1
-A KUBE-SEP-FFFFFFFFFFFFFFF1 -m comment --comment ns6/svc6:p80 -s 10.180.2.6 -j KUBE-MARK-MASQ
-A KUBE-SEP-FFFFFFFFFFFFFFF1 -m comment --comment ns6/svc6:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.2.6:80
`,
}

// allServices is the ruleset most trace tests use.
var allServices = dump(svc1, svc2, svc3, svc4, svc5, svc6)
