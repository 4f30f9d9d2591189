package flowtest

import (
	"net/netip"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/example"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/testutil/fixtures"
)

// Scenario is a snapshot and the packets sent into it.
type Scenario struct {
	Name string
	// Snapshot builds the cluster and the configuration; every call
	// returns a new one.
	Snapshot func(t testing.TB) *Snapshot
	Cases    []Case
}

// exampleOf is the example seen from node, then changed by edit (nil: as
// it is).
func exampleOf(node string, edit func(t testing.TB, s *Snapshot)) func(t testing.TB) *Snapshot {
	return func(t testing.TB) *Snapshot {
		t.Helper()
		s := Example(t, node)
		if edit != nil {
			edit(t, s)
		}
		return s
	}
}

// withConfig is the example seen from node-a with its configuration
// changed by tweak.
func withConfig(tweak func(c *Config)) func(t testing.TB) *Snapshot {
	return exampleOf(example.NodeA, func(_ testing.TB, s *Snapshot) { tweak(&s.Config) })
}

// Reasons of the exceptions, each written once.
const (
	// Upstream's nftables mode puts every cluster IP in a set and rejects
	// what no service port matched (KEP-3866's "cluster-ips" check);
	// upstream's iptables mode has no such rule, and kproxy keeps each
	// mode's behaviour.
	whyIPTablesUndefinedPort = "iptables mode, as upstream's, has no catch-all for cluster IPs: a port no service defines is routed as usual"
	// iptables.localhostNodePorts (default true) with route_localnet=1;
	// nftables mode never serves node ports on loopback, as upstream.
	whyIPTablesLocalhostNodePorts = "iptables mode serves IPv4 node ports on 127.0.0.1 (localhostNodePorts, upstream's default, with route_localnet=1); nftables mode never does, as upstream"
	whyIPTablesServiceCIDRs       = "only nftables mode knows the ServiceCIDRs and drops traffic to unallocated cluster IPs, as upstream; iptables mode routes it as usual"
	whyIPTablesNodePortDefault    = "iptables mode's default nodePortAddresses is every local address, nftables mode's the node's primary IPs (upstream's defaults)"
	// The nftables tracer does not model routing; iptables mode sets
	// route_localnet for localhost node ports and therefore needs
	// KUBE-FIREWALL's guard (CVE-2020-8558).
	// ipvs mode as upstream's (pkg/proxy/ipvs), where it differs from
	// the other two.
	whyIPVSVIPPort            = "ipvs mode binds external and LB IPs to kube-ipvs0, so they are local, and KUBE-IPVS-FILTER rejects a new connection to a kube-ipvs0 address on a port no service defines, as upstream's ipvs mode"
	whyIPVSETPLocal           = "ipvs mode, as upstream's, has one virtual server per external address whose real servers are the local endpoints for every client (no short-circuit to the cluster's endpoints for pods or the node), and the *-LOCAL sets return before KUBE-MARK-MASQ"
	whyIPVSNoRealServer       = "ipvs mode, as upstream's, has no drop rule for internalTrafficPolicy Local without local endpoints: the virtual server has no real server and IPVS answers ICMP port unreachable (ip_vs_leave)"
	whyIPVSETPNoLocal         = "upstream's ipvs mode gives a Local external policy without local endpoints the cluster's endpoints (syncEndpoint, kubernetes#97081), for every client, unmasqueraded (the *-LOCAL sets return before KUBE-MARK-MASQ): an external client's reply is lost"
	whyIPVSServiceCIDRs       = "only nftables mode knows the ServiceCIDRs and drops traffic to unallocated cluster IPs, as upstream; ipvs mode routes it as usual"
	whyIPVSNodePortDefault    = "ipvs mode's default nodePortAddresses is every local address, as upstream's (only nftables mode defaults to the node's primary IPs)"
	whyIPVSSourceRangesOutput = "ipvs mode's source-range firewall (KUBE-PROXY-FIREWALL) hangs off filter INPUT and FORWARD only, as upstream's: a local process's connection to the LB VIP is not filtered"
	whyNFTablesMartian        = "nftables mode never sets route_localnet, so the kernel's routing drops a packet from another host to 127.0.0.0/8 before any rule; the rules themselves let it through"
)

var (
	iptablesUndefinedPort   = map[Mode]Exception{IPTables: {Output: "ACCEPT", Why: whyIPTablesUndefinedPort}}
	routedUnallocated       = map[Mode]Exception{IPTables: {Output: "ACCEPT", Why: whyIPTablesServiceCIDRs}, IPVS: {Output: "ACCEPT", Why: whyIPVSServiceCIDRs}}
	ipvsVIPPort             = map[Mode]Exception{IPVS: {Output: "REJECT", Why: whyIPVSVIPPort}}
	ipvsETPLocal            = map[Mode]Exception{IPVS: {Output: EtpLocalEp, Why: whyIPVSETPLocal}}
	ipvsNoRealServer        = map[Mode]Exception{IPVS: {Output: "REJECT", Why: whyIPVSNoRealServer}}
	ipvsETPNoLocal          = map[Mode]Exception{IPVS: {Output: EtpRemoteEp, Why: whyIPVSETPNoLocal}}
	iptablesLocalhostWebEps = map[Mode]Exception{IPTables: {Output: WebEps, Masq: true, Why: whyIPTablesLocalhostNodePorts}}
)

// Scenarios is the packet-flow table every mode runs.
var Scenarios = []Scenario{{
	Name:     "example",
	Snapshot: exampleOf(example.NodeA, nil),
	Cases: []Case{
		// ClusterIP: endpoints on both nodes; only traffic from outside
		// the cluster CIDRs is masqueraded.
		{Name: "clusterIP from local pod", Src: LocalPod, IIF: PodIIF, Dst: "198.19.0.10:80", Output: WebEps},
		{Name: "clusterIP from pod on other node", Src: RemotePod, IIF: LanIIF, Dst: "198.19.0.10:80", Output: WebEps},
		{Name: "clusterIP from other node", Src: OtherNode, IIF: LanIIF, Dst: "198.19.0.10:80", Output: WebEps, Masq: true},
		{Name: "clusterIP from outside", Src: Outside, IIF: LanIIF, Dst: "198.19.0.10:80", Output: WebEps, Masq: true},
		{Name: "clusterIP from this node", Src: ThisNode, Dst: "198.19.0.10:80", Output: WebEps, Masq: true},

		// Undefined port of a ClusterIP: rejected, forwarded or local.
		{Name: "clusterIP undefined port from pod", Src: LocalPod, IIF: PodIIF, Dst: "198.19.0.10:81", Output: "REJECT", Except: iptablesUndefinedPort},
		{Name: "clusterIP undefined port from this node", Src: ThisNode, Dst: "198.19.0.10:81", Output: "REJECT", Except: iptablesUndefinedPort},
		{Name: "clusterIP undefined port from outside", Src: Outside, IIF: LanIIF, Dst: "198.19.0.10:81", Output: "REJECT", Except: iptablesUndefinedPort},
		// Without ServiceCIDRs, an address nobody has is routed as usual.
		{Name: "unallocated cluster IP is not ours", Src: LocalPod, IIF: PodIIF, Dst: "198.19.0.99:80", Output: "ACCEPT"},

		// NodePort on the node's IP, policy Cluster: always masqueraded.
		{Name: "nodePort from outside", Src: Outside, IIF: LanIIF, Dst: "198.18.0.10:30080", Output: WebEps, Masq: true},
		{Name: "nodePort from other node", Src: OtherNode, IIF: LanIIF, Dst: "198.18.0.10:30080", Output: WebEps, Masq: true},
		{Name: "nodePort from local pod", Src: LocalPod, IIF: PodIIF, Dst: "198.18.0.10:30080", Output: WebEps, Masq: true},
		{Name: "nodePort from this node", Src: ThisNode, Dst: "198.18.0.10:30080", Output: WebEps, Masq: true},
		{Name: "nodePort via the clusterIP port is not a nodePort", Src: LocalPod, IIF: PodIIF, Dst: "198.19.0.11:30080", Output: "REJECT", Except: iptablesUndefinedPort},
		{Name: "clusterIP of the nodePort service", Src: LocalPod, IIF: PodIIF, Dst: "198.19.0.11:80", Output: WebEps},
		// NodePorts only on nodePortAddresses (nftables: the primary IPs;
		// iptables: every local address, and 127.0.0.1).
		{Name: "nodePort on localhost", Src: "127.0.0.1", Dst: "127.0.0.1:30080", Output: "ACCEPT", Except: iptablesLocalhostWebEps},
		{Name: "IPv6 nodePort never on ::1", Src: "::1", Dst: "[::1]:30080", Output: "ACCEPT"},
		{Name: "nodePort not on another node's IP", Src: Outside, IIF: LanIIF, Dst: "198.18.0.11:30080", Output: "ACCEPT"},
		{Name: "nodePort not on an LB VIP", Src: Outside, IIF: LanIIF, Dst: "198.19.200.1:30080", Output: "ACCEPT", Except: ipvsVIPPort},
		{Name: "nodePort not on the clusterIP", Src: Outside, IIF: LanIIF, Dst: "198.19.0.10:30080", Output: "REJECT", Except: iptablesUndefinedPort},
		// A packet from another host to 127.0.0.0/8 that no node port
		// DNATed must not reach a local service.
		{Name: "martian to a localhost service dropped", Src: OtherNode, IIF: LanIIF, Dst: "127.0.0.1:22", Output: "DROP",
			Except: map[Mode]Exception{NFTables: {Output: "ACCEPT", Why: whyNFTablesMartian}}},

		// LoadBalancer with source ranges 198.18.0.0/24 and 203.0.113.0/24.
		{Name: "LB VIP from allowed outside source", Src: Outside, IIF: LanIIF, Dst: "198.19.200.1:443", Output: WebEps, Masq: true},
		{Name: "LB VIP from denied outside source", Src: OutsideDenied, IIF: LanIIF, Dst: "198.19.200.1:443", Output: "DROP"},
		{Name: "LB VIP from other node (in range)", Src: OtherNode, IIF: LanIIF, Dst: "198.19.200.1:443", Output: WebEps, Masq: true},
		{Name: "LB VIP from local pod (not in range)", Src: LocalPod, IIF: PodIIF, Dst: "198.19.200.1:443", Output: "DROP"},
		{Name: "LB VIP from this node (in range)", Src: ThisNode, Dst: "198.19.200.1:443", Output: WebEps, Masq: true},
		{Name: "LB VIP looping back with the VIP as source", Src: "198.19.200.1", Dst: "198.19.200.1:443", Output: WebEps, Masq: true},
		{Name: "LB nodePort ignores source ranges", Src: OutsideDenied, IIF: LanIIF, Dst: "198.18.0.10:30443", Output: WebEps, Masq: true},
		{Name: "LB clusterIP ignores source ranges", Src: LocalPod, IIF: PodIIF, Dst: "198.19.0.12:443", Output: WebEps},
		{Name: "LB VIP other port", Src: Outside, IIF: LanIIF, Dst: "198.19.200.1:80", Output: "ACCEPT", Except: ipvsVIPPort},
		// ipMode Proxy: the node leaves the IP to the real load balancer.
		{Name: "LB ipMode Proxy IP from pod", Src: LocalPod, IIF: PodIIF, Dst: "198.19.200.2:443", Output: "ACCEPT"},
		{Name: "LB ipMode Proxy IP from outside", Src: OutsideDenied, IIF: LanIIF, Dst: "198.19.200.2:443", Output: "ACCEPT"},
		{Name: "LB ipMode Proxy IP from this node", Src: ThisNode, Dst: "198.19.200.2:443", Output: "ACCEPT"},

		// External IPs.
		{Name: "externalIP from outside", Src: Outside, IIF: LanIIF, Dst: "198.19.200.10:8080", Output: WebEps, Masq: true},
		{Name: "externalIP from local pod", Src: LocalPod, IIF: PodIIF, Dst: "198.19.200.10:8080", Output: WebEps, Masq: true},
		{Name: "externalIP from this node", Src: ThisNode, Dst: "198.19.200.10:8080", Output: WebEps, Masq: true},
		{Name: "externalIP other port", Src: Outside, IIF: LanIIF, Dst: "198.19.200.10:80", Output: "ACCEPT", Except: ipvsVIPPort},
		{Name: "externalIP IPv6 from outside", Src: Outside6, IIF: LanIIF, Dst: "[fd00:19::c8:a]:8080", Output: WebEps6, Masq: true},
		{Name: "clusterIP IPv6 of ext-ip from local pod", Src: LocalPod6, IIF: PodIIF, Dst: "[fd00:19::13]:8080", Output: WebEps6},

		// externalTrafficPolicy Local: external traffic only to local
		// endpoints, source kept; pods short-circuited to every endpoint;
		// the node itself masqueraded.
		{Name: "ETP Local LB VIP from outside", Src: Outside, IIF: LanIIF, Dst: "198.19.200.3:80", Output: EtpLocalEp},
		{Name: "ETP Local nodePort from outside", Src: Outside, IIF: LanIIF, Dst: "198.18.0.10:30081", Output: EtpLocalEp},
		{Name: "ETP Local nodePort from other node", Src: OtherNode, IIF: LanIIF, Dst: "198.18.0.10:30081", Output: EtpLocalEp},
		{Name: "ETP Local LB VIP from local pod", Src: LocalPod, IIF: PodIIF, Dst: "198.19.200.3:80", Output: EtpEps, Except: ipvsETPLocal},
		{Name: "ETP Local nodePort from local pod", Src: LocalPod, IIF: PodIIF, Dst: "198.18.0.10:30081", Output: EtpEps, Except: ipvsETPLocal},
		// A pod of node-b is inside the cluster CIDR: short-circuited too.
		{Name: "ETP Local LB VIP from pod on other node", Src: RemotePod, IIF: LanIIF, Dst: "198.19.200.3:80", Output: EtpEps, Except: ipvsETPLocal},
		{Name: "ETP Local LB VIP from this node", Src: ThisNode, Dst: "198.19.200.3:80", Output: EtpEps, Masq: true, Except: ipvsETPLocal},
		{Name: "ETP Local nodePort from this node", Src: ThisNode, Dst: "198.18.0.10:30081", Output: EtpEps, Masq: true, Except: ipvsETPLocal},
		{Name: "ETP Local clusterIP from local pod", Src: LocalPod, IIF: PodIIF, Dst: "198.19.0.14:80", Output: EtpEps},
		{Name: "ETP Local clusterIP from outside", Src: Outside, IIF: LanIIF, Dst: "198.19.0.14:80", Output: EtpEps, Masq: true},

		// internalTrafficPolicy Local: only node-a's endpoint.
		{Name: "ITP Local from local pod", Src: LocalPod, IIF: PodIIF, Dst: "198.19.0.15:80", Output: ItpLocalEp},
		{Name: "ITP Local from pod on other node", Src: RemotePod, IIF: LanIIF, Dst: "198.19.0.15:80", Output: ItpLocalEp},
		{Name: "ITP Local from outside", Src: Outside, IIF: LanIIF, Dst: "198.19.0.15:80", Output: ItpLocalEp, Masq: true},
		{Name: "ITP Local from this node", Src: ThisNode, Dst: "198.19.0.15:80", Output: ItpLocalEp, Masq: true},

		// Hairpin: the only endpoint reaching its own service.
		{Name: "hairpin", Src: "198.18.129.30", IIF: PodIIF, Dst: "198.19.0.15:80", Output: ItpLocalEp, Masq: true},

		// Session affinity (no affinity recorded yet: every endpoint).
		{Name: "affinity first packet", Src: LocalPod, IIF: PodIIF, Dst: "198.19.0.16:80", Output: AffinityEps},

		// Dual-stack.
		{Name: "dual-stack IPv4", Src: LocalPod, IIF: PodIIF, Dst: "198.19.0.17:80", Output: DualEps},
		{Name: "dual-stack IPv6 from local pod", Src: LocalPod6, IIF: PodIIF, Dst: "[fd00:19::17]:80", Output: DualEps6},
		{Name: "dual-stack IPv6 from outside", Src: Outside6, IIF: LanIIF, Dst: "[fd00:19::17]:80", Output: DualEps6, Masq: true},
		{Name: "dual-stack IPv6 from this node", Src: ThisNode6, Dst: "[fd00:19::17]:80", Output: DualEps6, Masq: true},
		{Name: "IPv6 undefined port", Src: LocalPod6, IIF: PodIIF, Dst: "[fd00:19::17]:81", Output: "REJECT", Except: iptablesUndefinedPort},
		{Name: "IPv6 single-stack service's IPv4 only", Src: LocalPod6, IIF: PodIIF, Dst: "[fd00:19::10]:80", Output: "ACCEPT"},

		// UDP and SCTP.
		{Name: "UDP DNS", Proto: v1.ProtocolUDP, Src: LocalPod, IIF: PodIIF, Dst: "198.19.0.18:53", Output: DNSEps},
		{Name: "UDP DNS from outside", Proto: v1.ProtocolUDP, Src: Outside, IIF: LanIIF, Dst: "198.19.0.18:53", Output: DNSEps, Masq: true},
		{Name: "TCP DNS", Src: LocalPod, IIF: PodIIF, Dst: "198.19.0.18:53", Output: DNSEps},
		{Name: "UDP undefined port", Proto: v1.ProtocolUDP, Src: LocalPod, IIF: PodIIF, Dst: "198.19.0.18:54", Output: "REJECT", Except: iptablesUndefinedPort},
		{Name: "SCTP", Proto: v1.ProtocolSCTP, Src: LocalPod, IIF: PodIIF, Dst: "198.19.0.19:9999", Output: SCTPEp},
		{Name: "SCTP from this node", Proto: v1.ProtocolSCTP, Src: ThisNode, Dst: "198.19.0.19:9999", Output: SCTPEp, Masq: true},
		{Name: "TCP to SCTP-only port", Src: LocalPod, IIF: PodIIF, Dst: "198.19.0.19:9999", Output: "REJECT", Except: iptablesUndefinedPort},

		// No endpoints: rejected from everywhere.
		{Name: "no endpoints from pod", Src: LocalPod, IIF: PodIIF, Dst: "198.19.0.20:80", Output: "REJECT"},
		{Name: "no endpoints from this node", Src: ThisNode, Dst: "198.19.0.20:80", Output: "REJECT"},
		{Name: "no endpoints from outside", Src: Outside, IIF: LanIIF, Dst: "198.19.0.20:80", Output: "REJECT"},

		// Only terminating (still serving) endpoints: used as a fallback.
		{Name: "terminating fallback", Src: LocalPod, IIF: PodIIF, Dst: "198.19.0.21:80", Output: DrainingEps},

		// Zone hints: only zone-a's endpoints for node-a.
		{Name: "topology hints", Src: LocalPod, IIF: PodIIF, Dst: "198.19.0.22:80", Output: TopoZoneAEps},

		// Services handled by another proxy are not ours at all.
		{Name: "other proxy's service", Src: LocalPod, IIF: PodIIF, Dst: "198.19.0.23:80", Output: "ACCEPT"},
	},
}, {
	// The same example rendered for node-b: what is local changes, and
	// internalTrafficPolicy Local has nothing to send to.
	Name:     "node-b",
	Snapshot: exampleOf(example.NodeB, nil),
	Cases: []Case{
		{Name: "ITP Local without local endpoints drops pod traffic", Src: "198.18.130.5", IIF: PodIIF, Dst: "198.19.0.15:80", Output: "DROP", Except: ipvsNoRealServer},
		{Name: "ITP Local without local endpoints drops node traffic", Src: "198.18.0.11", Dst: "198.19.0.15:80", Output: "DROP", Except: ipvsNoRealServer},
		{Name: "ITP Local without local endpoints drops outside traffic", Src: Outside, IIF: LanIIF, Dst: "198.19.0.15:80", Output: "DROP", Except: ipvsNoRealServer},
		{Name: "ETP Local LB VIP from outside", Src: Outside, IIF: LanIIF, Dst: "198.19.200.3:80", Output: EtpRemoteEp},
		{Name: "ETP Local nodePort on node-b", Src: Outside, IIF: LanIIF, Dst: "198.18.0.11:30081", Output: EtpRemoteEp},
		{Name: "nodePort of node-a is not node-b's", Src: Outside, IIF: LanIIF, Dst: "198.18.0.10:30081", Output: "ACCEPT"},
		{Name: "topology hints of zone-b", Src: "198.18.130.5", IIF: PodIIF, Dst: "198.19.0.22:80", Output: TopoZoneBEps},
		{Name: "SCTP endpoint is local here", Proto: v1.ProtocolSCTP, Src: "198.18.130.5", IIF: PodIIF, Dst: "198.19.0.19:9999", Output: SCTPEp},
	},
}, {
	// A Local external policy whose endpoints are all elsewhere drops
	// external traffic but still serves pods and the node itself.
	Name: "ETP Local without local endpoints",
	Snapshot: exampleOf(example.NodeA, func(t testing.TB, s *Snapshot) {
		OnlyRemoteEndpoints(t, s, fixtures.SPName("etp-local", "http", model.TCP), 1)
	}),
	Cases: []Case{
		{Name: "LB VIP from outside", Src: Outside, IIF: LanIIF, Dst: "198.19.200.3:80", Output: "DROP", Except: ipvsETPNoLocal},
		{Name: "nodePort from outside", Src: Outside, IIF: LanIIF, Dst: "198.18.0.10:30081", Output: "DROP", Except: ipvsETPNoLocal},
		{Name: "LB VIP from local pod", Src: LocalPod, IIF: PodIIF, Dst: "198.19.200.3:80", Output: EtpRemoteEp},
		// Upstream (PR #132456, in 1.34 and 1.33.5) moved the endpoint
		// checks of filter-input/forward/output to priority 0, after
		// DNAT, so that locally generated traffic short-circuited to the
		// cluster endpoints is no longer dropped by the no-local-
		// endpoints entry of the VIP. kproxy's nftables mode still checks
		// on the output hook at dstnat-10, before nat-output has
		// short-circuited it.
		{Name: "LB VIP from this node", Src: ThisNode, Dst: "198.19.200.3:80", Output: EtpRemoteEp, Masq: true, Except: ipvsETPNoLocal},
		{Name: "nodePort from this node", Src: ThisNode, Dst: "198.18.0.10:30081", Output: EtpRemoteEp, Masq: true, Except: ipvsETPNoLocal},
		{Name: "clusterIP from local pod", Src: LocalPod, IIF: PodIIF, Dst: "198.19.0.14:80", Output: EtpRemoteEp},
		{Name: "clusterIP from outside", Src: Outside, IIF: LanIIF, Dst: "198.19.0.14:80", Output: EtpRemoteEp, Masq: true},
	},
}, {
	// Every ClusterIP connection is masqueraded, pods included; external
	// traffic with policy Local still keeps its source.
	Name:     "masqueradeAll",
	Snapshot: withConfig(func(c *Config) { c.MasqueradeAll = true }),
	Cases: []Case{
		{Name: "clusterIP from local pod", Src: LocalPod, IIF: PodIIF, Dst: "198.19.0.10:80", Output: WebEps, Masq: true},
		{Name: "clusterIP from pod on other node", Src: RemotePod, IIF: LanIIF, Dst: "198.19.0.10:80", Output: WebEps, Masq: true},
		{Name: "clusterIP from outside", Src: Outside, IIF: LanIIF, Dst: "198.19.0.10:80", Output: WebEps, Masq: true},
		{Name: "ITP Local from local pod", Src: LocalPod, IIF: PodIIF, Dst: "198.19.0.15:80", Output: ItpLocalEp, Masq: true},
		{Name: "IPv6 clusterIP from local pod", Src: LocalPod6, IIF: PodIIF, Dst: "[fd00:19::17]:80", Output: DualEps6, Masq: true},
		{Name: "ETP Local LB VIP from outside", Src: Outside, IIF: LanIIF, Dst: "198.19.200.3:80", Output: EtpLocalEp},
		{Name: "ETP Local LB VIP from local pod", Src: LocalPod, IIF: PodIIF, Dst: "198.19.200.3:80", Output: EtpEps, Except: ipvsETPLocal},
		{Name: "no endpoints still rejected", Src: LocalPod, IIF: PodIIF, Dst: "198.19.0.20:80", Output: "REJECT"},
	},
},
	// Each detectLocalMode decides which ClusterIP traffic counts as
	// coming from a pod (not masqueraded) and which pod traffic to an
	// externalTrafficPolicy Local service is short-circuited.
	{
		Name:     "detectLocalMode NodeCIDR",
		Snapshot: withConfig(func(c *Config) { c.DetectLocalMode = DetectNodeCIDR }),
		Cases: []Case{
			{Name: "clusterIP from local pod", Src: LocalPod, IIF: PodIIF, Dst: "198.19.0.10:80", Output: WebEps},
			// A pod of node-b is outside node-a's pod CIDR.
			{Name: "clusterIP from pod on other node", Src: RemotePod, IIF: LanIIF, Dst: "198.19.0.10:80", Output: WebEps, Masq: true},
			{Name: "clusterIP from outside", Src: Outside, IIF: LanIIF, Dst: "198.19.0.10:80", Output: WebEps, Masq: true},
			{Name: "IPv6 clusterIP from local pod", Src: LocalPod6, IIF: PodIIF, Dst: "[fd00:19::17]:80", Output: DualEps6},
			{Name: "IPv6 clusterIP from pod on other node", Src: RemotePod6, IIF: LanIIF, Dst: "[fd00:19::17]:80", Output: DualEps6, Masq: true},
			{Name: "ETP Local VIP from local pod", Src: LocalPod, IIF: PodIIF, Dst: "198.19.200.3:80", Output: EtpEps, Except: ipvsETPLocal},
			{Name: "ETP Local VIP from pod on other node", Src: RemotePod, IIF: LanIIF, Dst: "198.19.200.3:80", Output: EtpLocalEp},
		},
	}, {
		Name: "detectLocalMode BridgeInterface",
		Snapshot: withConfig(func(c *Config) {
			c.DetectLocalMode, c.BridgeInterface = DetectBridgeInterface, BridgeIIF
		}),
		Cases: []Case{
			{Name: "clusterIP from local pod on the bridge", Src: LocalPod, IIF: BridgeIIF, Dst: "198.19.0.10:80", Output: WebEps},
			{Name: "clusterIP from local pod on a veth", Src: LocalPod, IIF: PodIIF, Dst: "198.19.0.10:80", Output: WebEps, Masq: true},
			{Name: "clusterIP from pod on other node", Src: RemotePod, IIF: LanIIF, Dst: "198.19.0.10:80", Output: WebEps, Masq: true},
			{Name: "clusterIP from this node", Src: ThisNode, Dst: "198.19.0.10:80", Output: WebEps, Masq: true},
			{Name: "IPv6 clusterIP from local pod", Src: LocalPod6, IIF: BridgeIIF, Dst: "[fd00:19::17]:80", Output: DualEps6},
			{Name: "ETP Local VIP from local pod", Src: LocalPod, IIF: BridgeIIF, Dst: "198.19.200.3:80", Output: EtpEps, Except: ipvsETPLocal},
			{Name: "ETP Local VIP from pod on other node", Src: RemotePod, IIF: LanIIF, Dst: "198.19.200.3:80", Output: EtpLocalEp},
		},
	}, {
		Name: "detectLocalMode InterfaceNamePrefix",
		Snapshot: withConfig(func(c *Config) {
			c.DetectLocalMode, c.InterfaceNamePrefix = DetectInterfaceNamePrefix, "veth"
		}),
		Cases: []Case{
			{Name: "clusterIP from local pod", Src: LocalPod, IIF: PodIIF, Dst: "198.19.0.10:80", Output: WebEps},
			{Name: "clusterIP from pod on other node", Src: RemotePod, IIF: LanIIF, Dst: "198.19.0.10:80", Output: WebEps, Masq: true},
			{Name: "clusterIP from this node", Src: ThisNode, Dst: "198.19.0.10:80", Output: WebEps, Masq: true},
			{Name: "clusterIP from outside", Src: Outside, IIF: LanIIF, Dst: "198.19.0.10:80", Output: WebEps, Masq: true},
			{Name: "ETP Local VIP from local pod", Src: LocalPod, IIF: PodIIF, Dst: "198.19.200.3:80", Output: EtpEps, Except: ipvsETPLocal},
			{Name: "ETP Local VIP from pod on other node", Src: RemotePod, IIF: LanIIF, Dst: "198.19.200.3:80", Output: EtpLocalEp},
		},
	}, {
		// ClusterCIDR mode without a cluster CIDR cannot tell pods apart:
		// no masquerade for ClusterIPs, no short-circuit, as upstream's
		// no-op detector.
		Name:     "detectLocalMode ClusterCIDR without CIDRs",
		Snapshot: withConfig(func(c *Config) { c.ClusterCIDRs = nil }),
		Cases: []Case{
			{Name: "clusterIP from outside", Src: Outside, IIF: LanIIF, Dst: "198.19.0.10:80", Output: WebEps},
			{Name: "nodePort still masqueraded", Src: Outside, IIF: LanIIF, Dst: "198.18.0.10:30080", Output: WebEps, Masq: true},
			{Name: "ETP Local VIP from local pod", Src: LocalPod, IIF: PodIIF, Dst: "198.19.200.3:80", Output: EtpLocalEp},
			{Name: "ETP Local VIP from this node", Src: ThisNode, Dst: "198.19.200.3:80", Output: EtpEps, Masq: true, Except: ipvsETPLocal},
		},
	}, {
		Name:     "localhostNodePorts off",
		Snapshot: withConfig(func(c *Config) { c.NoLocalhostNodePorts = true }),
		Cases: []Case{
			{Name: "nodePort not on localhost", Src: "127.0.0.1", Dst: "127.0.0.1:30080", Output: "ACCEPT"},
			{Name: "nodePort on the node IP", Src: Outside, IIF: LanIIF, Dst: "198.18.0.10:30080", Output: WebEps, Masq: true},
		},
	}, {
		// With the service CIDRs known, traffic to an unallocated cluster
		// IP is dropped; undefined ports of allocated ones are still
		// rejected.
		Name: "service CIDRs",
		Snapshot: withConfig(func(c *Config) {
			for _, s := range example.ServiceCIDRs {
				c.ServiceCIDRs = append(c.ServiceCIDRs, netip.MustParsePrefix(s))
			}
		}),
		Cases: []Case{
			{Name: "unallocated from pod", Src: LocalPod, IIF: PodIIF, Dst: "198.19.0.99:80", Output: "DROP", Except: routedUnallocated},
			{Name: "unallocated from this node", Src: ThisNode, Dst: "198.19.0.99:80", Output: "DROP", Except: routedUnallocated},
			{Name: "unallocated IPv6", Src: LocalPod6, IIF: PodIIF, Dst: "[fd00:19::99]:80", Output: "DROP", Except: routedUnallocated},
			{Name: "undefined port still rejected", Src: LocalPod, IIF: PodIIF, Dst: "198.19.0.10:81", Output: "REJECT", Except: iptablesUndefinedPort},
			{Name: "allocated still served", Src: LocalPod, IIF: PodIIF, Dst: "198.19.0.10:80", Output: WebEps},
			{Name: "outside the service CIDR", Src: LocalPod, IIF: PodIIF, Dst: "198.20.0.1:80", Output: "ACCEPT"},
		},
	},
	// nodePortAddresses: which addresses accept NodePorts. node-a has a
	// second local address, 192.168.122.1 (a bridge), and loopback.
	{
		Name:     "nodePortAddresses default",
		Snapshot: nodePortAddresses(nil),
		Cases: []Case{
			{Name: "node IP", Src: Outside, IIF: LanIIF, Dst: "198.18.0.10:30080", Output: WebEps, Masq: true},
			{Name: "second local address", Src: Outside, IIF: LanIIF, Dst: "192.168.122.1:30080", Output: "ACCEPT",
				Except: map[Mode]Exception{
					IPTables: {Output: WebEps, Masq: true, Why: whyIPTablesNodePortDefault},
					IPVS:     {Output: WebEps, Masq: true, Why: whyIPVSNodePortDefault}}},
		},
	}, {
		Name:     "nodePortAddresses primary",
		Snapshot: nodePortAddresses([]string{"primary"}),
		Cases: []Case{
			{Name: "nodePort on the primary IP", Src: Outside, IIF: LanIIF, Dst: "198.18.0.10:30080", Output: WebEps, Masq: true},
			{Name: "second local address", Src: Outside, IIF: LanIIF, Dst: "192.168.122.1:30080", Output: "ACCEPT"},
			// Loopback is not among the addresses: no localhost node
			// ports in iptables mode either (as upstream).
			{Name: "nodePort not on localhost", Src: "127.0.0.1", Dst: "127.0.0.1:30080", Output: "ACCEPT"},
		},
	}, {
		Name:     "nodePortAddresses CIDR",
		Snapshot: nodePortAddresses([]string{"192.168.122.0/24"}),
		Cases: []Case{
			{Name: "node IP not in the CIDR", Src: Outside, IIF: LanIIF, Dst: "198.18.0.10:30080", Output: "ACCEPT"},
			{Name: "local address in the CIDR", Src: Outside, IIF: LanIIF, Dst: "192.168.122.1:30080", Output: WebEps, Masq: true},
		},
	}, {
		Name:     "nodePortAddresses CIDR and primary",
		Snapshot: nodePortAddresses([]string{"192.168.122.0/24", "primary"}),
		Cases: []Case{
			{Name: "node IP", Src: Outside, IIF: LanIIF, Dst: "198.18.0.10:30080", Output: WebEps, Masq: true},
			{Name: "local address in the CIDR", Src: Outside, IIF: LanIIF, Dst: "192.168.122.1:30080", Output: WebEps, Masq: true},
		},
	}, {
		Name:     "nodePortAddresses all local addresses",
		Snapshot: nodePortAddresses([]string{"0.0.0.0/0", "::/0"}),
		Cases: []Case{
			{Name: "node IP", Src: Outside, IIF: LanIIF, Dst: "198.18.0.10:30080", Output: WebEps, Masq: true},
			{Name: "second local address", Src: Outside, IIF: LanIIF, Dst: "192.168.122.1:30080", Output: WebEps, Masq: true},
			{Name: "localhost", Src: "127.0.0.1", Dst: "127.0.0.1:30080", Output: "ACCEPT", Except: iptablesLocalhostWebEps},
			{Name: "not a remote address", Src: Outside, IIF: LanIIF, Dst: "198.18.0.11:30080", Output: "ACCEPT"},
			{Name: "no endpoints on any local address", Src: Outside, IIF: LanIIF, Dst: "192.168.122.1:30099", Output: "ACCEPT"},
		},
	}, {
		// The keyword "all" fills nodeport-ips with every local address.
		Name:     "nodePortAddresses all keyword",
		Snapshot: nodePortAddresses([]string{"all"}),
		Cases: []Case{
			{Name: "node IP", Src: Outside, IIF: LanIIF, Dst: "198.18.0.10:30080", Output: WebEps, Masq: true},
			{Name: "second local address", Src: Outside, IIF: LanIIF, Dst: "192.168.122.1:30080", Output: WebEps, Masq: true},
			{Name: "localhost", Src: "127.0.0.1", Dst: "127.0.0.1:30080", Output: "ACCEPT", Except: iptablesLocalhostWebEps},
		},
	}, {
		// Loopback only: nftables mode never serves it, so no NodePorts.
		Name:     "nodePortAddresses localhost keyword",
		Snapshot: nodePortAddresses([]string{"localhost"}),
		Cases: []Case{
			{Name: "node IP", Src: Outside, IIF: LanIIF, Dst: "198.18.0.10:30080", Output: "ACCEPT"},
			{Name: "localhost", Src: "127.0.0.1", Dst: "127.0.0.1:30080", Output: "ACCEPT", Except: iptablesLocalhostWebEps},
		},
	}, {
		Name:     "nodePortAddresses all keyword among CIDRs",
		Snapshot: nodePortAddresses([]string{"198.18.0.0/24", "all"}),
		Cases: []Case{
			{Name: "second local address", Src: Outside, IIF: LanIIF, Dst: "192.168.122.1:30080", Output: WebEps, Masq: true},
		},
	}, {
		// With nodePortAddresses matching every local address, the
		// loopback address of either family still does not take NodePorts
		// in nftables mode (upstream excludes 127.0.0.0/8 and ::1): a
		// packet DNATed away from a loopback source could never be routed
		// back. iptables mode takes them on IPv4 (route_localnet).
		Name:     "node ports on loopback",
		Snapshot: loopbackNodePorts,
		Cases: []Case{
			{Name: "IPv4 node IP", Src: Outside, IIF: LanIIF, Dst: "198.18.0.10:30090", Output: "198.18.130.90:8080", Masq: true},
			{Name: "IPv4 loopback", Src: "127.0.0.1", Dst: "127.0.0.1:30090", Output: "ACCEPT",
				Except: map[Mode]Exception{IPTables: {Output: "198.18.130.90:8080", Masq: true, Why: whyIPTablesLocalhostNodePorts}}},
			{Name: "IPv6 node IP", Src: Outside6, IIF: LanIIF, Dst: "[fd00:18::10]:30090", Output: "[fd00:18:1:b::90]:8080", Masq: true},
			{Name: "IPv6 loopback", Src: "::1", Dst: "[::1]:30090", Output: "ACCEPT"},
		},
	},
	// Source ranges of one family close the other family's LB VIPs (a
	// deliberate difference from upstream, see model.ServicePort.
	// LoadBalancerClosed).
	{
		Name: "LB source ranges of the other family only",
		Snapshot: exampleOf(example.NodeA, func(t testing.TB, s *Snapshot) {
			SetSourceRanges(t, s.States, []string{"2001:db8::/32"})
			if sp := s.States[model.IPv4].Services[fixtures.SPName("lb-ranges", "https", model.TCP)]; sp == nil || !sp.LoadBalancerClosed {
				t.Fatalf("lb-ranges IPv4 port: %+v, want LoadBalancerClosed", sp)
			}
		}),
		Cases: []Case{
			{Name: "LB VIP from outside (was in range)", Src: Outside, IIF: LanIIF, Dst: "198.19.200.1:443", Output: "DROP"},
			{Name: "LB VIP from denied outside source", Src: OutsideDenied, IIF: LanIIF, Dst: "198.19.200.1:443", Output: "DROP"},
			{Name: "LB VIP from other node", Src: OtherNode, IIF: LanIIF, Dst: "198.19.200.1:443", Output: "DROP"},
			{Name: "LB VIP from local pod", Src: LocalPod, IIF: PodIIF, Dst: "198.19.200.1:443", Output: "DROP"},
			{Name: "LB VIP from this node", Src: ThisNode, Dst: "198.19.200.1:443", Output: "DROP", Except: map[Mode]Exception{IPVS: {Output: WebEps, Masq: true, Why: whyIPVSSourceRangesOutput}}},
			{Name: "LB nodePort still open", Src: Outside, IIF: LanIIF, Dst: "198.18.0.10:30443", Output: WebEps, Masq: true},
			{Name: "LB clusterIP still open", Src: LocalPod, IIF: PodIIF, Dst: "198.19.0.12:443", Output: WebEps},
		},
	}, {
		// Ranges of both families: IPv4 is filtered by its own again.
		Name: "LB source ranges of both families",
		Snapshot: exampleOf(example.NodeA, func(t testing.TB, s *Snapshot) {
			SetSourceRanges(t, s.States, []string{"2001:db8::/32", "203.0.113.0/24"})
		}),
		Cases: []Case{
			{Name: "LB VIP from allowed source", Src: Outside, IIF: LanIIF, Dst: "198.19.200.1:443", Output: WebEps, Masq: true},
			{Name: "LB VIP from denied source", Src: OutsideDenied, IIF: LanIIF, Dst: "198.19.200.1:443", Output: "DROP"},
		},
	}, {
		// No ranges at all: open to everyone, as upstream.
		Name: "LB without source ranges",
		Snapshot: exampleOf(example.NodeA, func(t testing.TB, s *Snapshot) {
			SetSourceRanges(t, s.States, nil)
		}),
		Cases: []Case{
			{Name: "LB VIP open", Src: OutsideDenied, IIF: LanIIF, Dst: "198.19.200.1:443", Output: WebEps, Masq: true},
		},
	},
}

// secondLocalAddr is node-a's second local address (a bridge) in the
// nodePortAddresses scenarios.
var secondLocalAddr = netip.MustParseAddr("192.168.122.1")

// nodePortAddresses is the example with nodePortAddresses set and a host
// with a second local address and loopback.
func nodePortAddresses(addrs []string) func(t testing.TB) *Snapshot {
	return exampleOf(example.NodeA, func(_ testing.TB, s *Snapshot) {
		s.Config.NodePortAddresses = addrs
		s.LocalAddrs = []netip.Addr{NodeAIPv4, secondLocalAddr, NodeAIPv6, netip.MustParseAddr("127.0.0.1")}
	})
}

// loopbackNodePorts is one NodePort service per family (node port 30090,
// one endpoint on node-b) with nodePortAddresses matching everything.
func loopbackNodePorts(t testing.TB) *Snapshot {
	node := &model.Node{Name: example.NodeA, Addresses: []netip.Addr{NodeAIPv4, NodeAIPv6}}
	s := &Snapshot{Node: node, States: map[v1.IPFamily]*model.State{}, LocalAddrs: node.Addresses, Config: DefaultConfig()}
	s.Config.NodePortAddresses = []string{"0.0.0.0/0", "::/0"}
	for _, tc := range []struct {
		family    v1.IPFamily
		name      string
		clusterIP string
		ep        string
	}{
		{model.IPv4, "np4", "198.19.1.1", "198.18.130.90"},
		{model.IPv6, "np6", "fd00:19::1:1", "fd00:18:1:b::90"},
	} {
		sp := &model.ServicePort{
			Name:      fixtures.SPName(tc.name, "http", model.TCP),
			Family:    tc.family,
			Type:      v1.ServiceTypeNodePort,
			ClusterIP: netip.MustParseAddr(tc.clusterIP),
			Port:      80,
			NodePort:  30090,
			Protocol:  model.TCP,
		}
		ep := &model.Endpoint{IP: netip.MustParseAddr(tc.ep), Port: 8080, Ready: true, Serving: true, NodeName: example.NodeB, Zone: "zone-b"}
		st := model.NewState(tc.family)
		st.Services[sp.Name] = sp
		st.Endpoints[sp.Name] = []*model.Endpoint{ep}
		s.States[tc.family] = st
	}
	return s
}
