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
