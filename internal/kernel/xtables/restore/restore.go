// Package restore simulates iptables-restore and the tables it leaves in
// the kernel, for the xtables fake (xtablestest.Fake) and the iptables
// tracer (internal/trace/iptables): both restore through Tables.Restore
// and print iptables-save text with Table.Save, so the two agree on what
// a restore does and refuses.
//
// Tables is generic over S, what a simulator keeps of each rule (its
// Spec): the fake keeps the words after "-A CHAIN", the tracer the
// matches and target it parses from them. The core itself reads only the
// rule's target (-j or -g), which it resolves and checks as iptables
// does, and leaves the rest to the simulator's Dialect.
//
// What it simulates:
//
//   - Each "*table" … "COMMIT" block works on one table. Without --noflush
//     the table starts empty (rules flushed, user chains deleted, built-in
//     policies kept); with it the table keeps what the block does not
//     change. Tables the input does not name are left alone either way.
//   - ":CHAIN - [p:b]" creates a user chain, or flushes it if it exists
//     (with --noflush; without, a second declaration is an error, as in
//     iptables-legacy-restore: EEXIST); ":BUILTIN POLICY [p:b]" sets a
//     built-in chain's policy ("-" keeps it) and does not flush it.
//   - -A, -I, -R, -D, -F, -X, -N, -P and -Z work as on the command line;
//     "[p:b]" before a command (iptables-save --counters) is skipped.
//   - What iptables or the kernel refuses is an error naming the line: an
//     unknown table, a missing COMMIT, a rule in a chain that does not
//     exist, a jump to a chain that does not exist (yet: chains are
//     declared before the rules that jump to them) or to a built-in chain,
//     a goto to a verdict, an unknown target, a target outside its table
//     (DNAT outside nat, REJECT outside filter, ...), deleting a chain that
//     has rules or that a rule jumps to, a bad chain name or policy, -t.
//   - At COMMIT the table is checked as the kernel checks it: no loop of
//     jumps reachable from a built-in chain, and every target reachable
//     only from hooks it supports (DNAT from PREROUTING and OUTPUT,
//     MASQUERADE from POSTROUTING, REJECT from INPUT, FORWARD and OUTPUT,
//     ...). iptables-legacy reports these at the COMMIT line, iptables-nft
//     at the rule: Error carries both.
//   - Commit per table (iptables-restore: a failure keeps the tables
//     committed before it) or all or nothing; and the syntax-only check of
//     iptables-nft-restore --test, which resolves no chain.
//
// Where iptables-legacy and iptables-nft differ it follows the stricter.
// It checks no match or target option: that is the Dialect's part.
package restore

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/kproxy/kproxy/internal/kernel/xtables"
)

// Rule is one rule of a chain.
type Rule[S any] struct {
	// Spec is the simulator's form of the rule.
	Spec S
	// Target is the argument of -j or -g, "" when the rule has none; Goto
	// says it was -g.
	Target string
	Goto   bool
	// Line is the line of the restore input that added the rule.
	Line int
	// restore is the Restore call that added it (Tables.restores).
	restore int
}

// Chain is a chain of a table.
type Chain[S any] struct {
	Name    string
	Builtin bool
	Policy  string // built-in chains: ACCEPT or DROP
	Rules   []Rule[S]
}

// Table is one table: its built-in chains and its user chains.
type Table[S any] struct {
	Name   string
	chains map[string]*Chain[S]
	order  []string // chain names in creation order
}

// NewTable returns a table as the kernel creates it: its built-in chains,
// empty, with policy ACCEPT.
func NewTable[S any](name string) *Table[S] {
	t := &Table[S]{Name: name, chains: map[string]*Chain[S]{}}
	for _, c := range xtables.BuiltinChains[name] {
		t.addChain(&Chain[S]{Name: c, Builtin: true, Policy: accept})
	}
	return t
}

func (t *Table[S]) addChain(c *Chain[S]) {
	t.chains[c.Name] = c
	t.order = append(t.order, c.Name)
}

// Chain returns the chain of that name, nil if there is none.
func (t *Table[S]) Chain(name string) *Chain[S] { return t.chains[name] }

// Chains lists the chains in the order iptables-save prints them:
// built-in chains in hook order, then user chains sorted by name.
func (t *Table[S]) Chains() []string {
	out := slices.Clone(xtables.BuiltinChains[t.Name])
	return append(out, t.userChains()...)
}

func (t *Table[S]) userChains() []string {
	var user []string
	for _, n := range t.order {
		if !t.chains[n].Builtin {
			user = append(user, n)
		}
	}
	slices.Sort(user)
	return user
}

// clone copies the table so that a restore can change the copy and drop
// it on error. Specs are shared: nothing changes a rule in place.
func (t *Table[S]) clone() *Table[S] {
	n := &Table[S]{Name: t.Name, chains: make(map[string]*Chain[S], len(t.chains)), order: slices.Clone(t.order)}
	for k, c := range t.chains {
		nc := *c
		nc.Rules = slices.Clone(c.Rules)
		n.chains[k] = &nc
	}
	return n
}

// flushed is what a restore without --noflush starts from: the built-in
// chains with their policies, empty, and no user chains.
func (t *Table[S]) flushed() *Table[S] {
	n := NewTable[S](t.Name)
	for _, c := range xtables.BuiltinChains[t.Name] {
		n.chains[c].Policy = t.chains[c].Policy
	}
	return n
}

// Save prints the table as iptables-save does (without counters): the
// chain lines in Chains order, the rules chain by chain, COMMIT.
func (t *Table[S]) Save(d Dialect[S]) string {
	var b strings.Builder
	b.WriteString("*" + t.Name + "\n")
	names := t.Chains()
	for _, n := range names {
		p := "-"
		if c := t.chains[n]; c.Builtin {
			p = c.Policy
		}
		fmt.Fprintf(&b, ":%s %s [0:0]\n", n, p)
	}
	for _, n := range names {
		for _, r := range t.chains[n].Rules {
			b.WriteString(RuleText(n, r.Spec, d))
			b.WriteByte('\n')
		}
	}
	b.WriteString("COMMIT\n")
	return b.String()
}

// RuleText is a rule as iptables-save prints it: "-A CHAIN" and the
// Dialect's text of the rule.
func RuleText[S any](chain string, spec S, d Dialect[S]) string {
	s := "-A " + chain
	if text := d.Text(spec); text != "" {
		s += " " + text
	}
	return s
}

// Dialect is a simulator's part of a restore: what it keeps of a rule.
type Dialect[S any] interface {
	// Begin is called at each "*table" line.
	Begin(table string)
	// Rule reads the words of a rule of chain c (after "-A CHAIN"; for
	// -I and -R after the rule number). The target was found and checked
	// already (Table.Chain tells a chain from a target). It returns one
	// Spec per rule the words stand for: iptables adds a rule per pair of
	// -s and -d addresses.
	Rule(t *Table[S], c *Chain[S], words []xtables.Token) ([]S, error)
	// Same reports whether "-D CHAIN" with the words of b deletes a.
	Same(a, b S) bool
	// Text is the rule as iptables-save prints it after "-A CHAIN".
	Text(spec S) string
	// Commit is called when a table's new state is committed.
	Commit(table string)
}

// Tables are the tables of one family. The zero value has no tables,
// as a fresh network namespace.
type Tables[S any] struct {
	tables   map[string]*Table[S]
	names    []string // creation order
	restores int      // Restore calls so far
}

// Table returns a table, nil if it does not exist.
func (ts *Tables[S]) Table(name string) *Table[S] { return ts.tables[name] }

// Names lists the tables that exist, in the order they were created.
func (ts *Tables[S]) Names() []string { return slices.Clone(ts.names) }

// Create returns a table, creating it empty if it does not exist (as the
// kernel loads a legacy table on first access).
func (ts *Tables[S]) Create(name string) *Table[S] {
	if t := ts.tables[name]; t != nil {
		return t
	}
	t := NewTable[S](name)
	ts.install(t)
	return t
}

func (ts *Tables[S]) install(t *Table[S]) {
	if ts.tables == nil {
		ts.tables = map[string]*Table[S]{}
	}
	if ts.tables[t.Name] == nil {
		ts.names = append(ts.names, t.Name)
	}
	ts.tables[t.Name] = t
}

// Clone copies the tables; a restore into the copy leaves these alone.
func (ts *Tables[S]) Clone() *Tables[S] {
	n := &Tables[S]{names: slices.Clone(ts.names), restores: ts.restores, tables: make(map[string]*Table[S], len(ts.tables))}
	for k, t := range ts.tables {
		n.tables[k] = t.clone()
	}
	return n
}

// Options change how Restore works.
type Options struct {
	// NoFlush is iptables-restore --noflush.
	NoFlush bool
	// PerTable commits each table at its COMMIT, as iptables-restore
	// does: a failure keeps the tables committed before it. Otherwise a
	// failed restore changes nothing.
	PerTable bool
	// SyntaxOnly is what iptables-nft-restore --test checks: every line
	// and the targets, but no chain is resolved and nothing reaches the
	// kernel: -A or -I to a chain that does not exist, a jump to one, -D
	// of a rule that is not there, -X of a chain in use and a loop all
	// pass (iptables v1.8.9, checked by TestNFTRestoreTestResolvesNoChain
	// in internal/proxy/iptables). Chains named for the first time are
	// created.
	SyntaxOnly bool
}

// Error is a line of restore input that iptables-restore or the kernel
// refuses.
type Error struct {
	// Line is the 1-based line number in the input; for a table the
	// kernel refuses when it is committed, the COMMIT line. Text is that
	// line, trimmed.
	Line int
	Text string
	Err  error
	// AtCommit: the kernel refused the table at COMMIT (a loop, a target
	// reached from a hook it does not support). RuleLine and RuleText then
	// name the latest line of this input on the path from the built-in
	// chain to the refused rule (the rule itself, or the jump that made it
	// reachable), 0 and "" when every rule on it is older.
	AtCommit bool
	RuleLine int
	RuleText string
}

func (e *Error) Error() string { return fmt.Sprintf("line %d: %v", e.Line, e.Err) }
func (e *Error) Unwrap() error { return e.Err }

// Restore applies iptables-restore input to the tables, as
// iptables-restore would with those options. On error the tables are as
// before the call, but for the tables committed before the failing one
// with PerTable.
func (ts *Tables[S]) Restore(data []byte, opts Options, d Dialect[S]) error {
	ts.restores++
	r := &run[S]{ts: ts, opts: opts, d: d, lines: strings.Split(string(data), "\n"), staged: map[string]*Table[S]{}}
	for i, raw := range r.lines {
		r.n, r.line = i+1, strings.TrimSpace(raw)
		if err := r.step(); err != nil {
			if e, ok := err.(*Error); ok {
				return e
			}
			return &Error{Line: r.n, Text: r.line, Err: err}
		}
	}
	if r.cur != nil {
		n := len(r.lines)
		return &Error{Line: n, Text: strings.TrimSpace(r.lines[n-1]), Err: fmt.Errorf("COMMIT expected at line %d: table %s has no COMMIT", n, r.cur.Name)}
	}
	for _, name := range r.order {
		ts.install(r.staged[name])
		d.Commit(name)
	}
	return nil
}

// run is one Restore call.
type run[S any] struct {
	ts    *Tables[S]
	opts  Options
	d     Dialect[S]
	lines []string
	n     int    // current line number
	line  string // current line, trimmed
	cur   *Table[S]
	// staged are the committed tables not installed yet (without
	// PerTable), order their names.
	staged map[string]*Table[S]
	order  []string
}

func (r *run[S]) step() error {
	line := r.line
	switch {
	case line == "" || line[0] == '#':
	case line[0] == '*':
		if r.cur != nil {
			return fmt.Errorf("COMMIT expected at line %d: table %s has no COMMIT before the next table", r.n, r.cur.Name)
		}
		name := line[1:]
		if xtables.BuiltinChains[name] == nil {
			return fmt.Errorf("unable to initialize table '%s': no such table", name)
		}
		base := r.staged[name]
		if base == nil {
			base = r.ts.Table(name)
		}
		switch {
		case base == nil:
			r.cur = NewTable[S](name)
		case r.opts.NoFlush:
			r.cur = base.clone()
		default:
			r.cur = base.flushed()
		}
		r.d.Begin(name)
	case line == "COMMIT":
		if r.cur == nil {
			return errors.New(`COMMIT outside a table (expected "*table" first)`)
		}
		if !r.opts.SyntaxOnly {
			if err := r.check(); err != nil {
				return err
			}
		}
		name := r.cur.Name
		if r.opts.PerTable {
			r.ts.install(r.cur)
			r.d.Commit(name)
		} else {
			if r.staged[name] == nil {
				r.order = append(r.order, name)
			}
			r.staged[name] = r.cur
		}
		r.cur = nil
	case r.cur == nil:
		return fmt.Errorf(`%q outside a table (expected "*table" first)`, line)
	case line[0] == ':':
		return r.declare()
	case line[0] == '-' || line[0] == '[':
		toks, err := xtables.Tokenize(line)
		if err != nil {
			return err
		}
		return r.command(toks)
	default:
		return fmt.Errorf("unexpected %q", line)
	}
	return nil
}

// declare handles ":CHAIN POLICY [packets:bytes]".
func (r *run[S]) declare() error {
	t := r.cur
	f := strings.Fields(r.line[1:])
	if len(f) < 2 || len(f) > 3 {
		return errors.New(`malformed chain line: want ":NAME POLICY [packets:bytes]"`)
	}
	name, policy := f[0], f[1]
	if len(f) == 3 && !validCounters(f[2]) {
		return fmt.Errorf("bad counters %q", f[2])
	}
	if c := t.chains[name]; c != nil && c.Builtin {
		switch policy {
		case "-":
		case accept, drop:
			c.Policy = policy
		default:
			return fmt.Errorf("bad policy name `%s' for built-in chain %s", policy, name)
		}
		return nil
	}
	if builtinOfAnyTable(name) {
		return fmt.Errorf("%s is not a built-in chain of table %s", name, t.Name)
	}
	if policy != "-" {
		return fmt.Errorf("can't set policy `%s' on `%s': not a built-in chain of table %s", policy, name, t.Name)
	}
	if err := checkChainName(name); err != nil {
		return err
	}
	if c := t.chains[name]; c != nil {
		if !r.opts.NoFlush {
			// iptables-legacy-restore creates every declared chain in the
			// emptied table: a second declaration is EEXIST.
			return fmt.Errorf("chain %s declared twice: error creating chain '%s': File exists", name, name)
		}
		// With --noflush, declaring an existing chain flushes it: the
		// way kube-proxy rewrites a chain in a partial sync.
		c.Rules = nil
		return nil
	}
	t.addChain(&Chain[S]{Name: name})
	return nil
}

func validCounters(s string) bool {
	if len(s) < 5 || s[0] != '[' || s[len(s)-1] != ']' {
		return false
	}
	p, b, ok := strings.Cut(s[1:len(s)-1], ":")
	_, err1 := strconv.ParseUint(p, 10, 64)
	_, err2 := strconv.ParseUint(b, 10, 64)
	return ok && err1 == nil && err2 == nil
}
