package nftables

import (
	"net/netip"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/kernel/nft"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy/nodeports"
)

// Detect-local modes (KubeProxyConfiguration.detectLocalMode).
const (
	DetectClusterCIDR         = "ClusterCIDR"
	DetectNodeCIDR            = "NodeCIDR"
	DetectBridgeInterface     = "BridgeInterface"
	DetectInterfaceNamePrefix = "InterfaceNamePrefix"
)

// Options are the settings of one family's nftables proxier, taken from the
// KubeProxyConfiguration once at start.
type Options struct {
	Family        v1.IPFamily
	TableName     string
	MasqueradeBit int
	MasqueradeAll bool

	DetectLocalMode     string
	ClusterCIDRs        []netip.Prefix // of this family
	BridgeInterface     string
	InterfaceNamePrefix string

	// NodePortAddresses as configured (keywords and CIDRs, see package
	// nodeports); empty means "primary", nftables mode's default.
	NodePortAddresses []string
	// NodeIPs are the node's primary IPs of this family (from
	// bindAddress); when empty they are taken from the Node object.
	NodeIPs []netip.Addr
	// ServiceCIDRs stand in when a Request carries none; the ServiceCIDR
	// objects' CIDRs come in proxy.Request.ServiceCIDRs.
	ServiceCIDRs []netip.Prefix
	// ServicesPerShard: see Config (0: DefaultServicesPerShard).
	ServicesPerShard int
}

// RenderConfig derives the render Config. It is pure: the node object and
// the host's local addresses are passed in.
func (o *Options) RenderConfig(node *model.Node, localAddrs []netip.Addr) *Config {
	nodeIPs := nodeports.NodeIPs(o.Family, o.NodeIPs, node)
	c := &Config{
		Family:        o.Family,
		TableName:     o.TableName,
		MasqueradeBit: o.MasqueradeBit,
		MasqueradeAll: o.MasqueradeAll,
		NodeIPs:       nodeIPs,
		ServiceCIDRs:  o.ServiceCIDRs,

		ServicesPerShard: o.ServicesPerShard,
	}
	c.LocalDetector = o.localDetector(node)
	configured := o.NodePortAddresses
	if len(configured) == 0 {
		configured = []string{nodeports.Primary}
	}
	var nodeIP netip.Addr
	if len(nodeIPs) > 0 {
		nodeIP = nodeIPs[0]
	}
	npa := nodeports.New(o.Family, configured, nodeIP)
	c.NodePortAllLocal = npa.MatchAll
	if !npa.MatchAll {
		for _, a := range npa.Match(localAddrs) {
			// Never NodePorts on loopback in nftables mode, as upstream
			// (see nodePortMatch).
			if !a.IsLoopback() {
				c.NodePortIPs = append(c.NodePortIPs, a)
			}
		}
	}
	return c
}

func (o *Options) localDetector(node *model.Node) LocalDetector {
	saddr := func(p []netip.Prefix) LocalDetector {
		if len(p) == 0 {
			return LocalDetector{}
		}
		return LocalDetector{
			IfLocal:    []nft.Stmt{nft.MatchAddr{Source: true, Prefixes: p}},
			IfNotLocal: []nft.Stmt{nft.MatchAddr{Source: true, Negate: true, Prefixes: p}},
		}
	}
	iif := func(name string, prefix bool) LocalDetector {
		if name == "" {
			return LocalDetector{}
		}
		return LocalDetector{
			IfLocal:    []nft.Stmt{nft.MatchIifname{Name: name, Prefix: prefix}},
			IfNotLocal: []nft.Stmt{nft.MatchIifname{Negate: true, Name: name, Prefix: prefix}},
		}
	}
	switch o.DetectLocalMode {
	case DetectNodeCIDR:
		cidrs := node.PodCIDRsOf(o.Family)
		if len(cidrs) > 1 {
			cidrs = cidrs[:1]
		}
		return saddr(cidrs)
	case DetectBridgeInterface:
		return iif(o.BridgeInterface, false)
	case DetectInterfaceNamePrefix:
		return iif(o.InterfaceNamePrefix, true)
	default:
		return saddr(o.ClusterCIDRs)
	}
}
