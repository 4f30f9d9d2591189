// Package localdetect is detectLocalMode, upstream's LocalTrafficDetector:
// Resolve says what a mode matches on, for every mode; NewIPTables writes
// it as iptables match arguments (iptables, and ipvs's few chains), the
// nftables backend as nft statements.
package localdetect

import (
	"net/netip"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/model"
)

// Detect-local modes (KubeProxyConfiguration.detectLocalMode).
const (
	ClusterCIDR         = "ClusterCIDR"
	NodeCIDR            = "NodeCIDR"
	BridgeInterface     = "BridgeInterface"
	InterfaceNamePrefix = "InterfaceNamePrefix"
)

// Config is what detectLocalMode needs of kproxy's configuration.
type Config struct {
	Mode                string
	Family              v1.IPFamily
	ClusterCIDRs        []netip.Prefix // of Family; the first is used, as upstream
	BridgeInterface     string
	InterfaceNamePrefix string
}

// IPTables tells traffic from local pods apart from other traffic:
// iptables match arguments, nil when the mode has nothing to match on for
// this family (then no masquerade rule for cluster IP traffic is written
// and pod traffic is not short-circuited, as upstream).
type IPTables struct {
	IfLocal    []string
	IfNotLocal []string
}

// Implemented reports whether local traffic can be recognised.
func (d IPTables) Implemented() bool { return len(d.IfNotLocal) > 0 }

// Match is what detectLocalMode matches on for one family, whatever the
// rule syntax: source prefixes, or the input interface (Prefix: a name
// prefix). The zero value matches nothing.
type Match struct {
	CIDRs     []netip.Prefix
	Interface string
	Prefix    bool
}

// Resolve returns what c matches on: the first cluster CIDR of the family
// (ClusterCIDR, the default), the node's first pod CIDR of the family
// (NodeCIDR; node nil: none known), the bridge interface or the interface
// name prefix.
func Resolve(c Config, node *model.Node) Match {
	switch c.Mode {
	case NodeCIDR:
		cidrs := node.PodCIDRsOf(c.Family)
		if len(cidrs) > 1 {
			cidrs = cidrs[:1]
		}
		return Match{CIDRs: cidrs}
	case BridgeInterface:
		return Match{Interface: c.BridgeInterface}
	case InterfaceNamePrefix:
		return Match{Interface: c.InterfaceNamePrefix, Prefix: true}
	default:
		// Upstream's detector takes the first cluster CIDR of the family
		// (cidrs[0] in getLocalDetectors), in every mode.
		cidrs := c.ClusterCIDRs
		if len(cidrs) > 1 {
			cidrs = cidrs[:1]
		}
		return Match{CIDRs: cidrs}
	}
}

// NewIPTables returns the detector of c: one CIDR per family ("-s CIDR",
// the first, as upstream), or the interface ("-i NAME", "-i PREFIX+").
// node gives the pod CIDRs of NodeCIDR (nil: none known).
func NewIPTables(c Config, node *model.Node) IPTables {
	iif := func(name string) IPTables {
		return IPTables{IfLocal: []string{"-i", name}, IfNotLocal: []string{"!", "-i", name}}
	}
	switch m := Resolve(c, node); {
	case len(m.CIDRs) > 0:
		s := m.CIDRs[0].Masked().String()
		return IPTables{IfLocal: []string{"-s", s}, IfNotLocal: []string{"!", "-s", s}}
	case m.Interface == "":
		return IPTables{}
	case m.Prefix:
		return iif(m.Interface + "+")
	case m.Interface == "+":
		// A bridge named "+" would match every interface.
		return IPTables{}
	default:
		return iif(m.Interface)
	}
}
