package xtables

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"k8s.io/klog/v2"
)

// Chain is one chain of one xtables table.
type Chain struct {
	Table string
	Name  string
}

func (c Chain) String() string { return c.Table + "/" + c.Name }

// kubeProxyChains are the fixed-name chains that kube-proxy's iptables and
// IPVS modes create, by table, across the versions a node may still carry
// (checked against upstream pkg/proxy/iptables and pkg/proxy/ipvs:
// iptablesJumpChains, iptablesCleanupChains, the cleanup functions).
//
// KUBE-MARK-MASQ and KUBE-POSTROUTING were created by the kubelet too until
// the iptables ownership cleanup (KEP-3178, GA in 1.28); since then they are
// kube-proxy's alone and upstream's CleanupLeftovers removes them. Every
// kubelet that may run beside a 1.37 proxy is newer than that.
var kubeProxyChains = map[string][]string{
	"nat": {
		"KUBE-SERVICES",      // both modes: entry from PREROUTING and OUTPUT
		"KUBE-NODEPORTS",     // iptables mode
		"KUBE-POSTROUTING",   // both modes: masquerade marked packets
		"KUBE-MARK-MASQ",     // both modes
		"KUBE-NODE-PORT",     // IPVS mode
		"KUBE-LOAD-BALANCER", // IPVS mode
		"KUBE-FIREWALL",      // old IPVS mode (source ranges); the kubelet's KUBE-FIREWALL is in filter
		"KUBE-PROXY-CANARY",  // iptables mode: monitor canary in mangle, nat and filter
	},
	"filter": {
		"KUBE-SERVICES",               // iptables mode: REJECT services without endpoints
		"KUBE-EXTERNAL-SERVICES",      // iptables mode
		"KUBE-NODEPORTS",              // iptables mode: health check node ports
		"KUBE-FORWARD",                // both modes
		"KUBE-PROXY-FIREWALL",         // both modes: loadBalancerSourceRanges
		"KUBE-PROXY-CANARY",           // iptables mode
		"KUBE-NODE-PORT",              // IPVS mode: health check node ports
		"KUBE-SOURCE-RANGES-FIREWALL", // IPVS mode
		"KUBE-IPVS-FILTER",            // IPVS mode
		"KUBE-IPVS-OUT-FILTER",        // IPVS mode
	},
	"mangle": {
		"KUBE-PROXY-CANARY",
	},
}

// kubeletChains belong to the kubelet and survive whatever the lists above
// say: KUBE-KUBELET-CANARY (its monitor canary in mangle, nat and filter),
// KUBE-IPTABLES-HINT (mangle; tells tools which backend the node uses),
// KUBE-FIREWALL in filter (the anti-martian rule for 127.0.0.0/8; kube-proxy
// writes an identical copy but never removes it) and KUBE-MARK-DROP in nat
// (kubelet's up to 1.27; kube-proxy only used it).
var kubeletChains = map[string][]string{
	"nat":    {"KUBE-KUBELET-CANARY", "KUBE-MARK-DROP"},
	"filter": {"KUBE-KUBELET-CANARY", "KUBE-FIREWALL"},
	"mangle": {"KUBE-KUBELET-CANARY", "KUBE-IPTABLES-HINT"},
}

// hashedChain matches kube-proxy's per-service and per-endpoint chains in
// nat: a prefix and 16 characters of base32 (of a SHA-256). KUBE-XLB- is
// the pre-1.24 name of KUBE-SVL-. Other tools' chains with similar
// prefixes (kube-router's KUBE-POD-FW-, KUBE-NWPLCY-...) do not match.
var hashedChain = regexp.MustCompile(`^KUBE-(SVC|SVL|EXT|FW|SEP|XLB)-[A-Z2-7]{16}$`)

// isKubeProxyChain says whether a chain of a table is kube-proxy's.
func isKubeProxyChain(table, name string) bool {
	if slices.Contains(kubeletChains[table], name) {
		return false
	}
	if slices.Contains(kubeProxyChains[table], name) {
		return true
	}
	return table == "nat" && hashedChain.MatchString(name)
}

// ipvsModeChains are the fixed-name chains ipvs mode writes (upstream's
// names); the rest of kubeProxyChains, and the hashed chains, are iptables
// mode's alone.
var ipvsModeChains = map[string][]string{
	"nat":    {"KUBE-SERVICES", "KUBE-POSTROUTING", "KUBE-NODE-PORT", "KUBE-LOAD-BALANCER", "KUBE-MARK-MASQ"},
	"filter": {"KUBE-FORWARD", "KUBE-NODE-PORT", "KUBE-PROXY-FIREWALL", "KUBE-SOURCE-RANGES-FIREWALL", "KUBE-IPVS-FILTER", "KUBE-IPVS-OUT-FILTER"},
}

// isIPTablesModeChain says whether a chain is one of kube-proxy's that
// only its iptables mode makes (ipvs mode never uses the name).
func isIPTablesModeChain(table, name string) bool {
	return isKubeProxyChain(table, name) && !slices.Contains(ipvsModeChains[table], name) &&
		// Old ipvs mode's nat KUBE-FIREWALL is not iptables mode's either.
		(table != "nat" || name != "KUBE-FIREWALL")
}

// saveTable is one table of iptables-save output.
type saveTable struct {
	name    string
	chains  []string        // in the order listed
	builtin map[string]bool // chains listed with a policy
	rules   []saveRule
}

type saveRule struct {
	chain  string
	text   string // the line as printed, starting with "-A "
	target string // the -j/-g target, "" if none
}

// parseSave reads iptables-save output (without counters).
func parseSave(out string) ([]*saveTable, error) {
	var tables []*saveTable
	var cur *saveTable
	for n, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "*"):
			cur = &saveTable{name: line[1:], builtin: map[string]bool{}}
			tables = append(tables, cur)
		case line == "COMMIT":
			cur = nil
		case cur == nil:
			return nil, fmt.Errorf("line %d: %q outside a table", n+1, line)
		case strings.HasPrefix(line, ":"):
			f := strings.Fields(line[1:])
			if len(f) < 2 {
				return nil, fmt.Errorf("line %d: malformed chain line %q", n+1, line)
			}
			cur.chains = append(cur.chains, f[0])
			// Built-in chains have a policy; user chains print "-".
			if f[1] != "-" {
				cur.builtin[f[0]] = true
			}
		case strings.HasPrefix(line, "-A "):
			tok, err := Fields(line)
			if err != nil {
				return nil, fmt.Errorf("line %d: %w", n+1, err)
			}
			if len(tok) < 2 {
				return nil, fmt.Errorf("line %d: malformed rule %q", n+1, line)
			}
			cur.rules = append(cur.rules, saveRule{chain: tok[1], text: line, target: target(tok)})
		default:
			return nil, fmt.Errorf("line %d: unexpected %q", n+1, line)
		}
	}
	return tables, nil
}

// target returns a rule's jump or goto target. iptables-save prints the
// target after all matches, so the last -j/-g is it even if a comment
// happens to read "-j".
func target(tok []string) string {
	for i := len(tok) - 2; i >= 2; i-- {
		switch tok[i] {
		case "-j", "--jump", "-g", "--goto":
			return tok[i+1]
		}
	}
	return ""
}

// tablePlan is what to do in one table.
type tablePlan struct {
	table string
	// deletes are the jumps from built-in chains to kube-proxy's chains,
	// as "-D ..." lines.
	deletes []string
	// remove are kube-proxy's chains to flush and delete.
	remove []string
	// kept are kube-proxy's chains left in place because a chain that is
	// not kube-proxy's (another tool's) jumps to them, directly or
	// through other kept chains: deleting them would make the whole
	// table's restore fail, and flushing them would break that tool.
	kept []string
	// unhooked are the kept chains that built-in chains jump to: those
	// jumps go all the same.
	unhooked []string
}

// makePlan decides, per table, which rules and chains go: the chains
// ours says are kube-proxy's.
func makePlan(tables []*saveTable, ours func(table, name string) bool) []tablePlan {
	var plans []tablePlan
	for _, t := range tables {
		mine := map[string]bool{}
		for _, c := range t.chains {
			if !t.builtin[c] && ours(t.name, c) {
				mine[c] = true
			}
		}
		if len(mine) == 0 {
			continue
		}
		// Chains another tool's chain jumps to stay, and so does
		// everything they jump to (fixpoint over the rules).
		kept := map[string]bool{}
		for changed := true; changed; {
			changed = false
			for _, r := range t.rules {
				from := !t.builtin[r.chain] && (!mine[r.chain] || kept[r.chain])
				if from && mine[r.target] && !kept[r.target] {
					kept[r.target] = true
					changed = true
				}
			}
		}
		p := tablePlan{table: t.name}
		for _, r := range t.rules {
			// kube-proxy's jumps from built-in chains go even to chains
			// that are kept: the node must stop using kube-proxy's rules.
			if t.builtin[r.chain] && mine[r.target] {
				p.deletes = append(p.deletes, "-D"+strings.TrimPrefix(r.text, "-A"))
				if kept[r.target] && !slices.Contains(p.unhooked, r.target) {
					p.unhooked = append(p.unhooked, r.target)
				}
			}
		}
		for _, c := range t.chains {
			switch {
			case kept[c]:
				p.kept = append(p.kept, c)
			case mine[c]:
				p.remove = append(p.remove, c)
			}
		}
		plans = append(plans, p)
	}
	return plans
}

// render writes one iptables-restore --noflush input for all tables: per
// table, first the jumps from built-in chains go, then every chain is
// flushed, and only then deleted: a chain can only be deleted once no rule
// jumps to it, and kube-proxy's chains jump to each other.
func render(plans []tablePlan) string {
	var b strings.Builder
	for _, p := range plans {
		if len(p.deletes) == 0 && len(p.remove) == 0 {
			continue
		}
		fmt.Fprintf(&b, "*%s\n", p.table)
		for _, d := range p.deletes {
			b.WriteString(d + "\n")
		}
		for _, c := range p.remove {
			fmt.Fprintf(&b, "-F %s\n", c)
		}
		for _, c := range p.remove {
			fmt.Fprintf(&b, "-X %s\n", c)
		}
		b.WriteString("COMMIT\n")
	}
	return b.String()
}

func chainsOf(plans []tablePlan, kept bool) []Chain {
	var out []Chain
	for _, p := range plans {
		list := p.remove
		if kept {
			list = p.kept
		}
		for _, c := range list {
			out = append(out, Chain{Table: p.table, Name: c})
		}
	}
	return out
}

// leftovers lists what FindLeftovers reports: the chains to delete, then
// the kept chains that lose their jumps from built-in chains.
func leftovers(plans []tablePlan) []Chain {
	out := chainsOf(plans, false)
	for _, p := range plans {
		for _, c := range p.unhooked {
			out = append(out, Chain{Table: p.table, Name: c})
		}
	}
	return out
}

// cleanupScript turns iptables-save output into the iptables-restore
// --noflush input that removes kube-proxy's rules, and lists the chains it
// deletes. An empty script means there is nothing to do.
func cleanupScript(saveOutput string) (script string, chains []Chain, err error) {
	tables, err := parseSave(saveOutput)
	if err != nil {
		return "", nil, err
	}
	plans := makePlan(tables, isKubeProxyChain)
	return render(plans), chainsOf(plans, false), nil
}

// FindLeftovers lists the chains of kube-proxy's iptables and IPVS modes
// that CleanupLeftovers would delete for this backend and family, and
// those it keeps (another tool's chain jumps to them) but unhooks from the
// built-in chains. Empty means CleanupLeftovers has nothing to do. A
// missing binary is an error matching ErrNotInstalled.
func FindLeftovers(ctx context.Context, b Backend, f Family, opts ...Option) ([]Chain, error) {
	out, t, err := saved(ctx, b, f, opts)
	if err != nil {
		return nil, err
	}
	tables, err := parseSave(out)
	if err != nil {
		return nil, fmt.Errorf("xtables: parsing %s output: %w", t.save, err)
	}
	return leftovers(makePlan(tables, isKubeProxyChain)), nil
}

// CleanupLeftovers removes kube-proxy's jumps from built-in chains and its
// chains, in one iptables-restore run for this backend and family, and
// returns how many chains it deleted. Other chains (the kubelet's, the
// user's, a CNI's) and their rules are left alone.
func CleanupLeftovers(ctx context.Context, b Backend, f Family, opts ...Option) (removed int, err error) {
	return cleanup(ctx, b, f, isKubeProxyChain, opts)
}

// CleanupIPTablesModeLeftovers removes, like CleanupLeftovers, only the
// chains that kube-proxy's iptables mode makes and its ipvs mode does not
// (filter KUBE-SERVICES and KUBE-EXTERNAL-SERVICES with their REJECT rules
// for services without endpoints, KUBE-NODEPORTS, the canaries, the
// per-service chains), with their jumps from built-in chains: what ipvs
// mode removes after its first sync on a node that ran iptables mode.
// Chains that a remaining chain (ipvs mode's own) still jumps to stay.
func CleanupIPTablesModeLeftovers(ctx context.Context, b Backend, f Family, opts ...Option) (removed int, err error) {
	return cleanup(ctx, b, f, isIPTablesModeChain, opts)
}

func cleanup(ctx context.Context, b Backend, f Family, ours func(table, name string) bool, opts []Option) (removed int, err error) {
	t, err := newTool(b, f, newOptions(opts), false)
	if err != nil {
		return 0, err
	}
	// The rules are read and then removed in two steps; if something
	// changed them in between (the kubelet, a CNI), the rule or chain the
	// script names may be gone and the restore fails as a whole. Read
	// again and retry once.
	for attempt := 1; ; attempt++ {
		out, err := t.dump(ctx)
		if err != nil {
			return 0, err
		}
		tables, err := parseSave(out)
		if err != nil {
			return 0, fmt.Errorf("xtables: parsing %s output: %w", t.save, err)
		}
		plans := makePlan(tables, ours)
		for _, c := range chainsOf(plans, true) {
			klog.InfoS("Keeping a kube-proxy chain that another chain still jumps to", "backend", b, "family", f, "table", c.Table, "chain", c.Name)
		}
		script := render(plans)
		if script == "" {
			return 0, nil
		}
		err = t.apply(ctx, script)
		if err == nil {
			return len(chainsOf(plans, false)), nil
		}
		if attempt == 2 || ctx.Err() != nil {
			return 0, err
		}
		klog.V(2).InfoS("Removing kube-proxy's iptables rules failed; reading them again", "backend", b, "family", f, "err", err)
	}
}
