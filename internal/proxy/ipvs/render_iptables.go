package ipvs

import (
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/kproxy/kproxy/internal/proxy/masquerade"
)

// setRule is upstream's ipsetWithIptablesChain: a rule in chain from
// that sends what the set matches to target, written when the set has
// members. Node port local sets come before their plain ones.
var setRules = []struct {
	set, table, from, target, match, proto string
}{
	{SetLoopBack, TableNAT, ChainPostrouting, "MASQUERADE", "dst,dst,src", ""},
	{SetLoadBalancer, TableNAT, ChainServices, ChainLoadBalancer, "dst,dst", ""},
	{SetLoadBalancerLocal, TableNAT, ChainLoadBalancer, "RETURN", "dst,dst", ""},
	{SetNodePortLocalTCP, TableNAT, ChainNodePort, "RETURN", "dst", "tcp"},
	{SetNodePortTCP, TableNAT, ChainNodePort, ChainMarkMasq, "dst", "tcp"},
	{SetNodePortLocalUDP, TableNAT, ChainNodePort, "RETURN", "dst", "udp"},
	{SetNodePortUDP, TableNAT, ChainNodePort, ChainMarkMasq, "dst", "udp"},
	{SetNodePortLocalSCTP, TableNAT, ChainNodePort, "RETURN", "dst,dst", "sctp"},
	{SetNodePortSCTP, TableNAT, ChainNodePort, ChainMarkMasq, "dst,dst", "sctp"},

	{SetLoadBalancerFW, TableFilter, ChainProxyFirewall, ChainSourceRangesFirewall, "dst,dst", ""},
	{SetLoadBalancerSourceCIDR, TableFilter, ChainSourceRangesFirewall, "RETURN", "dst,dst,src", ""},
	{SetLoadBalancerSourceIP, TableFilter, ChainSourceRangesFirewall, "RETURN", "dst,dst,src", ""},
}

// rules collects one table's rule lines.
type rules struct{ b strings.Builder }

func (w *rules) add(args ...string) {
	w.b.WriteString(strings.Join(args, " "))
	w.b.WriteByte('\n')
}

// comment is a set's comment as upstream quotes it in rules.
func comment(set string) string {
	for _, s := range setInfo {
		if s.name == set {
			return `"` + s.comment + `"`
		}
	}
	return `""`
}

// iptables writes upstream's writeIptablesRules: the input of
// iptables-restore --noflush for the nat and filter tables. It depends
// on the services only through which sets are empty (by upstream's IPv4
// name) and the LB addresses the node may not reach (noNodeAccess, in
// any order). present are the built-in chains' rules (nil: a fresh node).
func (r *renderer) iptables(empty func(set string) bool, noNodeAccess []lbEntry, present map[string]sets.Set[string]) []byte {
	cfg := r.cfg
	mark := masquerade.Mark(cfg.MasqueradeBit)
	var nat, filter rules

	lo := "127.0.0.0/8"
	if r.ipv6 {
		lo = "::1/128"
	}
	// Connections from the node to itself leave the services alone.
	nat.add("-A", ChainServices, "-s", lo, "-j", "RETURN")

	for _, s := range setRules {
		if empty(s.set) {
			continue
		}
		args := []string{"-A", s.from}
		if s.proto != "" {
			args = append(args, "-p", s.proto)
		}
		args = append(args, "-m", "comment", "--comment", comment(s.set), "-m", "set", "--match-set", r.setName(s.set), s.match, "-j", s.target)
		if s.table == TableFilter {
			filter.add(args...)
		} else {
			nat.add(args...)
		}
	}

	if !empty(SetClusterIP) {
		args := []string{"-A", ChainServices, "-m", "comment", "--comment", comment(SetClusterIP), "-m", "set", "--match-set", r.setName(SetClusterIP)}
		switch {
		case cfg.MasqueradeAll:
			nat.add(append(args, "dst,dst", "-j", ChainMarkMasq)...)
		case r.detector.Implemented():
			// Off-cluster traffic to a cluster IP (a static route to the
			// service range via some node) may leave the node again.
			args = append(append(args, "dst,dst"), r.detector.IfNotLocal...)
			nat.add(append(args, "-j", ChainMarkMasq)...)
		default:
			// kube-ipvs0 holds every service address, so the node picks
			// one as the source of its own connections to a service:
			// masquerade what comes from a service address and port.
			nat.add(append(args, "src,dst", "-j", ChainMarkMasq)...)
		}
	}

	externalIPRules := func(args []string) {
		// From off the machine: not from a bridge (a container), not
		// from a local process.
		nat.add(append(append([]string(nil), args...), "-m", "physdev", "!", "--physdev-is-in", "-m", "addrtype", "!", "--src-type", "LOCAL", "-j", "ACCEPT")...)
		// To an external IP that is a local address (GCE's load
		// balancers put theirs in the local routing table).
		nat.add(append(append([]string(nil), args...), "-m", "addrtype", "--dst-type", "LOCAL", "-j", "ACCEPT")...)
	}
	if !empty(SetExternalIP) {
		args := []string{"-A", ChainServices, "-m", "comment", "--comment", comment(SetExternalIP), "-m", "set", "--match-set", r.setName(SetExternalIP), "dst,dst"}
		nat.add(append(append([]string(nil), args...), "-j", ChainMarkMasq)...)
		externalIPRules(args)
	}
	if !empty(SetExternalIPLocal) {
		externalIPRules([]string{"-A", ChainServices, "-m", "comment", "--comment", comment(SetExternalIPLocal), "-m", "set", "--match-set", r.setName(SetExternalIPLocal), "dst,dst"})
	}

	nat.add("-A", ChainServices, "-m", "addrtype", "--dst-type", "LOCAL", "-j", ChainNodePort)
	nat.add("-A", ChainLoadBalancer, "-j", ChainMarkMasq)
	filter.add("-A", ChainSourceRangesFirewall, "-j", "DROP")

	// The node may not reach an LB IP whose source ranges leave it out:
	// IPVS sees the LB IP as both source and destination.
	noNodeAccess = slices.Clone(noNodeAccess)
	slices.SortFunc(noNodeAccess, compareLB)
	for _, e := range noNodeAccess {
		ip := e.ip.String()
		filter.add("-A", ChainIPVSOutFilter, "-s", ip, "-m", "ipvs", "--vaddr", ip, "--vproto", e.proto, "--vport", strconv.Itoa(int(e.port)), "-j", "DROP")
	}

	// Accept what goes to a virtual server, whatever other rules say;
	// last in KUBE-SERVICES.
	for _, set := range []string{SetClusterIP, SetLoadBalancer} {
		if !empty(set) {
			nat.add("-A", ChainServices, "-m", "set", "--match-set", r.setName(set), "dst,dst", "-j", "ACCEPT")
		}
	}

	// Forward what was marked for masquerade, whatever FORWARD's policy,
	// and the rest of its connections.
	filter.add("-A", ChainForward, "-m", "comment", "--comment", `"kubernetes forwarding rules"`, "-m", "mark", "--mark", mark+"/"+mark, "-j", "ACCEPT")
	filter.add("-A", ChainForward, "-m", "comment", "--comment", `"kubernetes forwarding conntrack rule"`, "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "ACCEPT")
	filter.add("-A", ChainNodePort, "-m", "comment", "--comment", comment(SetHealthCheckNodePort), "-m", "set", "--match-set", r.setName(SetHealthCheckNodePort), "dst", "-j", "ACCEPT")

	// A service address on kube-ipvs0 answers only on its service ports
	// (kubernetes#72236): new connections to other ports are refused.
	for _, s := range []struct{ set, match string }{
		{SetLoadBalancer, "dst,dst"}, {SetClusterIP, "dst,dst"}, {SetExternalIP, "dst,dst"},
		{SetExternalIPLocal, "dst,dst"}, {SetHealthCheckNodePort, "dst"},
	} {
		filter.add("-A", ChainIPVSFilter, "-m", "set", "--match-set", r.setName(s.set), s.match, "-j", "RETURN")
	}
	filter.add("-A", ChainIPVSFilter, "-m", "conntrack", "--ctstate", "NEW", "-m", "set", "--match-set", r.setName(SetIPVSIPs), "dst", "-j", "REJECT")

	masq := masquerade.NewRules(mark, true)
	for _, rule := range masq.Postrouting {
		nat.add(rule)
	}
	nat.add(masq.MarkMasq)

	var b strings.Builder
	for _, table := range []struct {
		name  string
		rules *rules
	}{{TableNAT, &nat}, {TableFilter, &filter}} {
		b.WriteString("*" + table.name + "\n")
		for _, c := range Chains {
			if c.Table == table.name {
				b.WriteString(":" + c.Name + " - [0:0]\n")
			}
		}
		for _, j := range JumpRules {
			if j.Table != table.name || present[j.Table].Has(j.Line) {
				continue
			}
			b.WriteString("-I " + j.Chain + " 1" + strings.TrimPrefix(j.Line, "-A "+j.Chain) + "\n")
		}
		b.WriteString(table.rules.b.String())
		b.WriteString("COMMIT\n")
	}
	return []byte(b.String())
}
