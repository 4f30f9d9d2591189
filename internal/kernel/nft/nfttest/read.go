package nfttest

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/kproxy/kproxy/internal/kernel/nft"
	"github.com/kproxy/kproxy/internal/kernel/nft/nftstate"
)

// TableExists reports whether the table exists.
func (f *Fake) TableExists(ctx context.Context, family nft.Family, name string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.state.Table(family, name) != nil, nil
}

// ListTables returns the names of the family's tables, sorted.
func (f *Fake) ListTables(ctx context.Context, family nft.Family) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var names []string
	for _, t := range f.state.Tables {
		if t.Family == family {
			names = append(names, t.Name)
		}
	}
	slices.Sort(names)
	return names, nil
}

// ListChains returns the table's chain names, sorted.
func (f *Fake) ListChains(ctx context.Context, family nft.Family, name string) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := f.state.Table(family, name)
	if t == nil {
		return nil, fmt.Errorf("nft: table %s %s: %w", family, name, nft.ErrNotFound)
	}
	return slices.Sorted(maps.Keys(t.Chains)), nil
}

// ListSets returns the table's set and map names, sorted.
func (f *Fake) ListSets(ctx context.Context, family nft.Family, name string) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := f.state.Table(family, name)
	if t == nil {
		return nil, fmt.Errorf("nft: table %s %s: %w", family, name, nft.ErrNotFound)
	}
	return slices.Sorted(maps.Keys(t.Sets)), nil
}

// DeleteTable removes a table; a missing table is not an error.
func (f *Fake) DeleteTable(ctx context.Context, family nft.Family, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.state.Delete(family, name)
	return nil
}

// Chain returns a copy of a chain's definition and rules, or nil.
func (f *Fake) Chain(family nft.Family, tbl, name string) (*nft.Chain, []nft.Rule) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := f.state.Table(family, tbl)
	if t == nil || t.Chains[name] == nil {
		return nil, nil
	}
	c := t.Chains[name]
	def := c.Def
	rules := make([]nft.Rule, len(c.Rules))
	for i, r := range c.Rules {
		rules[i] = r.Rule
	}
	return &def, rules
}

// Set returns a copy of a set's definition and its elements in the
// canonical order, or nil.
func (f *Fake) Set(family nft.Family, tbl, name string) (*nft.Set, []nft.Element) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := f.state.Table(family, tbl)
	if t == nil || t.Sets[name] == nil {
		return nil, nil
	}
	s := t.Sets[name]
	def := s.Def
	return &def, sortedElements(s)
}

func sortedElements(s *set) []nft.Element {
	out := make([]nft.Element, 0, len(s.Elems))
	for _, e := range s.Elems {
		out = append(out, e.Elem(s.Def.Name))
	}
	slices.SortFunc(out, func(a, b nft.Element) int {
		return cmp.Or(compareKeys(a.Key, b.Key), cmp.Compare(a.Index, b.Index))
	})
	return out
}

func compareValues(a, b nft.Value) int {
	addr := func(v nft.Value) netip.Addr {
		if v.Addr.IsValid() {
			return v.Addr
		}
		return v.Prefix.Addr()
	}
	if c := addr(a).Compare(addr(b)); c != 0 {
		return c
	}
	bits := func(v nft.Value) int {
		if v.Prefix.IsValid() {
			return v.Prefix.Bits()
		}
		return -1
	}
	return cmp.Or(cmp.Compare(bits(a), bits(b)), cmp.Compare(a.Proto, b.Proto), cmp.Compare(a.Port, b.Port))
}

func compareKeys(a, b []nft.Value) int {
	for i := range min(len(a), len(b)) {
		if c := compareValues(a[i], b[i]); c != 0 {
			return c
		}
	}
	return cmp.Compare(len(a), len(b))
}

// Dump returns the whole state as `nft -f` text in a canonical order:
// per table (ip before ip6, then by name) the table, its chains, its sets
// and maps (each sorted by name), the rules of each chain in order, and
// the elements of each set sorted by key. Feeding it to nft -f or to
// Load of a new Fake reproduces the state.
func (f *Fake) Dump() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	tables := slices.Clone(f.state.Tables)
	slices.SortFunc(tables, func(a, b *table) int { return cmp.Or(cmp.Compare(a.Family, b.Family), cmp.Compare(a.Name, b.Name)) })
	var b strings.Builder
	for _, t := range tables {
		b.WriteString(dumpTable(t).String())
	}
	return b.String()
}

// DumpTable returns one table as `nft -f` text (see Dump), or "".
func (f *Fake) DumpTable(family nft.Family, name string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := f.state.Table(family, name)
	if t == nil {
		return ""
	}
	return dumpTable(t).String()
}

func dumpTable(t *table) *nft.Transaction {
	tx := nft.NewTransaction(t.Family, t.Name)
	tx.Add(&nft.Table{Family: t.Family, Name: t.Name, Comment: t.Comment})
	chains := slices.Sorted(maps.Keys(t.Chains))
	for _, n := range chains {
		def := t.Chains[n].Def
		tx.Add(&def)
	}
	sets := slices.Sorted(maps.Keys(t.Sets))
	for _, n := range sets {
		def := t.Sets[n].Def
		tx.Add(&def)
	}
	for _, n := range chains {
		for _, r := range t.Chains[n].Rules {
			rule := r.Rule
			tx.Add(&rule)
		}
	}
	for _, n := range sets {
		for _, e := range sortedElements(t.Sets[n]) {
			tx.Add(&e)
		}
	}
	return tx
}

// Load applies text in the form Dump writes (see nft.Parse), one
// transaction per family, and records them like any Apply.
func (f *Fake) Load(text string) error {
	txs, err := nft.Parse(text)
	if err != nil {
		return err
	}
	for _, tx := range txs {
		if err := f.Apply(context.Background(), tx); err != nil {
			return err
		}
	}
	return nil
}

// State returns a copy of the fake's state, the tables of every family:
// nftables.Of(f.State()) of internal/trace/nftables traces packets through what the fake holds.
func (f *Fake) State() *nftstate.State {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.state.Clone()
}
