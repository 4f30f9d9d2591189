// Package nftstate is kproxy's one in-memory nf_tables: the tables,
// chains, rules, sets and elements a sequence of transactions leaves,
// held as the nft package's objects, and the one applier of nft
// operations to them (Txn: apply.go, applyrule.go, applyset.go), which
// refuses what the kernel refuses. nfttest.Fake applies transactions
// with it in the Netlink dialect (errnos, operation indexes), the tracer
// applies nft text in the File dialect (line numbers); trace walks
// packets through a State, whichever of the two built it.
//
// Rules and elements are never modified in place once stored, so a Clone
// shares them.
package nftstate

import (
	"maps"
	"net/netip"
	"slices"

	"github.com/kproxy/kproxy/internal/kernel/nft"
)

// State is the tables of every family, in creation order.
type State struct {
	Tables []*Table
}

// Table returns the table, or nil.
func (s *State) Table(f nft.Family, name string) *Table {
	for _, t := range s.Tables {
		if t.Family == f && t.Name == name {
			return t
		}
	}
	return nil
}

// Put stores t in place of the table of its family and name, or last.
func (s *State) Put(t *Table) {
	for i, x := range s.Tables {
		if x.Family == t.Family && x.Name == t.Name {
			s.Tables[i] = t
			return
		}
	}
	s.Tables = append(s.Tables, t)
}

// Delete removes a table; a missing one is not an error.
func (s *State) Delete(f nft.Family, name string) {
	for i, x := range s.Tables {
		if x.Family == f && x.Name == name {
			s.Tables = append(s.Tables[:i:i], s.Tables[i+1:]...)
			return
		}
	}
}

// Clone copies the state deeply enough that changes to the copy leave s
// as it is: tables, chains and sets are copied, rules and elements shared.
func (s *State) Clone() *State {
	n := &State{Tables: make([]*Table, len(s.Tables))}
	for i, t := range s.Tables {
		n.Tables[i] = t.Clone()
	}
	return n
}

// Table is one table.
type Table struct {
	Family  nft.Family
	Name    string
	Comment string
	Chains  map[string]*Chain
	// ChainOrder is the chain names in creation order.
	ChainOrder []string
	Sets       map[string]*Set
	// SetOrder is the set and map names in creation order.
	SetOrder []string
	// Handle is the last rule handle given out.
	Handle int
}

// NewTable returns an empty table.
func NewTable(f nft.Family, name string) *Table {
	return &Table{Family: f, Name: name, Chains: map[string]*Chain{}, Sets: map[string]*Set{}}
}

// Clone copies the table, its chains and sets; rules and elements are
// shared.
func (t *Table) Clone() *Table {
	n := t.cloneSharingSets()
	for k, s := range t.Sets {
		n.Sets[k] = s.clone()
	}
	return n
}

// cloneSharingSets copies the table and its chains; its sets are the
// same, for a Txn, which copies a set before it changes it (Txn.ownSet):
// a transaction of a few elements then copies the sets it changes, not
// every set of the table (~20k elements a shard at 10k services).
func (t *Table) cloneSharingSets() *Table {
	n := *t
	n.Chains = make(map[string]*Chain, len(t.Chains))
	for k, c := range t.Chains {
		nc := *c
		nc.Rules = slices.Clone(c.Rules)
		n.Chains[k] = &nc
	}
	n.ChainOrder = slices.Clone(t.ChainOrder)
	n.Sets = maps.Clone(t.Sets)
	if n.Sets == nil {
		n.Sets = map[string]*Set{}
	}
	n.SetOrder = slices.Clone(t.SetOrder)
	return &n
}

// clone copies the set; its elements are shared.
func (s *Set) clone() *Set {
	ns := *s
	ns.Elems = slices.Clone(s.Elems)
	ns.index = maps.Clone(s.index)
	if ns.index == nil {
		ns.index = map[string]int{}
	}
	return &ns
}

// AddChain stores a new chain (last in ChainOrder).
func (t *Table) AddChain(c *Chain) {
	t.Chains[c.Def.Name] = c
	t.ChainOrder = append(t.ChainOrder, c.Def.Name)
}

// DeleteChain removes a chain and its rules.
func (t *Table) DeleteChain(name string) {
	delete(t.Chains, name)
	if i := slices.Index(t.ChainOrder, name); i >= 0 {
		t.ChainOrder = append(t.ChainOrder[:i:i], t.ChainOrder[i+1:]...)
	}
}

// AddSet stores a new set or map (last in SetOrder).
func (t *Table) AddSet(s *Set) {
	if s.index == nil {
		s.index = map[string]int{}
	}
	t.Sets[s.Def.Name] = s
	t.SetOrder = append(t.SetOrder, s.Def.Name)
}

// DeleteSet removes a set and its elements.
func (t *Table) DeleteSet(name string) {
	delete(t.Sets, name)
	if i := slices.Index(t.SetOrder, name); i >= 0 {
		t.SetOrder = append(t.SetOrder[:i:i], t.SetOrder[i+1:]...)
	}
}

// NewRule stores a rule with the next handle, last in its chain or
// (insert) first; the chain must exist.
func (t *Table) NewRule(r nft.Rule, insert bool, line, gen int) *Rule {
	t.Handle++
	e := &Rule{Rule: r, Handle: t.Handle, Line: line, Gen: gen}
	c := t.Chains[r.Chain]
	if insert {
		c.Rules = append([]*Rule{e}, c.Rules...)
	} else {
		c.Rules = append(c.Rules, e)
	}
	return e
}

// Chain is a chain and its rules in order.
type Chain struct {
	Def nft.Chain
	// Policy of a base chain: Accept (the kernel's default) or Drop; ""
	// reads as Accept.
	Policy nft.VerdictKind
	Rules  []*Rule
	// Line is the tracer's line of the chain's declaration.
	Line int
}

// Base reports whether the chain is a base chain.
func (c *Chain) Base() bool { return c.Def.Hook != "" }

// Rule is a stored rule.
type Rule struct {
	nft.Rule
	Handle int
	// Line and Gen are where the tracer read the rule: the line and the
	// text (see State.Begin).
	Line, Gen int
}

// Set is a set or map and its elements, in the order they were added.
type Set struct {
	Def nft.Set
	// Family is the table's (endpoint map elements hold addresses).
	Family nft.Family
	Elems  []*Element
	index  map[string]int // Element.ID → position in Elems
	// Line is the tracer's line of the set's declaration.
	Line int
}

// NewSet returns an empty set of a table of family f.
func NewSet(def nft.Set, f nft.Family) *Set {
	return &Set{Def: def, Family: f, index: map[string]int{}}
}

// Element is a stored element. Its key, an endpoint map element's index
// and data, and its comment are packed (see elemkey.go): Key, Index, To,
// Comment and Elem unpack them. A stored element is 32 bytes and that
// string.
type Element struct {
	// key is the key as added, packed, with the index and data of an
	// endpoint map element and the comment. Its first idLen bytes are
	// the element's identity (ID), or with idLen 0 the identity is
	// packed afresh when asked for (the key has a full-length prefix:
	// one element with its address).
	key     string
	Verdict *nft.Verdict
	idLen   uint8
}

// NewElement is e as a set stores it (e.Set is not kept; the
// verdict is shared with e).
func NewElement(e *nft.Element) *Element {
	endpoint := e.To.IsValid()
	b := appendKey(make([]byte, 0, 32), e.Key, endpoint, e.Index, false)
	id := len(b)
	if endpoint {
		b = appendTo(b, e.To)
	}
	b = appendComment(b, e.Comment)
	ne := &Element{key: string(b), Verdict: e.Verdict}
	fullPrefix := slices.ContainsFunc(e.Key, func(v nft.Value) bool { return v.Prefix.IsValid() && v.Prefix.IsSingleIP() })
	if !fullPrefix && id <= 255 {
		ne.idLen = uint8(id)
	}
	return ne
}

// Key is the element's key (empty for an endpoint map element of a map
// not keyed by service): a new slice each call.
func (e *Element) Key() []nft.Value { return unpack(e.key, true).key }

// Index is an endpoint map element's index (see nft.Element).
func (e *Element) Index() uint32 { return unpack(e.key, false).index }

// To is an endpoint map element's data, invalid for other elements.
func (e *Element) To() netip.AddrPort { return unpack(e.key, false).to }

// Comment is the element's comment.
func (e *Element) Comment() string { return unpack(e.key, false).comment }

// Elem is the element as an nft.Element of set.
func (e *Element) Elem(set string) nft.Element {
	u := unpack(e.key, true)
	return nft.Element{Set: set, Key: u.key, Verdict: e.Verdict, Comment: u.comment, Index: u.index, To: u.to}
}

// ID is the element's identity in its set (KeyID, EndpointID).
func (e *Element) ID() string {
	if e.idLen > 0 {
		return e.key[:e.idLen]
	}
	u := unpack(e.key, true)
	return packKey(u.key, u.to.IsValid(), u.index, true)
}

// Get returns the element of that identity, or nil.
func (s *Set) Get(id string) *Element {
	if i, ok := s.index[id]; ok {
		return s.Elems[i]
	}
	return nil
}

// Len is the number of elements.
func (s *Set) Len() int { return len(s.Elems) }

// Add stores an element; one of the same identity is replaced in place.
func (s *Set) Add(e *Element) {
	k := e.ID()
	if i, ok := s.index[k]; ok {
		s.Elems[i] = e
		return
	}
	s.index[k] = len(s.Elems)
	s.Elems = append(s.Elems, e)
}

// Remove deletes the element of that identity; false if there is none.
func (s *Set) Remove(id string) bool {
	i, ok := s.index[id]
	if !ok {
		return false
	}
	s.Elems = slices.Delete(s.Elems, i, i+1)
	delete(s.index, id)
	for j := i; j < len(s.Elems); j++ {
		s.index[s.Elems[j].ID()] = j
	}
	return true
}

// Flush removes every element.
func (s *Set) Flush() {
	s.Elems = nil
	s.index = map[string]int{}
}

// Lookup finds the element whose key matches packet values (addresses,
// protocols, ports; never prefixes). Interval sets are scanned in order,
// the others use the exact key.
func (s *Set) Lookup(vals []nft.Value) *Element {
	if !s.Def.Interval {
		return s.Get(KeyID(vals))
	}
	for _, e := range s.Elems {
		key := e.Key()
		if len(key) != len(vals) {
			continue
		}
		ok := true
		for i, k := range key {
			if !valueMatches(k, vals[i]) {
				ok = false
				break
			}
		}
		if ok {
			return e
		}
	}
	return nil
}

func valueMatches(k, v nft.Value) bool {
	switch {
	case k.Prefix.IsValid():
		return v.Addr.IsValid() && k.Prefix.Contains(v.Addr)
	case k.Addr.IsValid():
		return k.Addr == v.Addr
	case k.Proto != "":
		return k.Proto == v.Proto
	default:
		return v.Addr == netip.Addr{} && v.Proto == "" && k.Port == v.Port
	}
}
