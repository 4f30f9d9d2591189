package nftables

import (
	"net/netip"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/kernel/nft"
	"github.com/kproxy/kproxy/internal/model"
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

	// NodePortAddresses as configured: empty or "primary" means the
	// node's primary IPs; else CIDRs, matched against local addresses.
	NodePortAddresses []string
	// NodeIPs are the node's primary IPs of this family; when empty they
	// are taken from the Node object.
	NodeIPs      []netip.Addr
	ServiceCIDRs []netip.Prefix
	// ServicesPerShard: see Config (0: DefaultServicesPerShard).
	ServicesPerShard int
}

// RenderConfig derives the render Config. It is pure: the node object and
// the host's local addresses are passed in.
func (o *Options) RenderConfig(node *model.Node, localAddrs []netip.Addr) *Config {
	nodeIPs := o.NodeIPs
	if len(nodeIPs) == 0 && node != nil {
		// The node's primary IP of this family: the first address of the
		// family in its status (InternalIP before ExternalIP as listed).
		for _, a := range node.Addresses {
			if model.FamilyOf(a) == o.Family {
				nodeIPs = []netip.Addr{a}
				break
			}
		}
	}
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
	primary := len(o.NodePortAddresses) == 0
	var cidrs []netip.Prefix
	for _, s := range o.NodePortAddresses {
		if s == "primary" {
			primary = true
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil || model.FamilyOf(p.Addr()) != o.Family {
			continue // validated at start; other family's CIDRs are not ours
		}
		if p.Bits() == 0 {
			c.NodePortAllLocal = true
		}
		cidrs = append(cidrs, p)
	}
	if !c.NodePortAllLocal {
		seen := map[netip.Addr]bool{}
		add := func(a netip.Addr) {
			if !seen[a] && model.FamilyOf(a) == o.Family {
				seen[a] = true
				c.NodePortIPs = append(c.NodePortIPs, a)
			}
		}
		if primary {
			for _, a := range nodeIPs {
				add(a)
			}
		}
		for _, a := range localAddrs {
			for _, p := range cidrs {
				if p.Contains(a) {
					add(a)
				}
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
