package nftables

import (
	"net/netip"

	v1 "k8s.io/api/core/v1"
	"k8s.io/kube-proxy/config/v1alpha1"

	"github.com/kproxy/kproxy/internal/config"
	"github.com/kproxy/kproxy/internal/kernel/nft"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy/localdetect"
	"github.com/kproxy/kproxy/internal/proxy/nodeports"
)

// Options are the settings of one family's nftables proxier, taken from the
// KubeProxyConfiguration once at start.
type Options struct {
	Family    v1.IPFamily
	TableName string
	// ModeOptions: masquerading, local traffic detection (every cluster
	// CIDR of the family is matched, as upstream), node port addresses
	// (empty means "primary", nftables mode's default) and node IPs.
	config.ModeOptions
	// ServiceCIDRs stand in when a Request carries none; the ServiceCIDR
	// objects' CIDRs come in proxy.Request.ServiceCIDRs.
	ServiceCIDRs []netip.Prefix
	// ServicesPerShard: see Config (0: DefaultServicesPerShard).
	ServicesPerShard int
}

// NewOptions derives one family's options from the configuration, for
// the proxy and `kproxy render` alike.
func NewOptions(c *v1alpha1.KubeProxyConfiguration, family v1.IPFamily) Options {
	return Options{
		Family:      family,
		TableName:   DefaultTableName,
		ModeOptions: config.NewModeOptions(c, family),
	}
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

// localDetector writes what detectLocalMode matches on (package
// localdetect, shared with the other modes) as nft statements: every
// cluster CIDR of the family, or the interface name or prefix.
func (o *Options) localDetector(node *model.Node) LocalDetector {
	ld := o.LocalDetect
	ld.Family = o.Family
	m := localdetect.Resolve(ld, node)
	switch {
	case len(m.CIDRs) > 0:
		return LocalDetector{
			IfLocal:    []nft.Stmt{nft.MatchAddr{Source: true, Prefixes: m.CIDRs}},
			IfNotLocal: []nft.Stmt{nft.MatchAddr{Source: true, Negate: true, Prefixes: m.CIDRs}},
		}
	case m.Interface != "":
		return LocalDetector{
			IfLocal:    []nft.Stmt{nft.MatchIifname{Name: m.Interface, Prefix: m.Prefix}},
			IfNotLocal: []nft.Stmt{nft.MatchIifname{Negate: true, Name: m.Interface, Prefix: m.Prefix}},
		}
	default:
		return LocalDetector{}
	}
}
