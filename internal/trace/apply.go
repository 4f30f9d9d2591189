package trace

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/kproxy/kproxy/internal/kernel/nft"
	"github.com/kproxy/kproxy/internal/kernel/nft/nftstate"
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
	for _, t := range work.state.Tables {
		t.Gen = work.gen
	}
	sets := func(f nft.Family, table, name string) *nft.Set {
		if t := work.state.Table(f, table); t != nil && t.Sets[name] != nil {
			return &t.Sets[name].Def
		}
		return nil
	}
	if err := nft.Read(text, sets, work.apply); err != nil {
		return err
	}
	lines := strings.Split(text, "\n")
	for _, t := range work.state.Tables {
		if err := validate(t); err != nil {
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
	t := r.state.Table(p.Family, p.Table)
	if p.Op.Table != nil {
		return r.tableOp(p, t)
	}
	if t == nil {
		return fmt.Errorf("no table %s %s", p.Family, p.Table)
	}
	switch op := &p.Op; {
	case op.Chain != nil:
		return chainOp(t, p)
	case op.Set != nil:
		return setOp(t, p)
	case op.Element != nil:
		return elementOp(t, p)
	default:
		return ruleOp(t, p)
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
			t = nftstate.NewTable(f, name)
			t.Gen = r.gen
			r.state.Tables = append(r.state.Tables, t)
		}
		if c := p.Op.Table.Comment; c != "" {
			t.Comment = c
		}
		return nil
	case nft.OpFlush:
		if t == nil {
			return fmt.Errorf("no table %s %s", f, name)
		}
		// Like nft: flushing a table removes the rules of all its chains,
		// and keeps chains, sets and set elements.
		for _, ch := range t.Chains {
			ch.Rules = nil
		}
		return nil
	default: // delete
		if t == nil {
			return fmt.Errorf("no table %s %s", f, name)
		}
		r.state.Delete(f, name)
		return nil
	}
}

func chainOp(t *table, p *nft.Parsed) error {
	def := p.Op.Chain
	name := def.Name
	ch := t.Chains[name]
	switch p.Op.Kind {
	case nft.OpAdd:
		if ch != nil && p.Create {
			return fmt.Errorf("chain %q exists", name)
		}
		spec := &chain{Def: *def, Policy: nft.Accept, Line: p.Line}
		if p.Policy != "" {
			spec.Policy = p.Policy
		}
		if ch == nil {
			t.AddChain(spec)
			return nil
		}
		// Re-adding an existing chain: the kernel refuses to turn a regular
		// chain into a base chain or to move a base chain to another hook;
		// a policy or comment may change.
		if spec.Base() && (spec.Def.Hook != ch.Def.Hook || spec.Def.Type != ch.Def.Type || spec.Def.Priority != ch.Def.Priority) {
			return fmt.Errorf("chain %q exists with a different type, hook or priority", name)
		}
		if spec.Base() {
			ch.Policy = spec.Policy
		}
		if spec.Def.Comment != "" {
			ch.Def.Comment = spec.Def.Comment
		}
		return nil
	case nft.OpFlush:
		if ch == nil {
			return fmt.Errorf("no chain %q", name)
		}
		ch.Rules = nil
		return nil
	default: // delete
		if ch == nil {
			return fmt.Errorf("no chain %q", name)
		}
		// The kernel deletes the chain's own rules with it, but refuses
		// while anything else still jumps to it (EBUSY): that is why
		// stale chains are flushed, unreferenced, then deleted.
		if who := chainUsers(t, name); who != "" {
			return fmt.Errorf("chain %q is still referenced by %s", name, who)
		}
		t.DeleteChain(name)
		return nil
	}
}

func setOp(t *table, p *nft.Parsed) error {
	name := p.Op.Set.Name
	s := t.Sets[name]
	switch p.Op.Kind {
	case nft.OpAdd:
		if s != nil && p.Create {
			return fmt.Errorf("set %q exists", name)
		}
		spec := nftstate.NewSet(*p.Op.Set, t.Family)
		spec.Line = p.Line
		if s == nil {
			t.AddSet(spec)
			return nil
		}
		if !slices.Equal(s.Def.Key, spec.Def.Key) || s.Def.Data != spec.Def.Data || s.Def.Endpoints != spec.Def.Endpoints || s.Def.ByService != spec.Def.ByService || s.Def.Interval != spec.Def.Interval {
			return fmt.Errorf("set %q exists with a different type or flags", name)
		}
		return nil
	case nft.OpFlush:
		// "flush set" and "flush map" both work on either (the nft
		// package names the kind from the object it was given).
		if s == nil {
			return fmt.Errorf("no set or map %q", name)
		}
		s.Flush()
		return nil
	default: // delete
		if s == nil {
			return fmt.Errorf("no set or map %q", name)
		}
		if who := setUsers(t, name); who != "" {
			return fmt.Errorf("set %q is still referenced by %s", name, who)
		}
		t.DeleteSet(name)
		return nil
	}
}

func elementOp(t *table, p *nft.Parsed) error {
	ne := p.Op.Element
	name := ne.Set
	s := t.Sets[name]
	if s == nil {
		return fmt.Errorf("no set or map %q", name)
	}
	e := &element{Element: *ne, Line: p.Line, Gen: t.Gen}
	switch {
	case p.Op.Kind == nft.OpAdd && !p.Create:
		s.Add(e)
	case p.Op.Kind == nft.OpAdd:
		if s.Get(e.ID()) != nil {
			return fmt.Errorf("element %s exists in %q", e.ID(), name)
		}
		s.Add(e)
	default:
		if !s.Remove(e.ID()) {
			return fmt.Errorf("no element %s in %q", e.ID(), name)
		}
	}
	return nil
}

func ruleOp(t *table, p *nft.Parsed) error {
	r := p.Op.Rule
	name := r.Chain
	ch := t.Chains[name]
	if ch == nil {
		return fmt.Errorf("no chain %q", name)
	}
	if p.ByHandle {
		for i, ru := range ch.Rules {
			if ru.Handle == p.Handle {
				ch.Rules = append(ch.Rules[:i:i], ch.Rules[i+1:]...)
				return nil
			}
		}
		return fmt.Errorf("no rule with handle %d in chain %q", p.Handle, name)
	}
	stmts, comment := r.Stmts, r.Comment
	switch p.Op.Kind {
	case nft.OpAdd:
		t.NewRule(*r, false, p.Line, t.Gen)
	case nft.OpInsert:
		t.NewRule(*r, true, p.Line, t.Gen)
	case nft.OpDelete:
		// text.go prints a rule deletion as the rule itself (the kernel
		// wants a handle): remove the first rule that reads the same.
		want := ruleText(t.Family, stmts, comment)
		for i, ru := range ch.Rules {
			if ruleText(t.Family, ru.Stmts, ru.Comment) == want {
				ch.Rules = append(ch.Rules[:i:i], ch.Rules[i+1:]...)
				return nil
			}
		}
		return fmt.Errorf("no such rule in chain %q", name)
	default:
		return errors.New("flush rule is not an operation (flush the chain)")
	}
	return nil
}
