// Package localdetect is detectLocalMode for the modes that write
// iptables rules (iptables, and ipvs's few chains): upstream's
// LocalTrafficDetector as iptables match arguments.
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

// NewIPTables returns the detector of c: one CIDR per family ("-s CIDR"),
// or the interface ("-i NAME", "-i PREFIX+"). node gives the pod CIDRs of
// NodeCIDR (nil: none known).
func NewIPTables(c Config, node *model.Node) IPTables {
	cidr := func(p []netip.Prefix) IPTables {
		if len(p) == 0 {
			return IPTables{}
		}
		s := p[0].Masked().String()
		return IPTables{IfLocal: []string{"-s", s}, IfNotLocal: []string{"!", "-s", s}}
	}
	iif := func(name string) IPTables {
		if name == "" || name == "+" {
			return IPTables{}
		}
		return IPTables{IfLocal: []string{"-i", name}, IfNotLocal: []string{"!", "-i", name}}
	}
	switch c.Mode {
	case NodeCIDR:
		return cidr(node.PodCIDRsOf(c.Family))
	case BridgeInterface:
		return iif(c.BridgeInterface)
	case InterfaceNamePrefix:
		if c.InterfaceNamePrefix == "" {
			return IPTables{}
		}
		return iif(c.InterfaceNamePrefix + "+")
	default:
		return cidr(c.ClusterCIDRs)
	}
}
