package iptables

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/kproxy/kproxy/internal/kernel/xtables"
)

// Parse reads iptables-save output (or iptables-restore input) and returns
// the state the kernel would hold after restoring it into empty tables.
func Parse(data []byte) (*Ruleset, error) {
	r := &Ruleset{}
	if err := r.Apply(data, false); err != nil {
		return nil, err
	}
	return r, nil
}

// Apply restores more input into the ruleset, as `iptables-restore` (or
// `iptables-restore --noflush` when noflush is true) would:
//
//   - Each "*table" … "COMMIT" block works on one table. Without noflush
//     the table is emptied first (rules flushed, user chains deleted,
//     built-in policies kept); tables the input does not name are left
//     alone either way.
//   - ":CHAIN - [p:b]" creates a user chain, or flushes it if it exists
//     (with noflush); ":BUILTIN POLICY [p:b]" sets a built-in chain's
//     policy ("-" keeps it) and does not flush it.
//   - -A, -I, -R, -D, -F, -X, -N, -P and -Z work as on the command line.
//     -X refuses a chain that still has rules or is still the target of a
//     rule.
//
// At COMMIT the table is checked as the kernel checks it (no loop between
// chains reachable from a hook, DNAT only on PREROUTING/OUTPUT, MASQUERADE
// only on POSTROUTING, REJECT only on INPUT/FORWARD/OUTPUT) and replaces
// the old one. As with iptables-restore, an error leaves the tables
// committed before it in place and the failing table unchanged. Line
// numbers in errors count from the start of data.
func (r *Ruleset) Apply(data []byte, noflush bool) error {
	r.gen++
	lines := strings.Split(string(data), "\n")
	var (
		cur      *table
		curLine  int
		family   = r.family
		declared map[string]bool // user chains declared in this block (without noflush)
	)
	for i, raw := range lines {
		line := strings.TrimSpace(raw)
		if line == "" || line[0] == '#' {
			continue
		}
		fail := func(err error) error { return &ParseError{Line: i + 1, Text: line, Err: err} }
		if cur == nil {
			name, ok := strings.CutPrefix(line, "*")
			if !ok {
				return fail(errors.New(`expected "*table" before rules`))
			}
			if builtinChains[name] == nil {
				return fail(fmt.Errorf("unknown table %q", name))
			}
			if old := r.table(name); old != nil && noflush {
				cur = old.clone()
			} else {
				// Without noflush the table starts empty but keeps the
				// policies of its built-in chains.
				cur = newTable(name)
				if old != nil {
					for _, cn := range builtinChains[name] {
						cur.chains[cn].policy = old.chains[cn].policy
					}
				}
			}
			curLine, family, declared = i+1, r.family, map[string]bool{}
			continue
		}
		if line == "COMMIT" {
			if err := r.validate(cur, lines); err != nil {
				return err
			}
			r.install(cur)
			r.family = family
			cur = nil
			continue
		}
		if strings.HasPrefix(line, "*") {
			return fail(fmt.Errorf("table %s has no COMMIT before the next table", cur.name))
		}
		if strings.HasPrefix(line, ":") {
			if err := declareChain(cur, line[1:], noflush, declared); err != nil {
				return fail(err)
			}
			continue
		}
		toks, err := xtables.Tokenize(line)
		if err != nil {
			return fail(err)
		}
		if err := r.command(cur, toks, i+1, &family); err != nil {
			return fail(err)
		}
	}
	if cur != nil {
		return &ParseError{Line: curLine, Text: "*" + cur.name, Err: fmt.Errorf("table %s has no COMMIT", cur.name)}
	}
	return nil
}

func declareChain(t *table, decl string, noflush bool, declared map[string]bool) error {
	f := strings.Fields(decl)
	if len(f) < 2 || len(f) > 3 {
		return errors.New(`chain line must be ":NAME POLICY [packets:bytes]"`)
	}
	name, policy := f[0], f[1]
	if c := t.chains[name]; c != nil && c.builtin {
		switch policy {
		case "-":
		case tAccept, tDrop:
			c.policy = policy
		default:
			return fmt.Errorf("invalid policy %q for built-in chain %s", policy, name)
		}
		return nil
	}
	if builtinOfAnyTable(name) {
		return fmt.Errorf("%s is not a built-in chain of table %s", name, t.name)
	}
	if policy != "-" {
		return fmt.Errorf("cannot set policy %q on user-defined chain %s", policy, name)
	}
	if err := checkChainName(name); err != nil {
		return err
	}
	if c := t.chains[name]; c != nil {
		if !noflush && declared[name] {
			return fmt.Errorf("chain %s declared twice", name)
		}
		// With --noflush, declaring an existing chain flushes it: the
		// way kube-proxy rewrites a chain in a partial sync.
		c.rules = nil
		declared[name] = true
		return nil
	}
	t.chains[name] = &chain{name: name}
	t.order = append(t.order, name)
	declared[name] = true
	return nil
}

func builtinOfAnyTable(name string) bool {
	for _, cs := range builtinChains {
		if slices.Contains(cs, name) {
			return true
		}
	}
	return false
}

// checkChainName refuses what iptables refuses: names too long for the
// kernel (28 characters) or that could be read as an option or a target.
func checkChainName(name string) error {
	switch {
	case name == "" || len(name) > 28:
		return fmt.Errorf("invalid chain name %q (1 to 28 characters)", name)
	case name[0] == '-' || name[0] == '!' || strings.ContainsAny(name, " \t\""):
		return fmt.Errorf("invalid chain name %q", name)
	case name == tAccept || name == tDrop || name == tReturn || name == tReject || name == tMark ||
		name == tDNAT || name == tMasquerade || knownTargets[name]:
		return fmt.Errorf("chain name %q is a target name", name)
	}
	return nil
}

// command runs one -A/-I/-R/-D/-F/-X/-N/-P/-Z line on the table.
func (r *Ruleset) command(t *table, toks []xtables.Token, line int, family *int) error {
	// "[packets:bytes] -A ..." is how iptables-save --counters writes rules.
	if len(toks) > 0 && strings.HasPrefix(toks[0].Text, "[") && strings.HasSuffix(toks[0].Text, "]") {
		toks = toks[1:]
	}
	if len(toks) == 0 {
		return errors.New("empty command")
	}
	cmd := toks[0].Text
	args := toks[1:]
	chainArg := func(optional bool) (*chain, error) {
		if len(args) == 0 {
			if optional {
				return nil, nil
			}
			return nil, fmt.Errorf("%s needs a chain", cmd)
		}
		name := args[0].Text
		args = args[1:]
		c := t.chains[name]
		if c == nil {
			return nil, fmt.Errorf("no chain %q in table %s", name, t.name)
		}
		return c, nil
	}
	number := func(max int) (int, bool, error) {
		if len(args) == 0 || args[0].Quoted {
			return 0, false, nil
		}
		n, err := strconv.Atoi(args[0].Text)
		if err != nil {
			return 0, false, nil
		}
		if n < 1 || n > max {
			return 0, true, fmt.Errorf("rule number %d out of range (1-%d)", n, max)
		}
		args = args[1:]
		return n, true, nil
	}
	parse := func(c *chain) ([]*rule, error) {
		rules, err := parseRule(args, family, func(name string) (bool, bool) {
			x := t.chains[name]
			return x != nil, x != nil && x.builtin
		})
		if err != nil {
			return nil, err
		}
		for _, ru := range rules {
			ru.line, ru.gen = line, r.gen
			if err := checkRuleInChain(t, c, ru); err != nil {
				return nil, err
			}
		}
		return rules, nil
	}
	switch cmd {
	case "-A", "--append":
		c, err := chainArg(false)
		if err != nil {
			return err
		}
		rules, err := parse(c)
		if err != nil {
			return err
		}
		c.rules = append(c.rules, rules...)
	case "-I", "--insert":
		c, err := chainArg(false)
		if err != nil {
			return err
		}
		n, given, err := number(len(c.rules) + 1)
		if err != nil {
			return err
		}
		if !given {
			n = 1
		}
		rules, err := parse(c)
		if err != nil {
			return err
		}
		c.rules = slices.Insert(c.rules, n-1, rules...)
	case "-R", "--replace":
		c, err := chainArg(false)
		if err != nil {
			return err
		}
		n, given, err := number(len(c.rules))
		if err != nil {
			return err
		}
		if !given {
			return errors.New("-R needs a rule number")
		}
		rules, err := parse(c)
		if err != nil {
			return err
		}
		if len(rules) != 1 {
			return errors.New("-R cannot replace with several rules (address lists)")
		}
		c.rules = slices.Clone(c.rules)
		c.rules[n-1] = rules[0]
	case "-D", "--delete":
		c, err := chainArg(false)
		if err != nil {
			return err
		}
		n, given, err := number(len(c.rules))
		if err != nil {
			return err
		}
		if given {
			if len(args) > 0 {
				return fmt.Errorf("unexpected %q after the rule number", args[0].Text)
			}
			c.rules = slices.Delete(slices.Clone(c.rules), n-1, n)
			return nil
		}
		rules, err := parse(c)
		if err != nil {
			return err
		}
		for _, del := range rules {
			want := del.String()
			i := slices.IndexFunc(c.rules, func(x *rule) bool { return x.String() == want })
			if i < 0 {
				return fmt.Errorf("no rule %q in chain %s", want, c.name)
			}
			c.rules = slices.Delete(slices.Clone(c.rules), i, i+1)
		}
	case "-F", "--flush":
		c, err := chainArg(true)
		if err != nil {
			return err
		}
		if c != nil {
			c.rules = nil
		} else {
			for _, x := range t.chains {
				x.rules = nil
			}
		}
	case "-X", "--delete-chain":
		c, err := chainArg(true)
		if err != nil {
			return err
		}
		var victims []*chain
		if c != nil {
			if c.builtin {
				return fmt.Errorf("cannot delete built-in chain %s", c.name)
			}
			victims = []*chain{c}
		} else {
			for _, n := range t.userChains() {
				victims = append(victims, t.chains[n])
			}
		}
		for _, v := range victims {
			// The kernel (and libiptc before it) refuses to delete a
			// chain that still has rules or that a rule jumps to;
			// kube-proxy declares (flushes) a stale chain and rewrites
			// its callers before the -X.
			if len(v.rules) > 0 {
				return fmt.Errorf("cannot delete chain %s: it still has %d rules", v.name, len(v.rules))
			}
			if from, ok := t.references(v.name, v.name); ok {
				return fmt.Errorf("cannot delete chain %s: a rule in chain %s still jumps to it", v.name, from)
			}
			delete(t.chains, v.name)
			t.order = slices.DeleteFunc(t.order, func(n string) bool { return n == v.name })
		}
	case "-N", "--new-chain":
		if len(args) != 1 {
			return errors.New("-N needs exactly one chain name")
		}
		name := args[0].Text
		if t.chains[name] != nil {
			return fmt.Errorf("chain %s already exists", name)
		}
		if err := checkChainName(name); err != nil {
			return err
		}
		if builtinOfAnyTable(name) {
			return fmt.Errorf("%s is not a built-in chain of table %s", name, t.name)
		}
		t.chains[name] = &chain{name: name}
		t.order = append(t.order, name)
		return nil
	case "-P", "--policy":
		c, err := chainArg(false)
		if err != nil {
			return err
		}
		if !c.builtin {
			return fmt.Errorf("cannot set a policy on user-defined chain %s", c.name)
		}
		if len(args) != 1 || (args[0].Text != tAccept && args[0].Text != tDrop) {
			return errors.New("-P needs ACCEPT or DROP")
		}
		c.policy = args[0].Text
		return nil
	case "-Z", "--zero":
		// Counters only.
		_, err := chainArg(true)
		return err
	default:
		return fmt.Errorf("unknown command %q", cmd)
	}
	return nil
}

// checkRuleInChain refuses what iptables refuses for a rule in a given
// table and built-in chain.
func checkRuleInChain(t *table, c *chain, ru *rule) error {
	switch ru.target.kind {
	case tDNAT, tMasquerade:
		if t.name != "nat" {
			return fmt.Errorf("target %s is only valid in the nat table", ru.target.kind)
		}
	case tReject:
		if t.name != "filter" {
			return errors.New("target REJECT is only valid in the filter table")
		}
	}
	if c.builtin {
		// iptables: "Can't use -i with OUTPUT" and the like; there is no
		// input device on output and postrouting, no output device on
		// prerouting and input.
		if ru.in.set && (c.name == "OUTPUT" || c.name == "POSTROUTING") {
			return fmt.Errorf("cannot use -i in chain %s", c.name)
		}
		if ru.out.set && (c.name == "PREROUTING" || c.name == "INPUT") {
			return fmt.Errorf("cannot use -o in chain %s", c.name)
		}
	}
	return nil
}

// Hooks a target may run on, as the kernel registers them.
var targetHooks = map[string][]string{
	tDNAT:       {"PREROUTING", "OUTPUT"},
	tMasquerade: {"POSTROUTING"},
	tReject:     {"INPUT", "FORWARD", "OUTPUT"},
}

// validate checks a table as the kernel checks it when the restore
// commits: following jumps and gotos from each built-in chain there is no
// loop, and each target is only reachable from hooks it supports. The
// error names the latest line of this input on the offending path (the
// rule itself, or the jump that made it reachable).
func (r *Ruleset) validate(t *table, lines []string) error {
	fail := func(path []*rule, format string, args ...any) error {
		err := fmt.Errorf(format, args...)
		for i := len(path) - 1; i >= 0; i-- {
			if ru := path[i]; ru.gen == r.gen {
				return &ParseError{Line: ru.line, Text: strings.TrimSpace(lines[ru.line-1]), Err: err}
			}
		}
		return &ParseError{Err: fmt.Errorf("%w (rules of an earlier restore)", err)}
	}
	const (
		white = iota
		gray
		black
	)
	for _, hook := range builtinChains[t.name] {
		color := map[string]int{}
		var visit func(c *chain, via []*rule) error
		visit = func(c *chain, via []*rule) error {
			color[c.name] = gray
			for _, ru := range c.rules {
				if hooks := targetHooks[ru.target.kind]; hooks != nil && !slices.Contains(hooks, hook) {
					return fail(append(via, ru), "target %s in chain %s is reached from hook %s; the kernel allows it only on %s",
						ru.target.kind, c.name, hook, strings.Join(hooks, ", "))
				}
				if ru.target.kind != tJump && ru.target.kind != tGoto {
					continue
				}
				next := t.chains[ru.target.chain]
				switch color[next.name] {
				case gray:
					return fail(append(via, ru), "chain %s jumps back to %s: the kernel refuses loops between chains", c.name, next.name)
				case white:
					if err := visit(next, append(via, ru)); err != nil {
						return err
					}
				}
			}
			color[c.name] = black
			return nil
		}
		if err := visit(t.chains[hook], nil); err != nil {
			return err
		}
	}
	return nil
}
