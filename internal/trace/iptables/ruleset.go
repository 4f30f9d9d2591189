package iptables

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"

	"github.com/kproxy/kproxy/internal/trace"
)

// Ruleset is the state of the iptables tables of one family (what
// iptables-save or ip6tables-save prints) after a sequence of restores.
// Build one with Parse, change it with Apply, Remember or AddRecent, walk
// packets through it with Trace.
//
// Trace only reads the ruleset, so traces may run concurrently; the other
// methods and changes to the exported fields must not run concurrently
// with anything else.
type Ruleset struct {
	// RouteLocalnet is the sysctl net.ipv4.conf.all.route_localnet. When
	// false (the kernel default) the IPv4 routing code drops packets to or
	// from 127.0.0.0/8 that arrive on another interface than lo, before
	// the input hook. kube-proxy's iptables mode sets it to 1 when
	// localhost NodePorts are on (the default), which is why it also
	// installs the KUBE-FIREWALL rule dropping such "martian" packets
	// that were not DNATed (CVE-2020-8558).
	RouteLocalnet bool
	// Limits bound each Trace; zero fields take DefaultLimits' values.
	Limits Limits

	family int // 4 or 6 once an address said so, else 0
	tables []*table
	// recent holds the xt_recent lists (by --name) with their addresses,
	// already masked.
	recent map[string]map[netip.Addr]bool
	gen    int // counts Apply calls, to tell this input's lines from older ones
}

// Limits bound one trace. The kernel refuses rulesets whose chains loop, so
// a ruleset Parse accepted always ends; the limits guard against rulesets
// far larger than any kproxy writes.
type Limits struct {
	// MaxRuleEvaluations is the most rules one outcome's path may evaluate.
	MaxRuleEvaluations int
	// MaxJumpDepth is the deepest stack of jumps allowed.
	MaxJumpDepth int
	// MaxOutcomes is the most outcomes (statistic branches) one trace may
	// produce.
	MaxOutcomes int
}

// DefaultLimits are the limits used for zero fields of Ruleset.Limits.
// Rule evaluations are far more than nftables needs: iptables walks
// KUBE-SERVICES linearly, two rules or so per service port.
var DefaultLimits = Limits{MaxRuleEvaluations: 1_000_000, MaxJumpDepth: 64, MaxOutcomes: 10_000}

func (r *Ruleset) limits() Limits {
	l := r.Limits
	if l.MaxRuleEvaluations <= 0 {
		l.MaxRuleEvaluations = DefaultLimits.MaxRuleEvaluations
	}
	if l.MaxJumpDepth <= 0 {
		l.MaxJumpDepth = DefaultLimits.MaxJumpDepth
	}
	if l.MaxOutcomes <= 0 {
		l.MaxOutcomes = DefaultLimits.MaxOutcomes
	}
	return l
}

// Family is 4 or 6 once an address in the rules fixed it, 0 while no rule
// names an address (such a ruleset traces packets of either family).
func (r *Ruleset) Family() int { return r.family }

type table struct {
	name   string
	chains map[string]*chain
	order  []string // chain names in creation order
}

type chain struct {
	name    string
	builtin bool
	policy  string // built-in chains: ACCEPT or DROP
	rules   []*rule
}

// Built-in chains of each table, in hook order.
var builtinChains = map[string][]string{
	"raw":      {"PREROUTING", "OUTPUT"},
	"mangle":   {"PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"},
	"nat":      {"PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"},
	"filter":   {"INPUT", "FORWARD", "OUTPUT"},
	"security": {"INPUT", "FORWARD", "OUTPUT"},
}

func newTable(name string) *table {
	t := &table{name: name, chains: map[string]*chain{}}
	for _, c := range builtinChains[name] {
		t.chains[c] = &chain{name: c, builtin: true, policy: tAccept}
		t.order = append(t.order, c)
	}
	return t
}

// clone copies a table deeply enough that a restore can work on the copy
// and drop it on error; rules are never changed in place, so they are
// shared.
func (t *table) clone() *table {
	n := &table{name: t.name, chains: make(map[string]*chain, len(t.chains)), order: slices.Clone(t.order)}
	for k, c := range t.chains {
		nc := *c
		nc.rules = slices.Clone(c.rules)
		n.chains[k] = &nc
	}
	return n
}

func (r *Ruleset) table(name string) *table {
	for _, t := range r.tables {
		if t.name == name {
			return t
		}
	}
	return nil
}

func (r *Ruleset) install(t *table) {
	for i, old := range r.tables {
		if old.name == t.name {
			r.tables[i] = t
			return
		}
	}
	r.tables = append(r.tables, t)
}

// userChains lists the user-defined chains sorted by name, the order
// iptables-legacy-save prints them in.
func (t *table) userChains() []string {
	var names []string
	for _, n := range t.order {
		if !t.chains[n].builtin {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	return names
}

// references reports the first rule (other than in chain except) whose
// target is the chain name.
func (t *table) references(name, except string) (string, bool) {
	for _, cn := range t.order {
		if cn == except {
			continue
		}
		for _, ru := range t.chains[cn].rules {
			if (ru.target.kind == tJump || ru.target.kind == tGoto) && ru.target.chain == name {
				return cn, true
			}
		}
	}
	return "", false
}

// String dumps the ruleset in iptables-save format: per table the chain
// lines (built-in chains first, user chains sorted), the rules, COMMIT.
// Parse of the dump gives the same ruleset.
func (r *Ruleset) String() string {
	var b strings.Builder
	for _, t := range r.tables {
		fmt.Fprintf(&b, "*%s\n", t.name)
		chains := append(slices.Clone(builtinChains[t.name]), t.userChains()...)
		for _, cn := range chains {
			c := t.chains[cn]
			p := "-"
			if c.builtin {
				p = c.policy
			}
			fmt.Fprintf(&b, ":%s %s [0:0]\n", cn, p)
		}
		for _, cn := range chains {
			for _, ru := range t.chains[cn].rules {
				fmt.Fprintf(&b, "-A %s %s\n", cn, ru)
			}
		}
		b.WriteString("COMMIT\n")
	}
	return b.String()
}

// recentUpdate is how an outcome reports that a "-m recent --set" added an
// address: the command that adds it by hand.
func recentUpdate(list string, a netip.Addr) string {
	return "echo +" + a.String() + " > /proc/net/xt_recent/" + list
}

// AddRecent puts an address into an xt_recent list, as the kernel does for
// "-m recent --name list --set" (or `echo +addr > /proc/net/xt_recent/list`):
// a later "--rcheck" of that list matches it. Entries never expire: the
// tracer has no clock.
func (r *Ruleset) AddRecent(list string, a netip.Addr) {
	if r.recent == nil {
		r.recent = map[string]map[netip.Addr]bool{}
	}
	if r.recent[list] == nil {
		r.recent[list] = map[netip.Addr]bool{}
	}
	r.recent[list][a.Unmap()] = true
}

// Remember applies an outcome's affinity updates (its "-m recent --set"
// operations) to the ruleset, so that a following trace from the same
// source sticks to the same endpoint, as the kernel's recent lists make it
// (until --seconds pass, which the tracer does not model).
func (r *Ruleset) Remember(o trace.Outcome) error {
	for _, u := range o.AffinityUpdates {
		rest, ok := strings.CutPrefix(u, "echo +")
		addr, list, ok2 := strings.Cut(rest, " > /proc/net/xt_recent/")
		a, err := netip.ParseAddr(addr)
		if !ok || !ok2 || err != nil || list == "" {
			return fmt.Errorf("not an iptables affinity update: %q", u)
		}
		r.AddRecent(list, a)
	}
	return nil
}

func (r *Ruleset) inRecent(list string, a netip.Addr) bool {
	return r.recent[list][a]
}
