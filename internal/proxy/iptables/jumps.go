package iptables

import (
	"slices"

	"github.com/kproxy/kproxy/internal/kernel/xtables"
)

// jumpRule hooks a kproxy chain into a built-in chain. line is written
// exactly as iptables-save prints the rule, so that the rules already in
// the kernel are recognised by text.
type jumpRule struct {
	table, chain, line string
}

// jumpRules are upstream's iptablesJumpChains, in its order: each missing
// one is inserted at the head of its built-in chain, so a fresh node ends
// up with upstream's order.
var jumpRules = []jumpRule{
	{tableFilter, "INPUT", `-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES`},
	{tableFilter, "FORWARD", `-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES`},
	{tableFilter, "INPUT", `-A INPUT -m comment --comment "kubernetes health check service ports" -j KUBE-NODEPORTS`},
	{tableFilter, "FORWARD", `-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`},
	{tableFilter, "OUTPUT", `-A OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`},
	{tableFilter, "FORWARD", `-A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD`},
	{tableFilter, "INPUT", `-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL`},
	{tableFilter, "OUTPUT", `-A OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL`},
	{tableFilter, "FORWARD", `-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL`},
	{tableNAT, "OUTPUT", `-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`},
	{tableNAT, "PREROUTING", `-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`},
	{tableNAT, "POSTROUTING", `-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING`},
}

// kubeletJumpRules hook the kubelet's KUBE-FIREWALL (the anti-martian
// chain), as upstream's iptablesKubeletJumpChains: ensured in both
// families, with or without localhost node ports, after jumpRules (so
// they end up first in INPUT and OUTPUT), and never removed.
var kubeletJumpRules = []jumpRule{
	{tableFilter, "INPUT", `-A INPUT -j KUBE-FIREWALL`},
	{tableFilter, "OUTPUT", `-A OUTPUT -j KUBE-FIREWALL`},
}

// allJumpRules are the jump rules a full sync ensures, in upstream's order.
var allJumpRules = slices.Concat(jumpRules, kubeletJumpRules)

// JumpRuleLines lists the jump rules a full sync ensures in the built-in
// chains, by table, as iptables-save prints them (for tests and the
// kernel test).
func JumpRuleLines() map[string][]string { return jumpLines(allJumpRules) }

// jumpLines groups the lines of rules by table.
func jumpLines(rules []jumpRule) map[string][]string {
	out := map[string][]string{}
	for _, j := range rules {
		out[j.table] = append(out[j.table], j.line)
	}
	return out
}

// kubeletFirewallExists reports whether the filter table has KUBE-FIREWALL
// (the kubelet's, or one a sync made), read before a full sync or trusted
// from the last one.
func (r *renderer) kubeletFirewallExists() bool {
	if r.in.Existing == nil {
		return r.last.synced
	}
	return slices.Contains(r.in.Existing.FilterChains, chainKubeletFirewall)
}

// jumpExists reports whether a jump rule is in its built-in chain. A rule
// of that chain with the same target and comment counts, whatever else it
// matches: iptables versions print rules a little differently, and an old
// kube-proxy's variant (without the conntrack match) does the same job.
// Adding ours beside it on every full sync would pile up copies.
func (r *renderer) jumpExists(j jumpRule) bool {
	if r.in.Existing == nil {
		// Trust the last sync: it added every missing jump rule.
		return r.last.synced
	}
	rules := r.in.Existing.Rules[j.table]
	if rules.Has(j.line) {
		return true
	}
	want := jumpKeyOf(j.line)
	for l := range rules {
		if jumpKeyOf(l) == want {
			return true
		}
	}
	return false
}

type jumpKey struct{ chain, target, comment string }

// jumpKeyOf reads chain, jump target and comment of a rule line as
// iptables-save prints it ("-A CHAIN ... --comment "text" ... -j TARGET"),
// with iptables' own quoting (xtables.Fields): a comment may hold
// escaped quotes and words such as "-j". A line that does not tokenize
// (an unterminated quote) matches nothing: its key has no chain.
func jumpKeyOf(line string) jumpKey {
	var k jumpKey
	f, err := xtables.Fields(line)
	if err != nil || len(f) < 2 {
		return k
	}
	k.chain = f[1]
	for i := 2; i+1 < len(f); i++ {
		switch f[i] {
		case "-j", "--jump":
			k.target = f[i+1]
			i++
		case "--comment":
			k.comment = f[i+1]
			i++
		}
	}
	return k
}

// nodePortsJump writes the last rule of nat KUBE-SERVICES: what is left,
// addressed to a node port address, goes to KUBE-NODEPORTS.
func (r *renderer) nodePortsJump(b []byte) []byte {
	const comment = `-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain"`
	cfg := r.cfg
	if cfg.NodePortAllLocal {
		b = append(b, comment+" -m addrtype --dst-type LOCAL"...)
		switch {
		case cfg.ipv6():
			// Localhost node ports never work on IPv6.
			b = append(b, " ! -d ::1/128"...)
		case !cfg.LocalhostNodePorts:
			b = append(b, " ! -d 127.0.0.0/8"...)
		}
		return append(b, " -j KUBE-NODEPORTS\n"...)
	}
	for _, ip := range cfg.NodePortIPs {
		b = append(b, comment+" -d "...)
		b = ip.AppendTo(b)
		b = append(b, " -j KUBE-NODEPORTS\n"...)
	}
	return b
}
