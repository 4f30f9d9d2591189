package ipvs

import (
	"strings"

	"github.com/kproxy/kproxy/internal/kernel/ipset"
)

// DummyDevice is the interface that holds the service addresses.
const DummyDevice = "kube-ipvs0"

// Tables and chains of ipvs mode, with upstream's names
// (pkg/proxy/ipvs/proxier.go).
const (
	TableNAT    = "nat"
	TableFilter = "filter"

	ChainServices             = "KUBE-SERVICES"
	ChainProxyFirewall        = "KUBE-PROXY-FIREWALL"
	ChainSourceRangesFirewall = "KUBE-SOURCE-RANGES-FIREWALL"
	ChainPostrouting          = "KUBE-POSTROUTING"
	ChainMarkMasq             = "KUBE-MARK-MASQ"
	ChainNodePort             = "KUBE-NODE-PORT"
	ChainForward              = "KUBE-FORWARD"
	ChainLoadBalancer         = "KUBE-LOAD-BALANCER"
	ChainIPVSFilter           = "KUBE-IPVS-FILTER"
	ChainIPVSOutFilter        = "KUBE-IPVS-OUT-FILTER"
)

// Chain is one chain kproxy owns in ipvs mode.
type Chain struct{ Table, Name string }

// Chains are upstream's iptablesChains, in its order: ipvs mode declares
// (and so flushes) each of them in every sync, and --cleanup deletes them.
var Chains = []Chain{
	{TableNAT, ChainServices},
	{TableNAT, ChainPostrouting},
	{TableNAT, ChainNodePort},
	{TableNAT, ChainLoadBalancer},
	{TableNAT, ChainMarkMasq},
	{TableFilter, ChainForward},
	{TableFilter, ChainNodePort},
	{TableFilter, ChainProxyFirewall},
	{TableFilter, ChainSourceRangesFirewall},
	{TableFilter, ChainIPVSFilter},
	{TableFilter, ChainIPVSOutFilter},
}

// JumpRule hooks one of ipvs mode's chains into a built-in chain. Line is
// the rule as iptables-save prints it.
type JumpRule struct{ Table, Chain, Line string }

// JumpRules are upstream's iptablesJumpChain, in its order. Each missing
// one is inserted at the head of its built-in chain (upstream's
// EnsureRule with Prepend), so a fresh node ends up with upstream's order.
var JumpRules = []JumpRule{
	jump(TableNAT, "OUTPUT", ChainServices, "kubernetes service portals"),
	jump(TableNAT, "PREROUTING", ChainServices, "kubernetes service portals"),
	jump(TableNAT, "POSTROUTING", ChainPostrouting, "kubernetes postrouting rules"),
	jump(TableFilter, "FORWARD", ChainForward, "kubernetes forwarding rules"),
	jump(TableFilter, "INPUT", ChainNodePort, "kubernetes health check rules"),
	jump(TableFilter, "INPUT", ChainProxyFirewall, "kube-proxy firewall rules"),
	jump(TableFilter, "FORWARD", ChainProxyFirewall, "kube-proxy firewall rules"),
	jump(TableFilter, "INPUT", ChainIPVSFilter, "kubernetes ipvs access filter"),
	jump(TableFilter, "OUTPUT", ChainIPVSOutFilter, "kubernetes ipvs access filter"),
}

func jump(table, from, to, comment string) JumpRule {
	return JumpRule{table, from, "-A " + from + ` -m comment --comment "` + comment + `" -j ` + to}
}

// Upstream's ipsets of ipvs mode (pkg/proxy/ipvs/ipset.go), with its
// names, types and comments, so that `ipset list` reads the same.
const (
	SetLoopBack               = "KUBE-LOOP-BACK"
	SetClusterIP              = "KUBE-CLUSTER-IP"
	SetExternalIP             = "KUBE-EXTERNAL-IP"
	SetExternalIPLocal        = "KUBE-EXTERNAL-IP-LOCAL"
	SetLoadBalancer           = "KUBE-LOAD-BALANCER"
	SetLoadBalancerLocal      = "KUBE-LOAD-BALANCER-LOCAL"
	SetLoadBalancerFW         = "KUBE-LOAD-BALANCER-FW"
	SetLoadBalancerSourceIP   = "KUBE-LOAD-BALANCER-SOURCE-IP"
	SetLoadBalancerSourceCIDR = "KUBE-LOAD-BALANCER-SOURCE-CIDR"
	SetNodePortTCP            = "KUBE-NODE-PORT-TCP"
	SetNodePortLocalTCP       = "KUBE-NODE-PORT-LOCAL-TCP"
	SetNodePortUDP            = "KUBE-NODE-PORT-UDP"
	SetNodePortLocalUDP       = "KUBE-NODE-PORT-LOCAL-UDP"
	SetNodePortSCTP           = "KUBE-NODE-PORT-SCTP-HASH"
	SetNodePortLocalSCTP      = "KUBE-NODE-PORT-LOCAL-SCTP-HASH"
	SetHealthCheckNodePort    = "KUBE-HEALTH-CHECK-NODE-PORT"
	SetIPVSIPs                = "KUBE-IPVS-IPS"
)

// ipset types as the ipset tool names them.
const (
	typeHashIP        = "hash:ip"
	typeHashIPPort    = "hash:ip,port"
	typeHashIPPortIP  = "hash:ip,port,ip"
	typeHashIPPortNet = "hash:ip,port,net"
	typeBitmapPort    = "bitmap:port"
)

// setInfo is upstream's ipsetInfo, in its order.
var setInfo = []struct {
	name, typ, comment string
}{
	{SetLoopBack, typeHashIPPortIP, "Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose"},
	{SetClusterIP, typeHashIPPort, "Kubernetes service cluster ip + port for masquerade purpose"},
	{SetExternalIP, typeHashIPPort, "Kubernetes service external ip + port for masquerade and filter purpose"},
	{SetExternalIPLocal, typeHashIPPort, "Kubernetes service external ip + port with externalTrafficPolicy=local"},
	{SetLoadBalancer, typeHashIPPort, "Kubernetes service lb portal"},
	{SetLoadBalancerFW, typeHashIPPort, "Kubernetes service load balancer ip + port for load balancer with sourceRange"},
	{SetLoadBalancerLocal, typeHashIPPort, "Kubernetes service load balancer ip + port with externalTrafficPolicy=local"},
	{SetLoadBalancerSourceIP, typeHashIPPortIP, "Kubernetes service load balancer ip + port + source IP for packet filter purpose"},
	{SetLoadBalancerSourceCIDR, typeHashIPPortNet, "Kubernetes service load balancer ip + port + source cidr for packet filter purpose"},
	{SetNodePortTCP, typeBitmapPort, "Kubernetes nodeport TCP port for masquerade purpose"},
	{SetNodePortLocalTCP, typeBitmapPort, "Kubernetes nodeport TCP port with externalTrafficPolicy=local"},
	{SetNodePortUDP, typeBitmapPort, "Kubernetes nodeport UDP port for masquerade purpose"},
	{SetNodePortLocalUDP, typeBitmapPort, "Kubernetes nodeport UDP port with externalTrafficPolicy=local"},
	{SetNodePortSCTP, typeHashIPPort, "Kubernetes nodeport SCTP port for masquerade purpose with type 'hash ip:port'"},
	{SetNodePortLocalSCTP, typeHashIPPort, "Kubernetes nodeport SCTP port with externalTrafficPolicy=local with type 'hash ip:port'"},
	{SetHealthCheckNodePort, typeBitmapPort, "Kubernetes health check node port"},
	{SetIPVSIPs, typeHashIP, "Addresses on the ipvs interface"},
}

// maxSetName is the longest name the kernel takes (IPSET_MAXNAMELEN - 1).
const maxSetName = 31

// SetName is the name of one of upstream's sets (the IPv4 name) in family
// ipv6: "KUBE-" becomes "KUBE-6-", cut to 31 characters, as upstream's
// NewIPSet does (KUBE-6-LOAD-BALANCER-SOURCE-CID, ...).
func SetName(name string, ipv6 bool) string {
	if !ipv6 || !strings.HasPrefix(name, "KUBE-") {
		return name
	}
	name = "KUBE-6-" + strings.TrimPrefix(name, "KUBE-")
	if len(name) > maxSetName {
		name = name[:maxSetName]
	}
	return name
}

// SetDefinitions returns every set of the family, as the proxier creates
// them (all of them, empty or not, as upstream). Bitmap sets have no
// family; hash sets of IPv6 are inet6.
func SetDefinitions(ipv6 bool) []ipset.Set {
	out := make([]ipset.Set, 0, len(setInfo))
	for _, s := range setInfo {
		out = append(out, ipset.Set{
			Name:    SetName(s.name, ipv6),
			Type:    s.typ,
			IPv6:    ipv6 && s.typ != typeBitmapPort,
			Comment: s.comment,
		})
	}
	return out
}
