package config

import (
	"net/netip"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/kube-proxy/config/v1alpha1"

	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy/localdetect"
)

// What every mode's options take from the configuration the same way
// (each backend's NewOptions).

// ModeOptions are the settings every mode's Options embed, derived from
// the configuration the same way for each (NewModeOptions).
type ModeOptions struct {
	MasqueradeBit int
	MasqueradeAll bool

	// LocalDetect is detectLocalMode with its inputs (the backend fills
	// Family in from its own).
	LocalDetect localdetect.Config

	// NodePortAddresses as configured (keywords and CIDRs, see package
	// nodeports); what empty means is the mode's default.
	NodePortAddresses []string
	// NodeIPs are the node's primary IPs of this family (from
	// bindAddress); when empty they are taken from the Node object.
	NodeIPs []netip.Addr
}

// NewModeOptions derives family f's ModeOptions from the configuration.
func NewModeOptions(c *v1alpha1.KubeProxyConfiguration, f v1.IPFamily) ModeOptions {
	return ModeOptions{
		MasqueradeBit:     int(MasqueradeBit(c)),
		MasqueradeAll:     MasqueradeAll(c),
		LocalDetect:       LocalDetect(c, f),
		NodePortAddresses: c.NodePortAddresses,
		NodeIPs:           BindNodeIPs(c, f),
	}
}

// ClusterCIDRs parses clusterCIDR (comma-separated; validation refused
// bad ones, which are skipped here).
func ClusterCIDRs(c *v1alpha1.KubeProxyConfiguration) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range strings.Split(c.ClusterCIDR, ",") {
		if p, err := netip.ParsePrefix(strings.TrimSpace(s)); err == nil {
			out = append(out, p.Masked())
		}
	}
	return out
}

// OfFamily keeps the prefixes of family f.
func OfFamily(ps []netip.Prefix, f v1.IPFamily) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range ps {
		if model.FamilyOf(p.Addr()) == f {
			out = append(out, p)
		}
	}
	return out
}

// LocalDetect is detectLocalMode with its inputs for family f, as every
// mode takes it (package localdetect).
func LocalDetect(c *v1alpha1.KubeProxyConfiguration, f v1.IPFamily) localdetect.Config {
	return localdetect.Config{
		Mode:                string(c.DetectLocalMode),
		Family:              f,
		ClusterCIDRs:        OfFamily(ClusterCIDRs(c), f),
		BridgeInterface:     c.DetectLocal.BridgeInterface,
		InterfaceNamePrefix: c.DetectLocal.InterfaceNamePrefix,
	}
}

// BindNodeIPs is the node's primary IP of family f as bindAddress gives
// it (every mode's NodeIPs option); nil when it is unspecified or of the
// other family (the Node object's addresses then).
func BindNodeIPs(c *v1alpha1.KubeProxyConfiguration, f v1.IPFamily) []netip.Addr {
	if ip, err := netip.ParseAddr(c.BindAddress); err == nil && !ip.IsUnspecified() && model.FamilyOf(ip) == f {
		return []netip.Addr{ip}
	}
	return nil
}
