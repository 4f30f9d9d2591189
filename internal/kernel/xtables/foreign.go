package xtables

import (
	"context"
	"fmt"
	"slices"
	"strings"
)

// commentedChains are kube-proxy's chains whose every rule carries a
// comment (upstream's layout and kproxy's both): a rule there without one
// was written by something else. KUBE-POSTROUTING, KUBE-MARK-MASQ,
// KUBE-FORWARD and the per-service chains have uncommented rules of their
// own and are judged by their targets only.
var commentedChains = map[string][]string{
	"nat":    {"KUBE-SERVICES", "KUBE-NODEPORTS"},
	"filter": {"KUBE-SERVICES", "KUBE-EXTERNAL-SERVICES", "KUBE-NODEPORTS", "KUBE-PROXY-FIREWALL"},
}

// dispatchChains are where kube-proxy only jumps on to per-service chains
// (or drops, rejects, accepts); it never rewrites an address there, so a
// DNAT or SNAT in them redirects service traffic behind its back.
var dispatchChains = []string{"KUBE-SERVICES", "KUBE-NODEPORTS", "KUBE-EXTERNAL-SERVICES", "KUBE-PROXY-FIREWALL"}

// ForeignRule is a rule in one of kube-proxy's chains that kube-proxy
// (and kproxy) would not have written.
type ForeignRule struct {
	Table string
	Rule  string // as iptables-save prints it
	Why   string
}

func (r ForeignRule) String() string { return r.Table + ": " + r.Rule + " (" + r.Why + ")" }

// foreignRules finds them in iptables-save output.
func foreignRules(saveOutput string) ([]ForeignRule, error) {
	tables, err := parseSave(saveOutput)
	if err != nil {
		return nil, err
	}
	var out []ForeignRule
	for _, t := range tables {
		for _, r := range t.rules {
			if t.builtin[r.chain] || !isKubeProxyChain(t.name, r.chain) {
				continue
			}
			switch {
			case slices.Contains(dispatchChains, r.chain) && (r.target == "DNAT" || r.target == "SNAT" || r.target == "REDIRECT"):
				out = append(out, ForeignRule{t.name, r.text, "rewrites addresses in a dispatch chain"})
			case slices.Contains(commentedChains[t.name], r.chain) && !strings.Contains(r.text, " -m comment --comment "):
				out = append(out, ForeignRule{t.name, r.text, "no kube-proxy comment"})
			case r.target == "ACCEPT" && t.name == "nat":
				out = append(out, ForeignRule{t.name, r.text, "ACCEPT in a nat chain of kube-proxy's"})
			}
		}
	}
	return out, nil
}

// FindForeignRules lists rules in kube-proxy's chains of this backend and
// family that kube-proxy would not have written (another tool's, an
// operator's, or injected): `kproxy doctor` reports them. A missing binary
// is an error matching ErrNotInstalled.
func FindForeignRules(ctx context.Context, b Backend, f Family, opts ...Option) ([]ForeignRule, error) {
	out, t, err := saved(ctx, b, f, opts)
	if err != nil {
		return nil, err
	}
	rules, err := foreignRules(out)
	if err != nil {
		return nil, fmt.Errorf("xtables: parsing %s output: %w", t.save, err)
	}
	return rules, nil
}

// saved returns what the backend's save binary prints for the family.
func saved(ctx context.Context, b Backend, f Family, opts []Option) (string, *tool, error) {
	t, err := newTool(b, f, newOptions(opts), false)
	if err != nil {
		return "", nil, err
	}
	out, err := t.dump(ctx)
	return out, t, err
}
