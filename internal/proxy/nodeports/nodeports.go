// Package nodeports resolves nodePortAddresses (--nodeport-addresses) for
// one IP family, the same way for every proxy mode. It is upstream's
// expandNodePortAddressKeywords (cmd/kube-proxy/app/server.go) followed by
// NewNodePortAddresses and GetNodeIPs (pkg/proxy/util/nodeport_addresses.go):
//
//   - keywords expand to CIDRs of both families: "primary" to the node's
//     primary IPs (/32, /128; a family whose primary IP is unknown or
//     loopback gets nothing), "localhost" to 127.0.0.0/8 and ::1/128, "all"
//     to 0.0.0.0/0 and ::/0; keywords and CIDRs mix freely;
//   - a family left with no CIDR gets its zero CIDR: every local address.
//     So an unset list means all (iptables mode's default; nftables mode's
//     default "primary" is applied by its caller), and a list naming CIDRs
//     of one family only leaves the other family on all its addresses;
//   - a zero CIDR of the family wins over everything else (MatchAll).
//
// Upstream resolves "primary" once at start and restarts when the node's IPs
// change; kproxy resolves it at every sync from the Node object it holds,
// which ends in the same rules without the restart.
package nodeports

import (
	"net/netip"
	"slices"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/model"
)

// Keywords of nodePortAddresses (v1.37).
const (
	Primary   = "primary"
	Localhost = "localhost"
	All       = "all"
)

var (
	ipv4Loopback = netip.MustParsePrefix("127.0.0.0/8")
	ipv6Loopback = netip.MustParsePrefix("::1/128")
)

// Loopback returns the loopback CIDR of family f.
func Loopback(f v1.IPFamily) netip.Prefix {
	if f == model.IPv6 {
		return ipv6Loopback
	}
	return ipv4Loopback
}

// Addresses is nodePortAddresses resolved for one family.
type Addresses struct {
	Family v1.IPFamily
	// CIDRs of the family the node ports answer on (masked). With
	// MatchAll it is the zero CIDR alone.
	CIDRs []netip.Prefix
	// MatchAll: node ports answer on every local address of the family.
	MatchAll bool
	// ContainsIPv4Loopback: some CIDR contains 127.0.0.0 (the zero CIDR
	// too). In iptables mode, localhost node ports need it.
	ContainsIPv4Loopback bool
	// ContainsExplicitLoopback: some CIDR is itself a loopback CIDR
	// ("localhost", 127.0.0.0/8, ::1/128), not a wider one around it.
	ContainsExplicitLoopback bool
}

// NodeIPs returns the node's primary IPs of family f: override when set
// (from bindAddress, which upstream's detectNodeIPs puts first), else the
// Node's primary IP of the family (InternalIP before ExternalIP), else none.
func NodeIPs(f v1.IPFamily, override []netip.Addr, node *model.Node) []netip.Addr {
	if len(override) > 0 {
		return override
	}
	if a := node.PrimaryIP(f); a.IsValid() {
		return []netip.Addr{a}
	}
	return nil
}

// Expand replaces the keywords of a nodePortAddresses list by CIDRs of both
// families (upstream's expandNodePortAddressKeywords). Entries that are not
// keywords are kept as written.
func Expand(configured []string, primary map[v1.IPFamily]netip.Addr) []string {
	var out []string
	for _, s := range configured {
		switch s {
		case Primary:
			for _, f := range []v1.IPFamily{model.IPv4, model.IPv6} {
				if a, ok := primary[f]; ok && a.IsValid() && !a.IsLoopback() {
					out = append(out, netip.PrefixFrom(a, a.BitLen()).String())
				}
			}
		case Localhost:
			out = append(out, ipv4Loopback.String(), ipv6Loopback.String())
		case All:
			out = append(out, "0.0.0.0/0", "::/0")
		default:
			out = append(out, s)
		}
	}
	return out
}

// New resolves a nodePortAddresses list (keywords allowed; entries that are
// neither keywords nor CIDRs were refused by validation and are skipped)
// for family f; nodeIP is the node's primary IP of f (see NodeIPs), the
// zero Addr when unknown.
func New(f v1.IPFamily, configured []string, nodeIP netip.Addr) Addresses {
	a := Addresses{Family: f}
	var cidrs []netip.Prefix
	for _, s := range Expand(configured, map[v1.IPFamily]netip.Addr{f: nodeIP}) {
		p, err := netip.ParsePrefix(s)
		if err != nil || model.FamilyOf(p.Addr()) != f {
			continue
		}
		cidrs = append(cidrs, p.Masked())
	}
	if len(cidrs) == 0 {
		cidrs = []netip.Prefix{netip.PrefixFrom(zero(f), 0)}
	}
	for _, p := range cidrs {
		if p.Addr().IsLoopback() {
			a.ContainsExplicitLoopback = true
		}
	}
	for _, p := range cidrs {
		if f == model.IPv4 && (p.Addr().IsLoopback() || p.Contains(ipv4Loopback.Addr())) {
			a.ContainsIPv4Loopback = true
		}
		if p.Bits() == 0 {
			a.CIDRs = []netip.Prefix{p}
			a.MatchAll = true
			break
		}
		if !slices.Contains(a.CIDRs, p) {
			a.CIDRs = append(a.CIDRs, p)
		}
	}
	return a
}

func zero(f v1.IPFamily) netip.Addr {
	if f == model.IPv6 {
		return netip.IPv6Unspecified()
	}
	return netip.IPv4Unspecified()
}

// Match returns the local addresses (of the family) inside the CIDRs,
// sorted and without duplicates: upstream's GetNodeIPs. Callers decide
// about loopback addresses, which each mode treats its own way.
func (a Addresses) Match(local []netip.Addr) []netip.Addr {
	var out []netip.Addr
	for _, ip := range local {
		ip = ip.Unmap()
		if model.FamilyOf(ip) != a.Family {
			continue
		}
		for _, p := range a.CIDRs {
			if p.Contains(ip) {
				out = append(out, ip)
				break
			}
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// CoversIPv4Loopback reports whether the list covers 127.0.0.0/8 whatever
// the node's IPs turn out to be: what iptables mode decides
// route_localnet=1 on at start, before the Node is known. "primary" stands
// for one non-loopback IPv4 address there (192.0.2.1, only a placeholder),
// so that a node not seen yet does not turn route_localnet on for a list
// that will not cover loopback once it is.
func CoversIPv4Loopback(configured []string) bool {
	return New(model.IPv4, configured, netip.AddrFrom4([4]byte{192, 0, 2, 1})).ContainsIPv4Loopback
}
