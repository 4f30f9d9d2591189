package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/kproxy/kproxy/internal/kernel/xtables"
	"github.com/kproxy/kproxy/internal/trace"
	iptrace "github.com/kproxy/kproxy/internal/trace/iptables"
	"github.com/kproxy/kproxy/test/e2e/framework"
)

func init() {
	modes = append(modes, iptablesModeCase(xtables.Legacy), iptablesModeCase(xtables.NFT))
}

// iptablesModeCase is --proxy-mode iptables with one backend, chosen with
// IPTABLES_MODE as RKE2 users do. Its rules are read with that backend's
// save binaries. It has no identity: iptables rules carry no handle that
// survives a rewrite, so "no flush" is checked by traffic alone.
func iptablesModeCase(b xtables.Backend) modeCase {
	return modeCase{
		name:        "iptables-" + string(b),
		proxyMode:   "iptables",
		env:         []string{xtables.EnvMode + "=" + string(b)},
		minSyncFlag: "--iptables-min-sync-period",
		captured:    func(ns string) ([]string, error) { return iptablesCaptured(ns, b) },
		trace: func(ns string, pkt trace.Packet, local []netip.Addr) ([]netip.AddrPort, error) {
			return iptablesTrace(ns, b, pkt, local)
		},
	}
}

// saveBin is the backend's save binary of a family ("ip" or "ip6").
func saveBin(b xtables.Backend, fam string) string {
	if fam == "ip6" {
		return "ip6tables-" + string(b) + "-save"
	}
	return "iptables-" + string(b) + "-save"
}

// iptablesCaptured lists what the nat table's KUBE-SERVICES (service
// addresses) and KUBE-NODEPORTS (node ports) rules send to a service, in
// the same form as nftCaptured: "198.19.0.10 . tcp . 80" and
// "ip nodeport tcp . 30080".
func iptablesCaptured(ns string, b xtables.Backend) ([]string, error) {
	var out []string
	for _, fam := range nftFamilies {
		text, err := framework.RunIn(context.Background(), ns, saveBin(b, fam), "-t", "nat")
		if err != nil {
			return nil, err
		}
		for _, line := range strings.Split(text, "\n") {
			f, err := xtables.Fields(line)
			if err != nil || len(f) < 2 || f[0] != "-A" {
				continue
			}
			jump, proto, port, dst := opt(f, "-j"), opt(f, "-p"), opt(f, "--dport"), opt(f, "-d")
			if !strings.HasPrefix(jump, "KUBE-SVC-") && !strings.HasPrefix(jump, "KUBE-SVL-") &&
				!strings.HasPrefix(jump, "KUBE-EXT-") && !strings.HasPrefix(jump, "KUBE-FW-") {
				continue
			}
			switch f[1] {
			case "KUBE-SERVICES":
				p, err := netip.ParsePrefix(dst)
				if err != nil || proto == "" || port == "" {
					continue
				}
				out = append(out, fmt.Sprintf("%s . %s . %s", p.Addr(), proto, port))
			case "KUBE-NODEPORTS":
				if proto != "" && port != "" {
					out = append(out, fmt.Sprintf("%s nodeport %s . %s", fam, proto, port))
				}
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// opt returns the value of the first option called name in a rule.
func opt(fields []string, name string) string {
	for i := 0; i+1 < len(fields); i++ {
		if fields[i] == name {
			return fields[i+1]
		}
	}
	return ""
}

// iptablesTrace walks pkt through the node's live iptables rules of its
// family.
func iptablesTrace(ns string, b xtables.Backend, pkt trace.Packet, local []netip.Addr) ([]netip.AddrPort, error) {
	fam := "ip"
	if pkt.Dst.Is6() {
		fam = "ip6"
	}
	text, err := framework.RunIn(context.Background(), ns, saveBin(b, fam))
	if err != nil {
		return nil, err
	}
	rs, err := iptrace.Parse([]byte(text))
	if err != nil {
		return nil, fmt.Errorf("parsing the live iptables rules: %w", err)
	}
	rs.RouteLocalnet = true // kproxy sets it for localhost node ports
	res, err := rs.Trace(pkt, trace.Host{LocalAddrs: local})
	if err != nil {
		return nil, err
	}
	return res.Endpoints(), nil
}
