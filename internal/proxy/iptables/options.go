package iptables

import (
	"net/netip"

	v1 "k8s.io/api/core/v1"
	"k8s.io/kube-proxy/config/v1alpha1"
	"k8s.io/utils/ptr"

	"github.com/kproxy/kproxy/internal/config"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy/localdetect"
	"github.com/kproxy/kproxy/internal/proxy/masquerade"
	"github.com/kproxy/kproxy/internal/proxy/nodeports"
)

// DefaultMaxChainsPerRestore bounds the chains one iptables-nft-restore
// run creates or rewrites. iptables-nft (1.8.x) handles the chains of one
// batch in lists, so a run's cost grows with the square of its chain
// count: at 10k services × 10 endpoints (110k chains) upstream's single
// restore did not finish in 10 minutes; runs of 5000 chains take 38 s in
// all, of 2000 15 s, of 1000 or 500 6.5 s (each run also pays a kernel
// validation of the whole nat table, so much smaller runs lose again).
// iptables-legacy-restore is the opposite: each run reads and replaces the
// whole table, so it gets one run (no limit).
const DefaultMaxChainsPerRestore = 1000

// Options are the settings of one family's iptables proxier, taken from the
// KubeProxyConfiguration once at start.
type Options struct {
	Family v1.IPFamily
	// Hostname is this node's name: it selects node topology hints when
	// the Node object is not known.
	Hostname string
	// ModeOptions: masquerading, local traffic detection, node port
	// addresses (empty: every local address, iptables mode's default) and
	// node IPs (a node inside a service's loadBalancerSourceRanges may
	// reach its LB IP); the first cluster CIDR is used, as upstream.
	config.ModeOptions
	// LocalhostNodePorts (iptables.localhostNodePorts, default true):
	// IPv4 node ports answer on 127.0.0.0/8 too, which needs
	// route_localnet=1 (the caller sets it) and the guard rule against
	// martian packets to 127.0.0.0/8 from other hosts. It is off when
	// nodePortAddresses leaves loopback out, as upstream.
	LocalhostNodePorts bool

	// ConntrackTCPBeLiberal is net.netfilter.nf_conntrack_tcp_be_liberal
	// != 0: then packets conntrack calls INVALID are not dropped in
	// KUBE-FORWARD (they would reset connections otherwise).
	ConntrackTCPBeLiberal bool
	// NoRandomFully leaves --random-fully off MASQUERADE (iptables older
	// than 1.6.2 or kernels older than 3.14).
	NoRandomFully bool
	// MaxChainsPerRestore: see DefaultMaxChainsPerRestore. The proxier
	// fills it in from the backend when zero; negative means no limit.
	MaxChainsPerRestore int
	// CompactLayout leaves out the KUBE-SEP chains: the KUBE-SVC/KUBE-SVL
	// rules DNAT themselves (with the affinity update in the same rule),
	// and hairpin traffic of local endpoints is marked in KUBE-POSTROUTING.
	// Every other chain and name stays upstream's. A sync's cost is set by
	// the rules the kernel holds, not by what changed: iptables-nft's
	// kernel validates the whole nat table on every commit, legacy copies
	// it twice; at 10k services × 10 endpoints this layout holds a third
	// of the rules. What it changes: `iptables-save | grep KUBE-SEP` finds
	// nothing, and a remote pod's packet routed to this node and DNATed
	// back to itself is not masqueraded (upstream's per-endpoint rule
	// catches it; kube-proxy on the pod's own node normally handles its
	// traffic first). Off by default.
	CompactLayout bool
}

// NewOptions derives one family's options from the configuration, for
// the proxy and `kproxy render` alike; hostname is the node's name. What
// is not in the configuration (ConntrackTCPBeLiberal, read from the
// kernel; CompactLayout, a kproxy flag; MaxChainsPerRestore) is left to
// the caller.
func NewOptions(c *v1alpha1.KubeProxyConfiguration, family v1.IPFamily, hostname string) Options {
	return Options{
		Family:             family,
		Hostname:           hostname,
		ModeOptions:        config.NewModeOptions(c, family),
		LocalhostNodePorts: ptr.Deref(c.IPTables.LocalhostNodePorts, true),
	}
}

// RenderConfig derives the render Config. It is pure: the node object and
// the host's local addresses are passed in.
// NeedsRouteLocalnet says whether this family's proxier serves node ports
// on 127.0.0.1 and so needs net.ipv4.conf.all.route_localnet=1, as
// upstream's NewProxier decides it: iptables.localhostNodePorts on, IPv4,
// and nodePortAddresses covering 127.0.0.1 (the "primary" keyword never
// does: it means the node's own address).
func (o *Options) NeedsRouteLocalnet() bool {
	return o.LocalhostNodePorts && o.Family == model.IPv4 && nodeports.CoversIPv4Loopback(o.NodePortAddresses)
}

func (o *Options) RenderConfig(node *model.Node, localAddrs []netip.Addr) *Config {
	nodeIPs := nodeports.NodeIPs(o.Family, o.NodeIPs, node)
	c := &Config{
		Family:                o.Family,
		MasqueradeMark:        masquerade.Mark(o.MasqueradeBit),
		MasqueradeAll:         o.MasqueradeAll,
		RandomFully:           !o.NoRandomFully,
		ConntrackTCPBeLiberal: o.ConntrackTCPBeLiberal,
		MaxChainsPerRestore:   o.MaxChainsPerRestore,
		Compact:               o.CompactLayout,
		LocalDetector:         o.localDetector(node),
	}
	var nodeIP netip.Addr
	if len(nodeIPs) > 0 {
		nodeIP = nodeIPs[0]
		c.NodeIP = nodeIP
	}
	npa := nodeports.New(o.Family, o.NodePortAddresses, nodeIP)
	// Localhost node ports (IPv4 only) need loopback among the node port
	// addresses, as upstream.
	c.LocalhostNodePorts = o.LocalhostNodePorts && o.Family == model.IPv4 && npa.ContainsIPv4Loopback
	c.NodePortAllLocal = npa.MatchAll
	if npa.MatchAll {
		return c
	}
	for _, a := range npa.Match(localAddrs) {
		if a.IsLoopback() && !c.LocalhostNodePorts {
			// Upstream logs and skips it: a loopback node port address
			// needs localhost node ports (never on IPv6).
			continue
		}
		c.NodePortIPs = append(c.NodePortIPs, a)
	}
	return c
}

// localDetector returns the match arguments that tell pod traffic apart,
// as upstream's LocalTrafficDetector (package localdetect, shared with
// ipvs mode).
func (o *Options) localDetector(node *model.Node) LocalDetector {
	ld := o.LocalDetect
	ld.Family = o.Family
	return localdetect.NewIPTables(ld, node)
}
