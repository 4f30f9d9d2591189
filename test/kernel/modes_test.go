package kernel

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kproxy/kproxy/internal/kernel/xtables"
	"github.com/kproxy/kproxy/internal/testutil/netns"
)

// modes are the proxy modes every feature test runs in: nftables, and
// iptables once per backend (legacy and nft), chosen with IPTABLES_MODE as
// RKE2 users do. Each test runs once per mode, in its own cluster of
// namespaces, as a parallel subtest named after the mode.
var modes = []proxyMode{nftablesMode, iptablesMode(xtables.Legacy), iptablesMode(xtables.NFT), compactMode()}

// compactMode is iptables mode with --iptables-compact-layout (no KUBE-SEP
// chains; the KUBE-SVC rules DNAT directly), on the nft backend.
func compactMode() proxyMode {
	m := iptablesMode(xtables.NFT)
	m.name += "-compact"
	m.args = []string{"--iptables-compact-layout"}
	return m
}

// forEachMode runs f once per proxy mode.
func forEachMode(t *testing.T, f func(t *testing.T, m proxyMode)) {
	t.Parallel()
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			for _, bin := range m.needs {
				netns.Require(t, bin)
			}
			f(t, m)
		})
	}
}

// iptablesMode is --proxy-mode iptables with one backend. Its rules are
// read with that backend's own save binaries.
func iptablesMode(b xtables.Backend) proxyMode {
	saves := saveBinaries(b)
	return proxyMode{
		name:     "iptables-" + string(b),
		flag:     "iptables",
		env:      []string{xtables.EnvMode + "=" + string(b)},
		needs:    saves,
		iptables: true,
		dump: func(n *netns.NS) (string, error) {
			var sb strings.Builder
			err := saveBoth(n, &sb, saves...)
			return sb.String(), err
		},
		routesTo: iptablesRoutesTo,
	}
}

// saveBinaries are a backend's save binaries, IPv4's then IPv6's.
func saveBinaries(b xtables.Backend) []string {
	return []string{"iptables-" + string(b) + "-save", "ip6tables-" + string(b) + "-save"}
}

// saveBoth appends what each save binary (IPv4's, then IPv6's) prints in
// n to sb, stopping at the first that fails.
func saveBoth(n *netns.NS, sb *strings.Builder, saves ...string) error {
	for _, bin := range saves {
		out, err := n.Exec(10*time.Second, bin)
		if err != nil {
			return err
		}
		sb.WriteString(out)
	}
	return nil
}

// iptablesRoutesTo reports whether an iptables-save dump sends traffic of
// the service port ("demo/dns-udp/udp/dns") to the endpoint: a KUBE-SEP
// chain of that service port (upstream's comment "demo/dns-udp:dns") DNATs
// to the endpoint and some rule jumps to it. A partial sync rewrites
// changed chains and deletes stale ones in the same restore, so the dump
// has no shadowed rules to skip.
func iptablesRoutesTo(dump, servicePort string, endpoint netip.Addr) bool {
	parts := strings.Split(servicePort, "/")
	if len(parts) != 4 {
		return false
	}
	comment := parts[0] + "/" + parts[1] + ":" + parts[3]
	proto := parts[2]
	target := netip.AddrPortFrom(endpoint, 0).String()
	target = strings.TrimSuffix(target, ":0") + ":"
	seps := map[string]bool{}
	var jumps []string
	for _, line := range strings.Split(dump, "\n") {
		f, err := xtables.Fields(line)
		if err != nil || len(f) < 2 || f[0] != "-A" {
			continue
		}
		var dnatTo, com, p, jump string
		for i := 2; i+1 < len(f); i++ {
			switch f[i] {
			case "--to-destination":
				dnatTo = f[i+1]
			case "--comment":
				com = f[i+1]
			case "-p":
				p = f[i+1]
			case "-j":
				jump = f[i+1]
			}
		}
		if strings.HasPrefix(jump, "KUBE-SEP-") {
			jumps = append(jumps, jump)
		}
		// The compact layout DNATs in the service port's own chains.
		if (strings.HasPrefix(f[1], "KUBE-SVC-") || strings.HasPrefix(f[1], "KUBE-SVL-")) && jump == "DNAT" &&
			strings.HasPrefix(com, comment+" -> ") && p == proto && strings.HasPrefix(dnatTo, target) {
			return true
		}
		if strings.HasPrefix(f[1], "KUBE-SEP-") && jump == "DNAT" && com == comment && p == proto && strings.HasPrefix(dnatTo, target) {
			seps[f[1]] = true
		}
	}
	for _, j := range jumps {
		if seps[j] {
			return true
		}
	}
	return false
}

// captures reports whether the mode's rules send traffic to ip:port/proto
// to a service: a service-ips element in nftables mode, a KUBE-SERVICES
// rule in iptables mode. An empty ip asks for a node port.
func (m proxyMode) captures(dump, ip, proto string, port int) bool {
	if !m.iptables {
		if ip == "" {
			return strings.Contains(dump, fmt.Sprintf("%s . %d", proto, port))
		}
		return strings.Contains(dump, fmt.Sprintf("%s . %s . %d", ip, proto, port))
	}
	chain, dst := "KUBE-SERVICES", ip+"/32"
	if ip == "" {
		chain, dst = "KUBE-NODEPORTS", ""
	}
	for _, line := range strings.Split(dump, "\n") {
		f, err := xtables.Fields(line)
		if err != nil || len(f) < 2 || f[0] != "-A" || f[1] != chain {
			continue
		}
		if opt(f, "-p") == proto && opt(f, "--dport") == strconv.Itoa(port) && opt(f, "-d") == dst {
			return true
		}
	}
	return false
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

// definedOnce checks that a restart reused the rules instead of adding a
// second copy: one kube-proxy table per family in nftables mode; in
// iptables mode one jump from each built-in chain to kube-proxy's chains
// per table and family (a restart that appended jump rules again would
// make every packet walk the service chains twice).
func (m proxyMode) definedOnce(dump string) error {
	if !m.iptables {
		for _, fam := range []string{"ip", "ip6"} {
			if n := strings.Count(dump, "table "+fam+" kube-proxy {"); n != 1 {
				return fmt.Errorf("%d %s kube-proxy tables, want 1", n, fam)
			}
		}
		return nil
	}
	// iptables-save prints IPv4 and then IPv6 tables; count per table
	// section (a "*nat" line starts one).
	counts := map[string]int{}
	section := 0
	table := ""
	for _, line := range strings.Split(dump, "\n") {
		if t, ok := strings.CutPrefix(line, "*"); ok {
			section++
			table = fmt.Sprintf("%s#%d", t, section)
			continue
		}
		f, err := xtables.Fields(line)
		if err != nil || len(f) < 2 || f[0] != "-A" || strings.HasPrefix(f[1], "KUBE-") {
			continue
		}
		if j := opt(f, "-j"); strings.HasPrefix(j, "KUBE-") {
			counts[table+" "+f[1]+" -> "+j]++
		}
	}
	if len(counts) == 0 {
		return fmt.Errorf("no jumps from built-in chains to KUBE- chains at all")
	}
	for k, n := range counts {
		if n != 1 {
			return fmt.Errorf("%s: %d jump rules, want 1", k, n)
		}
	}
	return nil
}
