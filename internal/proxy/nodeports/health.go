package nodeports

import (
	"net/netip"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/internal/model"
)

// HealthCheckAddrs are the addresses the health check node ports listen
// on: as upstream's service health server, the node's addresses inside
// configured (nodePortAddresses with the mode's default applied: "primary"
// in nftables mode), an unspecified address for a family that matches
// every local address. Resolved like the rules' node port addresses, from
// node (the Node kproxy holds, so that they follow a changed node IP) and
// bindAddress (which stands for the node's IP of its family). When the
// local addresses cannot be read it falls back to every address, as
// upstream does.
func HealthCheckAddrs(configured []string, bindAddress string, fams []v1.IPFamily, node *model.Node, local func() ([]netip.Addr, error)) []netip.Addr {
	var out []netip.Addr
	var addrs []netip.Addr
	for _, f := range fams {
		var override []netip.Addr
		if ip, err := netip.ParseAddr(bindAddress); err == nil && !ip.IsUnspecified() && model.FamilyOf(ip) == f {
			override = []netip.Addr{ip}
		}
		var nodeIP netip.Addr
		if ips := NodeIPs(f, override, node); len(ips) > 0 {
			nodeIP = ips[0]
		}
		npa := New(f, configured, nodeIP)
		if npa.MatchAll {
			out = append(out, zero(f))
			continue
		}
		if addrs == nil {
			var err error
			if addrs, err = local(); err != nil {
				klog.ErrorS(err, "Failed to get node ip address matching node port addresses, health check port will listen to all node addresses", "nodePortAddresses", configured)
				return []netip.Addr{netip.IPv4Unspecified(), netip.IPv6Unspecified()}
			}
		}
		out = append(out, npa.Match(addrs)...)
	}
	return out
}
