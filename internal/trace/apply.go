package trace

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/kproxy/kproxy/internal/kernel/nft"
)

// ParseError is a problem in the ruleset text, or an operation the kernel
// would refuse (a rule in a missing chain, deleting a referenced chain...).
type ParseError = nft.ParseError

// ParseNFT parses nftables text and returns the resulting state. The text
// is a sequence of operations in the `nft -f` form the nft package prints
// (one "add|insert|create|flush|delete table|chain|set|map|element|rule ..."
// per line), typically a full sync followed by partial syncs; operations
// apply in order. Tables in the nested form `nft list table` prints
// ("table ip kube-proxy { ... }") are accepted too. Only the ip and ip6
// families and the statements kproxy writes are understood; anything else
// is an error naming the line (see nft.Read, which reads it).
func ParseNFT(text string) (*Ruleset, error) {
	r := &Ruleset{}
	if err := r.Apply(text); err != nil {
		return nil, err
	}
	return r, nil
}

// Apply applies more operations (same syntax as ParseNFT) to the ruleset.
// Like an nft transaction it is all or nothing: on error the ruleset is
// unchanged. Line numbers in errors count from the start of text.
func (r *Ruleset) Apply(text string) error {
	work := r.clone()
	work.gen++
	for _, t := range work.tables {
		t.gen = work.gen
	}
	sets := func(f nft.Family, table, name string) *nft.Set {
		if t := work.table(f, table); t != nil && t.sets[name] != nil {
			return &t.sets[name].def
		}
		return nil
	}
	if err := nft.Read(text, sets, work.apply); err != nil {
		return err
	}
	lines := strings.Split(text, "\n")
	for _, t := range work.tables {
		if err := t.validate(); err != nil {
			if err.Line > 0 {
				err.Text = strings.TrimSpace(lines[err.Line-1])
			}
			return err
		}
	}
	*r = *work
	return nil
}

// apply applies one operation.
func (r *Ruleset) apply(p *nft.Parsed) error {
	t := r.table(p.Family, p.Table)
	if p.Op.Table != nil {
		return r.tableOp(p, t)
	}
	if t == nil {
		return fmt.Errorf("no table %s %s", p.Family, p.Table)
	}
	switch op := &p.Op; {
	case op.Chain != nil:
		return t.chainOp(p)
	case op.Set != nil:
		return t.setOp(p)
	case op.Element != nil:
		return t.elementOp(p)
	default:
		return t.ruleOp(p)
	}
}

func (r *Ruleset) tableOp(p *nft.Parsed, t *table) error {
	f, name := p.Family, p.Table
	switch p.Op.Kind {
	case nft.OpAdd:
		if t != nil && p.Create {
			return fmt.Errorf("table %s %s exists", f, name)
		}
		if t == nil {
			t = newTable(f, name)
			t.gen = r.gen
			r.tables = append(r.tables, t)
		}
		if c := p.Op.Table.Comment; c != "" {
			t.comment = c
		}
		return nil
	case nft.OpFlush:
		if t == nil {
			return fmt.Errorf("no table %s %s", f, name)
		}
		// Like nft: flushing a table removes the rules of all its chains,
		// and keeps chains, sets and set elements.
		for _, ch := range t.chains {
			ch.rules = nil
		}
		return nil
	default: // delete
		if t == nil {
			return fmt.Errorf("no table %s %s", f, name)
		}
		for i, x := range r.tables {
			if x == t {
				r.tables = append(r.tables[:i:i], r.tables[i+1:]...)
				break
			}
		}
		return nil
	}
}

func (t *table) chainOp(p *nft.Parsed) error {
	def := p.Op.Chain
	name := def.Name
	ch := t.chains[name]
	switch p.Op.Kind {
	case nft.OpAdd:
		if ch != nil && p.Create {
			return fmt.Errorf("chain %q exists", name)
		}
		spec := &chain{def: *def, policy: nft.Accept, line: p.Line}
		if p.Policy != "" {
			spec.policy = p.Policy
		}
		if ch == nil {
			t.chains[name] = spec
			t.order = append(t.order, name)
			return nil
		}
		// Re-adding an existing chain: the kernel refuses to turn a regular
		// chain into a base chain or to move a base chain to another hook;
		// a policy or comment may change.
		if spec.base() && (spec.def.Hook != ch.def.Hook || spec.def.Type != ch.def.Type || spec.def.Priority != ch.def.Priority) {
			return fmt.Errorf("chain %q exists with a different type, hook or priority", name)
		}
		if spec.base() {
			ch.policy = spec.policy
		}
		if spec.def.Comment != "" {
			ch.def.Comment = spec.def.Comment
		}
		return nil
	case nft.OpFlush:
		if ch == nil {
			return fmt.Errorf("no chain %q", name)
		}
		ch.rules = nil
		return nil
	default: // delete
		if ch == nil {
			return fmt.Errorf("no chain %q", name)
		}
		// The kernel deletes the chain's own rules with it, but refuses
		// while anything else still jumps to it (EBUSY): that is why
		// stale chains are flushed, unreferenced, then deleted.
		if who := t.chainUsers(name); who != "" {
			return fmt.Errorf("chain %q is still referenced by %s", name, who)
		}
		delete(t.chains, name)
		for i, n := range t.order {
			if n == name {
				t.order = append(t.order[:i:i], t.order[i+1:]...)
				break
			}
		}
		return nil
	}
}

func (t *table) setOp(p *nft.Parsed) error {
	name := p.Op.Set.Name
	s := t.sets[name]
	switch p.Op.Kind {
	case nft.OpAdd:
		if s != nil && p.Create {
			return fmt.Errorf("set %q exists", name)
		}
		spec := &set{def: *p.Op.Set, index: map[string]int{}, line: p.Line, family: t.family}
		if s == nil {
			t.sets[name] = spec
			t.sorder = append(t.sorder, name)
			return nil
		}
		if !slices.Equal(s.def.Key, spec.def.Key) || s.def.Data != spec.def.Data || s.def.Endpoints != spec.def.Endpoints || s.def.ByService != spec.def.ByService || s.def.Interval != spec.def.Interval {
			return fmt.Errorf("set %q exists with a different type or flags", name)
		}
		return nil
	case nft.OpFlush:
		// "flush set" and "flush map" both work on either (the nft
		// package names the kind from the object it was given).
		if s == nil {
			return fmt.Errorf("no set or map %q", name)
		}
		s.flush()
		return nil
	default: // delete
		if s == nil {
			return fmt.Errorf("no set or map %q", name)
		}
		if who := t.setUsers(name); who != "" {
			return fmt.Errorf("set %q is still referenced by %s", name, who)
		}
		delete(t.sets, name)
		for i, n := range t.sorder {
			if n == name {
				t.sorder = append(t.sorder[:i:i], t.sorder[i+1:]...)
				break
			}
		}
		return nil
	}
}

func (t *table) elementOp(p *nft.Parsed) error {
	ne := p.Op.Element
	name := ne.Set
	s := t.sets[name]
	if s == nil {
		return fmt.Errorf("no set or map %q", name)
	}
	e := &element{key: ne.Key, index: ne.Index, to: ne.To, verdict: ne.Verdict, comment: ne.Comment, line: p.Line, gen: t.gen}
	switch {
	case p.Op.Kind == nft.OpAdd && !p.Create:
		s.add(e)
	case p.Op.Kind == nft.OpAdd:
		if _, ok := s.index[e.id()]; ok {
			return fmt.Errorf("element %s exists in %q", e.id(), name)
		}
		s.add(e)
	default:
		if !s.remove(e.id()) {
			return fmt.Errorf("no element %s in %q", e.id(), name)
		}
	}
	return nil
}

func (t *table) ruleOp(p *nft.Parsed) error {
	r := p.Op.Rule
	name := r.Chain
	ch := t.chains[name]
	if ch == nil {
		return fmt.Errorf("no chain %q", name)
	}
	if p.ByHandle {
		for i, ru := range ch.rules {
			if ru.handle == p.Handle {
				ch.rules = append(ch.rules[:i:i], ch.rules[i+1:]...)
				return nil
			}
		}
		return fmt.Errorf("no rule with handle %d in chain %q", p.Handle, name)
	}
	stmts, comment := r.Stmts, r.Comment
	switch p.Op.Kind {
	case nft.OpAdd:
		t.handle++
		ch.rules = append(ch.rules, &rule{handle: t.handle, stmts: stmts, comment: comment, line: p.Line, gen: t.gen})
	case nft.OpInsert:
		t.handle++
		ch.rules = append([]*rule{{handle: t.handle, stmts: stmts, comment: comment, line: p.Line, gen: t.gen}}, ch.rules...)
	case nft.OpDelete:
		// text.go prints a rule deletion as the rule itself (the kernel
		// wants a handle): remove the first rule that reads the same.
		want := ruleText(t.family, stmts, comment)
		for i, ru := range ch.rules {
			if ruleText(t.family, ru.stmts, ru.comment) == want {
				ch.rules = append(ch.rules[:i:i], ch.rules[i+1:]...)
				return nil
			}
		}
		return fmt.Errorf("no such rule in chain %q", name)
	default:
		return errors.New("flush rule is not an operation (flush the chain)")
	}
	return nil
}
