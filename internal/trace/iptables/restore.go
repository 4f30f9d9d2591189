package iptables

import (
	"errors"
	"fmt"

	"github.com/kproxy/kproxy/internal/kernel/xtables"
	"github.com/kproxy/kproxy/internal/kernel/xtables/restore"
	"github.com/kproxy/kproxy/internal/trace"
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
// `iptables-restore --noflush` when noflush is true) would. It is package
// restore's simulation, the one xtablestest's fake runs too:
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
// numbers in errors count from the start of data; a table refused at
// COMMIT names the latest line of this input on the offending path (the
// rule itself, or the jump that made it reachable).
func (r *Ruleset) Apply(data []byte, noflush bool) error {
	err := r.tables.Restore(data, restore.Options{NoFlush: noflush, PerTable: true}, &dialect{r: r})
	var e *restore.Error
	switch {
	case err == nil:
		return nil
	case !errors.As(err, &e):
		return err
	case e.AtCommit && e.RuleLine == 0:
		return &trace.ParseError{Err: fmt.Errorf("%w (rules of an earlier restore)", e.Err)}
	case e.AtCommit:
		return &trace.ParseError{Line: e.RuleLine, Text: e.RuleText, Err: e.Err}
	}
	return &trace.ParseError{Line: e.Line, Text: e.Text, Err: e.Err}
}

// dialect is the tracer's restore.Dialect: a rule is parsed into its
// header fields, matches and target, and the ruleset's family is fixed
// by the addresses of the rules committed.
type dialect struct {
	r      *Ruleset
	family int // the family of the table being restored
}

func (d *dialect) Begin(string)  { d.family = d.r.family }
func (d *dialect) Commit(string) { d.r.family = d.family }

func (d *dialect) Rule(t *table, c *chain, words []xtables.Token) ([]*rule, error) {
	rules, err := parseRule(words, &d.family, func(name string) bool { return t.Chain(name) != nil })
	if err != nil {
		return nil, err
	}
	for _, ru := range rules {
		if err := checkRuleInChain(c, ru); err != nil {
			return nil, err
		}
	}
	return rules, nil
}

// Same: -D deletes the rule iptables-save prints alike.
func (d *dialect) Same(a, b *rule) bool { return a.String() == b.String() }

func (d *dialect) Text(ru *rule) string { return ru.String() }

// checkRuleInChain refuses what iptables refuses for a rule in a given
// built-in chain: "Can't use -i with OUTPUT" and the like; there is no
// input device on output and postrouting, no output device on prerouting
// and input.
func checkRuleInChain(c *chain, ru *rule) error {
	if !c.Builtin {
		return nil
	}
	if ru.in.set && (c.Name == "OUTPUT" || c.Name == "POSTROUTING") {
		return fmt.Errorf("cannot use -i in chain %s", c.Name)
	}
	if ru.out.set && (c.Name == "PREROUTING" || c.Name == "INPUT") {
		return fmt.Errorf("cannot use -o in chain %s", c.Name)
	}
	return nil
}
