package restore

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/kproxy/kproxy/internal/kernel/xtables"
)

// command runs one command line (-A, -I, -R, -D, -F, -X, -N, -P, -Z).
func (r *run[S]) command(toks []xtables.Token) error {
	// "[packets:bytes] -A ..." is how iptables-save --counters writes rules.
	if len(toks) > 0 && strings.HasPrefix(toks[0].Text, "[") && strings.HasSuffix(toks[0].Text, "]") {
		toks = toks[1:]
	}
	if len(toks) == 0 {
		return errors.New("empty command")
	}
	for _, x := range toks {
		if !x.Quoted && (x.Text == "-t" || x.Text == "--table") {
			return errors.New("the -t option cannot be used in iptables-restore")
		}
	}
	c := &cmd[S]{run: r, t: r.cur, name: toks[0].Text, args: toks[1:]}
	switch c.name {
	case "-A", "--append":
		ch, err := c.chain(false)
		if err != nil {
			return err
		}
		rules, err := c.rules(ch, true)
		if err != nil {
			return err
		}
		ch.Rules = append(ch.Rules, rules...)
	case "-I", "--insert":
		ch, err := c.chain(false)
		if err != nil {
			return err
		}
		n, given := c.number()
		if !given {
			n = 1
		}
		if r.opts.SyntaxOnly {
			n = min(max(n, 1), len(ch.Rules)+1)
		}
		if n < 1 || n > len(ch.Rules)+1 {
			return fmt.Errorf("index of insertion %d too big for chain %s (%d rules)", n, ch.Name, len(ch.Rules))
		}
		rules, err := c.rules(ch, true)
		if err != nil {
			return err
		}
		ch.Rules = slices.Insert(ch.Rules, n-1, rules...)
	case "-R", "--replace":
		ch, err := c.chain(false)
		if err != nil {
			return err
		}
		n, given := c.number()
		if !given {
			return errors.New("-R needs a rule number")
		}
		if n < 1 || n > len(ch.Rules) {
			return fmt.Errorf("index of replacement %d too big for chain %s (%d rules)", n, ch.Name, len(ch.Rules))
		}
		rules, err := c.rules(ch, true)
		if err != nil {
			return err
		}
		if len(rules) != 1 {
			return errors.New("-R cannot replace a rule with several (address lists)")
		}
		ch.Rules[n-1] = rules[0]
	case "-D", "--delete":
		return c.delete()
	case "-F", "--flush":
		ch, err := c.chain(true)
		if err != nil {
			return err
		}
		if ch != nil {
			ch.Rules = nil
			return nil
		}
		for _, x := range c.t.chains {
			x.Rules = nil
		}
	case "-X", "--delete-chain":
		return c.deleteChain()
	case "-N", "--new-chain":
		if len(c.args) != 1 {
			return errors.New("-N needs exactly one chain name")
		}
		name := c.args[0].Text
		if c.t.chains[name] != nil {
			return fmt.Errorf("chain %s already exists", name)
		}
		if err := checkChainName(name); err != nil {
			return err
		}
		if builtinOfAnyTable(name) {
			return fmt.Errorf("%s is not a built-in chain of table %s", name, c.t.Name)
		}
		c.t.addChain(&Chain[S]{Name: name})
	case "-P", "--policy":
		ch, err := c.chain(false)
		if err != nil {
			return err
		}
		if !ch.Builtin {
			return fmt.Errorf("cannot set a policy on user-defined chain %s", ch.Name)
		}
		if len(c.args) != 1 || (c.args[0].Text != accept && c.args[0].Text != drop) {
			return fmt.Errorf("bad policy for chain %s: -P needs ACCEPT or DROP", ch.Name)
		}
		ch.Policy = c.args[0].Text
	case "-Z", "--zero":
		// Counters only.
		_, err := c.chain(true)
		return err
	default:
		return fmt.Errorf("unknown command %q", c.name)
	}
	return nil
}

// cmd is one command line: its name and the words after it, which the
// methods consume.
type cmd[S any] struct {
	*run[S]
	t    *Table[S]
	name string
	args []xtables.Token
}

// chain takes the chain argument. optional: none is fine (nil).
func (c *cmd[S]) chain(optional bool) (*Chain[S], error) {
	if len(c.args) == 0 {
		if optional {
			return nil, nil
		}
		return nil, fmt.Errorf("%s needs a chain", c.name)
	}
	name := c.args[0].Text
	c.args = c.args[1:]
	ch := c.t.chains[name]
	if ch == nil && c.opts.SyntaxOnly {
		if err := checkChainName(name); err != nil {
			return nil, err
		}
		ch = &Chain[S]{Name: name}
		c.t.addChain(ch)
	}
	if ch == nil {
		return nil, fmt.Errorf("chain '%s' does not exist in table %s", name, c.t.Name)
	}
	return ch, nil
}

// number takes a rule number if the next word is one (not quoted).
func (c *cmd[S]) number() (int, bool) {
	if len(c.args) == 0 || c.args[0].Quoted {
		return 0, false
	}
	n, err := strconv.Atoi(c.args[0].Text)
	if err != nil {
		return 0, false
	}
	c.args = c.args[1:]
	return n, true
}

// rules reads the rest of the line as a rule specification of chain ch:
// its target is resolved and checked (and, for a rule that is added,
// its table), the rest is the Dialect's.
func (c *cmd[S]) rules(ch *Chain[S], add bool) ([]Rule[S], error) {
	target, isGoto, err := c.target()
	if err != nil {
		return nil, err
	}
	if info := targets[target]; add && info != nil && info.table != "" && info.table != c.t.Name {
		return nil, fmt.Errorf("target %s is only valid in table %s, not %s", target, info.table, c.t.Name)
	}
	specs, err := c.d.Rule(c.t, ch, c.args)
	if err != nil {
		return nil, err
	}
	out := make([]Rule[S], len(specs))
	for i, s := range specs {
		out[i] = Rule[S]{Spec: s, Target: target, Goto: isGoto, Line: c.n, restore: c.ts.restores}
	}
	return out, nil
}

// target finds the rule's -j or -g and checks it as iptables does when
// it loads the target: a user chain of this table, a verdict or a known
// extension target; a goto needs a chain.
func (c *cmd[S]) target() (string, bool, error) {
	var name string
	var isGoto bool
	for i := 0; i < len(c.args); i++ {
		x := c.args[i]
		if x.Quoted {
			continue
		}
		switch x.Text {
		case "-j", "--jump", "-g", "--goto":
			if i+1 >= len(c.args) {
				return "", false, fmt.Errorf("%s needs a target", x.Text)
			}
			if name != "" {
				return "", false, errors.New("more than one target in a rule")
			}
			name, isGoto = c.args[i+1].Text, x.Text == "-g" || x.Text == "--goto"
			i++
		}
	}
	if name == "" {
		return "", false, nil
	}
	if ch := c.t.chains[name]; ch != nil {
		if ch.Builtin {
			verb := "jump to"
			if isGoto {
				verb = "goto"
			}
			return "", false, fmt.Errorf("cannot %s built-in chain %s", verb, name)
		}
		return name, isGoto, nil
	}
	if targets[name] == nil && !slices.Contains(verdicts, name) {
		if c.opts.SyntaxOnly && checkChainName(name) == nil {
			return name, isGoto, nil // taken for a chain, unresolved
		}
		return "", false, fmt.Errorf("couldn't load target `%s': no such chain in table %s, nor target", name, c.t.Name)
	}
	if isGoto {
		return "", false, fmt.Errorf("goto '%s' is not a chain", name)
	}
	return name, false, nil
}

// delete handles -D, by rule number or by rule.
func (c *cmd[S]) delete() error {
	ch, err := c.chain(false)
	if err != nil {
		return err
	}
	if n, given := c.number(); given {
		if len(c.args) > 0 {
			return fmt.Errorf("unexpected %q after the rule number", c.args[0].Text)
		}
		if n < 1 || n > len(ch.Rules) {
			return fmt.Errorf("index of deletion %d too big for chain %s (%d rules)", n, ch.Name, len(ch.Rules))
		}
		ch.Rules = slices.Delete(ch.Rules, n-1, n)
		return nil
	}
	rules, err := c.rules(ch, false)
	if err != nil {
		return err
	}
	for _, del := range rules {
		i := slices.IndexFunc(ch.Rules, func(x Rule[S]) bool { return x.Target == del.Target && c.d.Same(x.Spec, del.Spec) })
		if i < 0 && c.opts.SyntaxOnly {
			continue
		}
		if i < 0 {
			//lint:ignore ST1005 iptables' own message, which callers match
			return fmt.Errorf("Bad rule (does a matching rule exist in that chain?): no rule %q in chain %s", c.d.Text(del.Spec), ch.Name)
		}
		ch.Rules = slices.Delete(ch.Rules, i, i+1)
	}
	return nil
}

// deleteChain handles -X: one user chain, or all of them.
func (c *cmd[S]) deleteChain() error {
	ch, err := c.chain(true)
	if err != nil {
		return err
	}
	var victims []*Chain[S]
	switch {
	case ch == nil:
		for _, n := range c.t.userChains() {
			victims = append(victims, c.t.chains[n])
		}
	case ch.Builtin:
		return fmt.Errorf("cannot delete built-in chain %s", ch.Name)
	default:
		victims = []*Chain[S]{ch}
	}
	if !c.opts.SyntaxOnly {
		// The kernel (and libiptc before it) refuses to delete a chain
		// that still has rules or that a rule jumps to; kube-proxy
		// declares (flushes) a stale chain and rewrites its callers
		// before the -X.
		for _, v := range victims {
			if len(v.Rules) > 0 {
				return fmt.Errorf("cannot delete chain %s: it still has %d rules (Directory not empty)", v.Name, len(v.Rules))
			}
		}
		for _, v := range victims {
			if from, ok := c.t.referrer(v.Name); ok {
				return fmt.Errorf("cannot delete chain %s: a rule in chain %s still jumps to it (Too many links)", v.Name, from)
			}
		}
	}
	for _, v := range victims {
		delete(c.t.chains, v.Name)
		c.t.order = slices.DeleteFunc(c.t.order, func(n string) bool { return n == v.Name })
	}
	return nil
}

// referrer names the first chain (in creation order) with a rule whose
// target is the chain name.
func (t *Table[S]) referrer(name string) (string, bool) {
	for _, cn := range t.order {
		for _, r := range t.chains[cn].Rules {
			if r.Target == name {
				return cn, true
			}
		}
	}
	return "", false
}
