// Package xtablestest has an in-memory xtables.Interface for the tests of
// code that writes iptables rules.
//
// The Fake reads restore input the way iptables-restore does and rejects
// what iptables-restore or the kernel would reject: an unknown table, a
// missing COMMIT, a rule in a chain that does not exist, a jump to a chain
// that does not exist (yet: chains must be declared before the rules that
// jump to them), deleting a chain that is not empty or that a rule still
// jumps to, a loop of jumps that a built-in chain reaches,
// DNAT/SNAT/MASQUERADE/REDIRECT outside the nat table or reachable from a
// hook where the kernel refuses them, REJECT outside filter. Where the two
// backends differ it follows the stricter one (legacy): a user chain
// declared twice in a flushing restore, or a user chain with a policy, is
// an error.
//
// Errors are *xtables.RestoreError naming the input line, as the real
// backends do; checks the kernel makes when a table is committed (loops,
// hooks) name the COMMIT line, as legacy does (nft names the rule). A
// kernel test runs the same inputs through both backends and the Fake and
// compares what they accept and hold.
//
// It does not canonicalize rules as iptables-save does (`-p tcp --dport
// 80` is not turned into `-p tcp -m tcp --dport 80`, addresses get no
// /32): Save prints rules as they were given, fields quoted as needed,
// and `-D` with a rule matches the same fields only. It checks no match
// or target options.
package xtablestest

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/kproxy/kproxy/internal/kernel/xtables"
)

// Fake is a stateful in-memory xtables.Interface of one backend and
// family. It is safe for concurrent use. Its exported fields must be set
// before use.
type Fake struct {
	// CommitPerTable makes Restore commit each table at its COMMIT line as
	// iptables-restore does, so that a failed call keeps the tables
	// before the failing one. By default a failed call changes nothing.
	CommitPerTable bool
	// RestoreHook, if set, runs first in every Restore; an error it
	// returns fails the call (logged, nothing changed). Tests use it to
	// inject failures, for example an error wrapping xtables.ErrLockTimeout.
	RestoreHook func(data []byte, opts xtables.RestoreOptions) error
	// Stats is what RestoreWithStats reports.
	Stats xtables.RestoreStats
	// VersionString is what Version returns; NewFake sets "1.8.9".
	VersionString string

	backend xtables.Backend
	family  xtables.Family

	mu       sync.Mutex
	tables   map[string]*table
	restores []RestoreCall
}

var _ xtables.Interface = (*Fake)(nil)

// RestoreCall is one Restore call, as the Fake logs it.
type RestoreCall struct {
	Data    []byte
	NoFlush bool
	// Test: the call only checked the input (--test).
	Test bool
	// Err is the error the call returned, nil if it succeeded.
	Err error
}

// NewFake returns a Fake with no tables, as a fresh network namespace.
func NewFake(b xtables.Backend, f xtables.Family) *Fake {
	return &Fake{backend: b, family: f, tables: map[string]*table{}, VersionString: "1.8.9"}
}

func (f *Fake) Backend() xtables.Backend { return f.backend }
func (f *Fake) Family() xtables.Family   { return f.family }

// Version returns VersionString.
func (f *Fake) Version(context.Context) (string, error) { return f.VersionString, nil }

// Restore implements xtables.Interface.
func (f *Fake) Restore(ctx context.Context, data []byte, opts xtables.RestoreOptions) error {
	_, err := f.RestoreWithStats(ctx, data, opts)
	return err
}

// RestoreWithStats implements xtables.Interface.
func (f *Fake) RestoreWithStats(_ context.Context, data []byte, opts xtables.RestoreOptions) (xtables.RestoreStats, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var err error
	if f.RestoreHook != nil {
		err = f.RestoreHook(data, opts)
	}
	if err == nil {
		if opts.Test {
			// Checked on a copy that is thrown away.
			kept := f.tables
			f.tables = make(map[string]*table, len(kept))
			for n, t := range kept {
				f.tables[n] = t.clone()
			}
			err = f.restore(string(data), opts.NoFlush, f.backend == xtables.NFT)
			f.tables = kept
		} else {
			err = f.restore(string(data), opts.NoFlush, false)
		}
	}
	f.restores = append(f.restores, RestoreCall{Data: slices.Clone(data), NoFlush: opts.NoFlush, Test: opts.Test, Err: err})
	if err != nil {
		return xtables.RestoreStats{}, err
	}
	return f.Stats, nil
}

// Save implements xtables.Interface. Like the real backends, the legacy
// Fake creates a table that does not exist yet; the nft one prints its
// empty built-in chains without creating it.
func (f *Fake) Save(_ context.Context, name string) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !slices.Contains(xtables.Tables, name) {
		return nil, fmt.Errorf("xtablestest: saving %s %s table %s: unknown table", f.backend, f.family, name)
	}
	t := f.tables[name]
	if t == nil {
		t = newTable(name)
		if f.backend == xtables.Legacy {
			f.tables[name] = t
		}
	}
	return []byte(t.save()), nil
}

// Restores returns the log of Restore calls, oldest first.
func (f *Fake) Restores() []RestoreCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.restores)
}

// ClearRestores empties the log of Restore calls.
func (f *Fake) ClearRestores() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.restores = nil
}

// Tables lists the tables that exist, in xtables.Tables order.
func (f *Fake) Tables() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, n := range xtables.Tables {
		if f.tables[n] != nil {
			out = append(out, n)
		}
	}
	return out
}

// Dump returns every existing table in iptables-save syntax, in
// xtables.Tables order. It creates nothing.
func (f *Fake) Dump() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var b strings.Builder
	for _, n := range xtables.Tables {
		if t := f.tables[n]; t != nil {
			b.WriteString(t.save())
		}
	}
	return b.String()
}

// Chains lists the chains of a table as Save prints them: built-in chains
// in hook order, then user chains sorted. Nil if the table does not exist.
func (f *Fake) Chains(table string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := f.tables[table]
	if t == nil {
		return nil
	}
	return t.order()
}

// Rules returns the rules of a chain as Save prints them ("-A CHAIN ...").
// Nil if the table or chain does not exist.
func (f *Fake) Rules(table, chain string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := f.tables[table]
	if t == nil || t.chains[chain] == nil {
		return nil
	}
	var out []string
	for _, r := range t.chains[chain].rules {
		out = append(out, r.text(chain))
	}
	return out
}

type table struct {
	name   string
	chains map[string]*chain
	// syntaxOnly: what iptables-nft-restore --test does. It parses every
	// line and checks each match's and target's options in userspace, but
	// resolves no chain and sends nothing to the kernel: an -A or -I to a
	// chain that does not exist, a jump to one, a -D of a rule that is not
	// there, a -X of a chain in use and a loop all pass (iptables v1.8.9,
	// checked by TestNFTRestoreTestResolvesNoChain in internal/proxy/iptables).
	syntaxOnly bool
}

type chain struct {
	builtin bool
	policy  string // built-in chains only
	rules   []rule
}

type rule struct {
	fields []string // after "-A CHAIN"
	target string   // -j/-g target, "" if none
	isGoto bool
}

func (r rule) text(chain string) string {
	var b strings.Builder
	b.WriteString("-A " + chain)
	for i, f := range r.fields {
		b.WriteByte(' ')
		if i > 0 && r.fields[i-1] == "--comment" {
			b.WriteString(xtables.SaveString(f))
		} else {
			b.WriteString(xtables.Quote(f))
		}
	}
	return b.String()
}

func newTable(name string) *table {
	t := &table{name: name, chains: map[string]*chain{}}
	for _, c := range xtables.BuiltinChains[name] {
		t.chains[c] = &chain{builtin: true, policy: "ACCEPT"}
	}
	return t
}

func (t *table) clone() *table {
	c := &table{name: t.name, chains: make(map[string]*chain, len(t.chains))}
	for n, ch := range t.chains {
		cc := *ch
		cc.rules = slices.Clone(ch.rules)
		c.chains[n] = &cc
	}
	return c
}

// flushed is what a restore without --noflush starts from: the built-in
// chains with their policies, empty, and no user chains.
func (t *table) flushed() *table {
	c := newTable(t.name)
	for n, ch := range c.chains {
		ch.policy = t.chains[n].policy
	}
	return c
}

func (t *table) order() []string {
	out := slices.Clone(xtables.BuiltinChains[t.name])
	var user []string
	for n, c := range t.chains {
		if !c.builtin {
			user = append(user, n)
		}
	}
	slices.Sort(user)
	return append(out, user...)
}

func (t *table) save() string {
	var b strings.Builder
	b.WriteString("*" + t.name + "\n")
	names := t.order()
	for _, n := range names {
		p := "-"
		if c := t.chains[n]; c.builtin {
			p = c.policy
		}
		fmt.Fprintf(&b, ":%s %s [0:0]\n", n, p)
	}
	for _, n := range names {
		for _, r := range t.chains[n].rules {
			b.WriteString(r.text(n) + "\n")
		}
	}
	b.WriteString("COMMIT\n")
	return b.String()
}

// references counts the rules of the table that jump or go to a chain.
func (t *table) references(name string) int {
	n := 0
	for _, c := range t.chains {
		for _, r := range c.rules {
			if r.target == name {
				n++
			}
		}
	}
	return n
}

// restoreError builds the error of a rejected input line.
func (f *Fake) restoreError(line int, format string, args ...any) error {
	return &xtables.RestoreError{Backend: f.backend, Family: f.family, Line: line, Detail: fmt.Sprintf(format, args...)}
}

// restore applies restore input to the Fake's tables (syntaxOnly: see
// table). f.mu is held.
func (f *Fake) restore(data string, noflush, syntaxOnly bool) error {
	staged := map[string]*table{}
	var cur *table
	lines := strings.Split(data, "\n")
	for i, raw := range lines {
		n := i + 1
		line := strings.TrimSpace(raw)
		switch {
		case line == "" || line[0] == '#':
		case line[0] == '*':
			if cur != nil {
				return f.restoreError(n, "COMMIT expected at line %d", n)
			}
			name := line[1:]
			if !slices.Contains(xtables.Tables, name) {
				return f.restoreError(n, "unable to initialize table '%s'", name)
			}
			base := staged[name]
			if base == nil {
				base = f.tables[name]
			}
			switch {
			case base == nil:
				cur = newTable(name)
			case noflush:
				cur = base.clone()
			default:
				cur = base.flushed()
			}
			cur.syntaxOnly = syntaxOnly
		case line == "COMMIT":
			if cur == nil {
				return f.restoreError(n, "COMMIT outside a table")
			}
			if err := cur.check(); err != nil && !cur.syntaxOnly {
				return f.restoreError(n, "%s", err)
			}
			staged[cur.name] = cur
			if f.CommitPerTable {
				f.tables[cur.name] = cur
			}
			cur = nil
		case cur == nil:
			return f.restoreError(n, "%q outside a table", line)
		case line[0] == ':':
			if err := declare(cur, line, noflush); err != nil {
				return f.restoreError(n, "%s", err)
			}
		case line[0] == '-':
			if err := command(cur, line); err != nil {
				return f.restoreError(n, "%s", err)
			}
		default:
			return f.restoreError(n, "unexpected %q", line)
		}
	}
	if cur != nil {
		return f.restoreError(len(lines), "COMMIT expected at line %d", len(lines))
	}
	for name, t := range staged {
		f.tables[name] = t
	}
	return nil
}

// maxChainName is the longest chain name iptables accepts
// (XT_EXTENSION_MAXNAMELEN - 1).
const maxChainName = 28

func checkChainName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("empty chain name")
	case len(name) > maxChainName:
		return fmt.Errorf("invalid chain name `%s' (%d chars max)", name, maxChainName)
	case name[0] == '-' || name[0] == '!':
		return fmt.Errorf("invalid chain name `%s'", name)
	case strings.ContainsAny(name, " \t\"'"):
		return fmt.Errorf("invalid chain name `%s'", name)
	case targets[name] != nil || name == "ACCEPT" || name == "DROP" || name == "RETURN" || name == "QUEUE":
		return fmt.Errorf("chain name `%s' may not clash with a target name", name)
	}
	return nil
}

// declare handles ":CHAIN POLICY [packets:bytes]". A built-in chain gets
// its policy ("-" keeps it) and is not flushed; a user chain is created,
// or flushed if it exists and the restore is --noflush.
func declare(t *table, line string, noflush bool) error {
	f := strings.Fields(line[1:])
	if len(f) < 2 || len(f) > 3 {
		return fmt.Errorf("malformed chain line %q", line)
	}
	name, policy := f[0], f[1]
	if len(f) == 3 && !validCounters(f[2]) {
		return fmt.Errorf("bad counters %q", f[2])
	}
	if c := t.chains[name]; c != nil && c.builtin {
		switch policy {
		case "-":
		case "ACCEPT", "DROP":
			c.policy = policy
		default:
			return fmt.Errorf("bad policy name `%s' for built-in chain %s", policy, name)
		}
		return nil
	}
	if policy != "-" {
		return fmt.Errorf("can't set policy `%s' on `%s': not a built-in chain of table %s", policy, name, t.name)
	}
	if err := checkChainName(name); err != nil {
		return err
	}
	if c := t.chains[name]; c != nil {
		if !noflush {
			// iptables-legacy-restore creates every declared chain in the
			// emptied table: a second declaration is EEXIST.
			return fmt.Errorf("error creating chain '%s': File exists", name)
		}
		c.rules = nil
		return nil
	}
	t.chains[name] = &chain{}
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

// command handles one command line of the restore input.
func command(t *table, line string) error {
	tok, err := xtables.Fields(line)
	if err != nil {
		return err
	}
	for _, x := range tok {
		if x == "-t" || x == "--table" {
			return fmt.Errorf("the -t option cannot be used in iptables-restore")
		}
	}
	cmd, args := tok[0], tok[1:]
	chainArg := func() (*chain, string, error) {
		if len(args) == 0 {
			return nil, "", fmt.Errorf("%s needs a chain", cmd)
		}
		c := t.chains[args[0]]
		if c == nil && t.syntaxOnly {
			if err := checkChainName(args[0]); err != nil {
				return nil, args[0], err
			}
			c = &chain{}
			t.chains[args[0]] = c
		}
		if c == nil {
			return nil, args[0], fmt.Errorf("chain '%s' does not exist in table %s", args[0], t.name)
		}
		return c, args[0], nil
	}
	switch cmd {
	case "-A", "--append":
		c, name, err := chainArg()
		if err != nil {
			return err
		}
		r, err := t.newRule(name, args[1:])
		if err != nil {
			return err
		}
		c.rules = append(c.rules, r)
	case "-I", "--insert":
		c, name, err := chainArg()
		if err != nil {
			return err
		}
		spec, pos := args[1:], 1
		if len(spec) > 0 {
			if n, err := strconv.Atoi(spec[0]); err == nil {
				pos, spec = n, spec[1:]
			}
		}
		if t.syntaxOnly {
			pos = min(max(pos, 1), len(c.rules)+1)
		}
		if pos < 1 || pos > len(c.rules)+1 {
			return fmt.Errorf("index of insertion %d too big for chain %s (%d rules)", pos, name, len(c.rules))
		}
		r, err := t.newRule(name, spec)
		if err != nil {
			return err
		}
		c.rules = slices.Insert(c.rules, pos-1, r)
	case "-D", "--delete":
		c, name, err := chainArg()
		if err != nil {
			return err
		}
		spec := args[1:]
		if len(spec) == 1 {
			if n, err := strconv.Atoi(spec[0]); err == nil {
				if n < 1 || n > len(c.rules) {
					return fmt.Errorf("index of deletion %d too big for chain %s (%d rules)", n, name, len(c.rules))
				}
				c.rules = slices.Delete(c.rules, n-1, n)
				return nil
			}
		}
		i := slices.IndexFunc(c.rules, func(r rule) bool { return slices.Equal(r.fields, spec) })
		if i < 0 && t.syntaxOnly {
			return nil
		}
		if i < 0 {
			//lint:ignore ST1005 iptables' own message, which callers match
			return fmt.Errorf("Bad rule (does a matching rule exist in that chain?): no such rule in %s", name)
		}
		c.rules = slices.Delete(c.rules, i, i+1)
	case "-F", "--flush":
		if len(args) == 0 {
			for _, c := range t.chains {
				c.rules = nil
			}
			return nil
		}
		c, _, err := chainArg()
		if err != nil {
			return err
		}
		c.rules = nil
	case "-X", "--delete-chain":
		var names []string
		if len(args) == 0 {
			for n, c := range t.chains {
				if !c.builtin {
					names = append(names, n)
				}
			}
			slices.Sort(names)
		} else {
			c, name, err := chainArg()
			if err != nil {
				return err
			}
			if c.builtin {
				return fmt.Errorf("cannot delete built-in chain %s", name)
			}
			names = []string{name}
		}
		for _, n := range names {
			if t.syntaxOnly {
				break
			}
			if len(t.chains[n].rules) > 0 {
				return fmt.Errorf("cannot delete chain %s: Directory not empty (%d rules)", n, len(t.chains[n].rules))
			}
		}
		for _, n := range names {
			if t.syntaxOnly {
				break
			}
			if refs := t.references(n); refs > 0 {
				return fmt.Errorf("cannot delete chain %s: Too many links (%d rules jump to it)", n, refs)
			}
		}
		for _, n := range names {
			delete(t.chains, n)
		}
	case "-N", "--new-chain":
		if len(args) != 1 {
			return fmt.Errorf("%s needs one chain name", cmd)
		}
		if err := checkChainName(args[0]); err != nil {
			return err
		}
		if t.chains[args[0]] != nil {
			return fmt.Errorf("chain %s already exists", args[0])
		}
		t.chains[args[0]] = &chain{}
	case "-P", "--policy":
		c, name, err := chainArg()
		if err != nil {
			return err
		}
		if len(args) != 2 || (args[1] != "ACCEPT" && args[1] != "DROP") || !c.builtin {
			return fmt.Errorf("bad policy for chain %s: %q", name, strings.Join(args[1:], " "))
		}
		c.policy = args[1]
	default:
		return fmt.Errorf("unknown or unsupported command %q", cmd)
	}
	return nil
}

// targetInfo restricts where an extension target may be used: the table
// (the kernel module's .table) and the built-in chains it may be reached
// from (.hooks). Empty means anywhere.
type targetInfo struct {
	table string
	hooks []string
}

// targets are the extension targets the Fake knows, besides chains and
// the verdicts ACCEPT, DROP, RETURN and QUEUE.
var targets = map[string]*targetInfo{
	"DNAT":        {table: "nat", hooks: []string{"PREROUTING", "OUTPUT"}},
	"REDIRECT":    {table: "nat", hooks: []string{"PREROUTING", "OUTPUT"}},
	"SNAT":        {table: "nat", hooks: []string{"POSTROUTING", "INPUT"}},
	"MASQUERADE":  {table: "nat", hooks: []string{"POSTROUTING"}},
	"NETMAP":      {table: "nat"},
	"REJECT":      {table: "filter", hooks: []string{"INPUT", "FORWARD", "OUTPUT"}},
	"CT":          {table: "raw"},
	"NOTRACK":     {table: "raw"},
	"TRACE":       {table: "raw"},
	"TPROXY":      {table: "mangle"},
	"DSCP":        {table: "mangle"},
	"TOS":         {table: "mangle"},
	"TTL":         {table: "mangle"},
	"HL":          {table: "mangle"},
	"CHECKSUM":    {table: "mangle"},
	"MARK":        {},
	"CONNMARK":    {},
	"LOG":         {},
	"NFLOG":       {},
	"NFQUEUE":     {},
	"TCPMSS":      {},
	"CLASSIFY":    {},
	"SET":         {},
	"AUDIT":       {},
	"SECMARK":     {},
	"CONNSECMARK": {},
	"TEE":         {},
	"SYNPROXY":    {},
	"HMARK":       {},
	"IDLETIMER":   {},
	"LED":         {},
	"RATEEST":     {},
}

var verdicts = []string{"ACCEPT", "DROP", "RETURN", "QUEUE"}

// newRule parses a rule specification of chain and checks its target.
func (t *table) newRule(chain string, spec []string) (rule, error) {
	r := rule{fields: slices.Clone(spec)}
	for i := 0; i < len(spec); i++ {
		switch spec[i] {
		case "-j", "--jump", "-g", "--goto":
			if i+1 >= len(spec) {
				return rule{}, fmt.Errorf("%s needs a target", spec[i])
			}
			if r.target != "" {
				return rule{}, fmt.Errorf("more than one target in a rule")
			}
			r.target = spec[i+1]
			r.isGoto = spec[i] == "-g" || spec[i] == "--goto"
			i++
		}
	}
	if r.target == "" {
		return r, nil
	}
	if c := t.chains[r.target]; c != nil {
		if c.builtin {
			return rule{}, fmt.Errorf("cannot jump to built-in chain %s", r.target)
		}
		return r, nil
	}
	info := targets[r.target]
	if info == nil && !slices.Contains(verdicts, r.target) && t.syntaxOnly && checkChainName(r.target) == nil {
		return r, nil // taken for a chain, unresolved
	}
	if info == nil && !slices.Contains(verdicts, r.target) {
		return rule{}, fmt.Errorf("couldn't load target `%s': no such chain in table %s, nor target", r.target, t.name)
	}
	if r.isGoto {
		return rule{}, fmt.Errorf("goto '%s' is not a chain", r.target)
	}
	if info != nil && info.table != "" && info.table != t.name {
		return rule{}, fmt.Errorf("target %s is only valid in table %s, not %s", r.target, info.table, t.name)
	}
	return r, nil
}

// check does what the kernel does when a table is committed: no loops of
// jumps reachable from a hook, and every target used only from the hooks it supports.
func (t *table) check() error {
	// Loops: depth-first search over jump edges, from the built-in chains.
	const (
		white = iota
		grey
		black
	)
	color := map[string]int{}
	var visit func(string) error
	visit = func(n string) error {
		color[n] = grey
		for _, r := range t.chains[n].rules {
			if c := t.chains[r.target]; c == nil || c.builtin {
				continue
			}
			switch color[r.target] {
			case grey:
				return fmt.Errorf("loop of jumps through chain %s (Too many levels of symbolic links)", r.target)
			case white:
				if err := visit(r.target); err != nil {
					return err
				}
			}
		}
		color[n] = black
		return nil
	}
	// Like the kernel, only what the hooks reach is checked: a loop
	// between chains nothing jumps to is accepted.
	for _, n := range xtables.BuiltinChains[t.name] {
		if color[n] == white {
			if err := visit(n); err != nil {
				return err
			}
		}
	}
	// Hooks: which built-in chains reach each chain.
	from := map[string][]string{}
	for _, hook := range xtables.BuiltinChains[t.name] {
		seen := map[string]bool{hook: true}
		queue := []string{hook}
		for len(queue) > 0 {
			n := queue[0]
			queue = queue[1:]
			from[n] = append(from[n], hook)
			for _, r := range t.chains[n].rules {
				if c := t.chains[r.target]; c != nil && !seen[r.target] {
					seen[r.target] = true
					queue = append(queue, r.target)
				}
			}
		}
	}
	for _, n := range t.order() {
		for _, r := range t.chains[n].rules {
			info := targets[r.target]
			if info == nil || len(info.hooks) == 0 {
				continue
			}
			for _, hook := range from[n] {
				if !slices.Contains(info.hooks, hook) {
					return fmt.Errorf("target %s in chain %s is reached from %s; it is only valid from %s (Invalid argument)", r.target, n, hook, strings.Join(info.hooks, ", "))
				}
			}
		}
	}
	return nil
}
