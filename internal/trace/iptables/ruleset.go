package iptables

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/kproxy/kproxy/internal/kernel/xtables/restore"
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
	tables restore.Tables[*rule]
	// recent holds the xt_recent lists (by --name) with their addresses,
	// already masked.
	recent map[string]map[netip.Addr]bool
	// persist holds the IPVS persistence templates Remember recorded
	// (ipvs.go): a client's real server per persistent virtual server.
	persist map[persistKey]netip.AddrPort
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

// The tables, chains and rules of a ruleset are those of the restore
// core; a rule's Spec is the rule parsed for evaluation.
type (
	table = restore.Table[*rule]
	chain = restore.Chain[*rule]
)

func (r *Ruleset) table(name string) *table { return r.tables.Table(name) }

// String dumps the ruleset in iptables-save format: per table (in the
// order they were created) the chain lines (built-in chains first, user
// chains sorted), the rules, COMMIT. Parse of the dump gives the same
// ruleset.
func (r *Ruleset) String() string {
	var b strings.Builder
	for _, n := range r.tables.Names() {
		b.WriteString(r.tables.Table(n).Save(&dialect{r: r}))
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
// operations, and the IPVS persistence templates of ipvs mode) to the
// ruleset, so that a following trace from the same
// source sticks to the same endpoint, as the kernel's recent lists make it
// (until --seconds pass, which the tracer does not model).
func (r *Ruleset) Remember(o trace.Outcome) error {
	for _, u := range o.AffinityUpdates {
		if strings.HasPrefix(u, persistPrefix) {
			k, to, err := parsePersistUpdate(u)
			if err != nil {
				return err
			}
			if r.persist == nil {
				r.persist = map[persistKey]netip.AddrPort{}
			}
			r.persist[k] = to
			continue
		}
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
