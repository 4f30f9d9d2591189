package trace

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/kproxy/kproxy/internal/kernel/nft"
)

// Ruleset is the state of the nftables tables of families ip and ip6 after
// a sequence of transactions. Build one with ParseNFT, change it with Apply
// or Remember, walk packets through it with Trace.
//
// Trace only reads the ruleset, so traces may run concurrently; Apply and
// Remember must not run concurrently with anything else.
type Ruleset struct {
	tables []*table
	gen    int // counts Apply calls, to tell this text's lines from older ones
}

type table struct {
	family  nft.Family
	name    string
	comment string
	chains  map[string]*chain
	order   []string // chain names in creation order
	sets    map[string]*set
	sorder  []string // set names in creation order
	handle  int      // last rule handle given out
	gen     int      // the Apply call in progress
}

type chain struct {
	def    nft.Chain
	policy nft.VerdictKind // base chains: Accept (the default) or Drop
	rules  []*rule
	line   int
}

func (c *chain) base() bool { return c.def.Hook != "" }

type rule struct {
	handle  int
	stmts   []nft.Stmt
	comment string
	line    int
	gen     int // the Apply call that added it
}

type set struct {
	def   nft.Set
	elems []*element
	index map[string]int // key string → position in elems
	line  int
	// family is the table's (endpoint map elements hold addresses).
	family nft.Family
}

type element struct {
	key []nft.Value
	// index and to, when to is valid, are the key and data of an
	// endpoint map element (key is nil, or the service's address and
	// port in a map keyed by service).
	index   uint32
	to      netip.AddrPort
	verdict *nft.Verdict
	comment string
	line    int
	gen     int
}

// id is the element's key as a string: keyString, or "#INDEX" in an
// endpoint map.
func (e *element) id() string {
	if e.to.IsValid() {
		return endpointID(e.key, e.index)
	}
	return keyString(e.key)
}

// endpointID is the id of an endpoint map element: "#INDEX", after the
// service's "ADDR . PORT " in a map keyed by service.
func endpointID(svc []nft.Value, index uint32) string {
	id := "#" + strconv.FormatUint(uint64(index), 10)
	if len(svc) > 0 {
		return keyString(svc) + " " + id
	}
	return id
}

// keyString is the canonical text of a key, as text.go prints it.
func keyString(key []nft.Value) string {
	parts := make([]string, len(key))
	for i, v := range key {
		parts[i] = v.String()
	}
	return strings.Join(parts, " . ")
}

func newTable(f nft.Family, name string) *table {
	return &table{family: f, name: name, chains: map[string]*chain{}, sets: map[string]*set{}}
}

func (r *Ruleset) table(f nft.Family, name string) *table {
	for _, t := range r.tables {
		if t.family == f && t.name == name {
			return t
		}
	}
	return nil
}

// clone copies the ruleset deeply enough that Apply can work on the copy
// and drop it on error: rules and elements are never modified in place, so
// they are shared.
func (r *Ruleset) clone() *Ruleset {
	n := &Ruleset{tables: make([]*table, 0, len(r.tables)), gen: r.gen}
	for _, t := range r.tables {
		nt := *t
		nt.chains = make(map[string]*chain, len(t.chains))
		for k, c := range t.chains {
			nc := *c
			nc.rules = slices.Clone(c.rules)
			nt.chains[k] = &nc
		}
		nt.order = slices.Clone(t.order)
		nt.sets = make(map[string]*set, len(t.sets))
		for k, s := range t.sets {
			ns := *s
			ns.elems = slices.Clone(s.elems)
			ns.index = make(map[string]int, len(s.index))
			for ek, ev := range s.index {
				ns.index[ek] = ev
			}
			nt.sets[k] = &ns
		}
		nt.sorder = slices.Clone(t.sorder)
		n.tables = append(n.tables, &nt)
	}
	return n
}

func (s *set) add(e *element) {
	k := e.id()
	if i, ok := s.index[k]; ok {
		// Like knftables' fake: re-adding a key replaces its value.
		s.elems[i] = e
		return
	}
	s.index[k] = len(s.elems)
	s.elems = append(s.elems, e)
}

func (s *set) remove(k string) bool {
	i, ok := s.index[k]
	if !ok {
		return false
	}
	s.elems = slices.Delete(s.elems, i, i+1)
	delete(s.index, k)
	for j := i; j < len(s.elems); j++ {
		s.index[s.elems[j].id()] = j
	}
	return true
}

func (s *set) flush() {
	s.elems = nil
	s.index = map[string]int{}
}

// lookup finds the element whose key matches the packet values (addresses,
// protocols, ports; never prefixes). Interval sets are scanned, the others
// use the exact key.
func (s *set) lookup(vals []nft.Value) *element {
	if !s.def.Interval {
		if i, ok := s.index[keyString(vals)]; ok {
			return s.elems[i]
		}
		return nil
	}
	for _, e := range s.elems {
		if len(e.key) != len(vals) {
			continue
		}
		ok := true
		for i, k := range e.key {
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

// chainUsers reports where a chain is still referenced from, ignoring the
// rules of the chain itself (deleting a chain deletes its rules first).
func (t *table) chainUsers(name string) string {
	for _, cn := range t.order {
		if cn == name {
			continue
		}
		for _, r := range t.chains[cn].rules {
			for _, s := range r.stmts {
				if cs, _ := nft.Refs([]nft.Stmt{s}); slices.Contains(cs, name) {
					return "a rule in chain " + cn
				}
			}
		}
	}
	for _, sn := range t.sorder {
		for _, e := range t.sets[sn].elems {
			if e.verdict != nil && e.verdict.Chain == name {
				return "an element of map " + sn
			}
		}
	}
	return ""
}

func (t *table) setUsers(name string) string {
	for _, cn := range t.order {
		for _, r := range t.chains[cn].rules {
			for _, s := range r.stmts {
				if _, ss := nft.Refs([]nft.Stmt{s}); slices.Contains(ss, name) {
					return "a rule in chain " + cn
				}
			}
		}
	}
	return ""
}

// validate checks what the kernel checks when a transaction commits: every
// chain and set a rule or map element names exists and has the right shape.
func (t *table) validate() *ParseError {
	fail := func(at origin, format string, args ...any) *ParseError {
		err := fmt.Errorf(format, args...)
		if at.gen != t.gen {
			// Added by an earlier text: its line number means nothing here.
			return &ParseError{Err: fmt.Errorf("%w (from line %d of an earlier text)", err, at.line)}
		}
		return &ParseError{Line: at.line, Err: err}
	}
	checkChain := func(line origin, name string) *ParseError {
		c := t.chains[name]
		if c == nil {
			return fail(line, "no chain %q in table %s %s", name, t.family, t.name)
		}
		if c.base() {
			return fail(line, "cannot jump or goto base chain %q", name)
		}
		return nil
	}
	for _, cn := range t.order {
		for _, r := range t.chains[cn].rules {
			for _, st := range r.stmts {
				cs, _ := nft.Refs([]nft.Stmt{st})
				for _, c := range cs {
					if err := checkChain(origin{r.line, r.gen}, c); err != nil {
						return err
					}
				}
				switch st := st.(type) {
				case nft.VmapLookup:
					m := t.sets[st.Map]
					if m == nil {
						return fail(origin{r.line, r.gen}, "no map %q in table %s %s", st.Map, t.family, t.name)
					}
					if m.def.Data != nft.TypeVerdict {
						return fail(origin{r.line, r.gen}, "%q is not a verdict map", st.Map)
					}
					if len(m.def.Key) != len(st.Fields) {
						return fail(origin{r.line, r.gen}, "map %q has %d key fields, lookup gives %d", st.Map, len(m.def.Key), len(st.Fields))
					}
					for i, f := range st.Fields {
						if want := fieldType(t.family, f); m.def.Key[i] != want {
							return fail(origin{r.line, r.gen}, "map %q key field %d is %s, lookup gives %s", st.Map, i+1, m.def.Key[i], want)
						}
					}
				case nft.MatchInSet:
					m := t.sets[st.Set]
					if m == nil {
						return fail(origin{r.line, r.gen}, "no set %q in table %s %s", st.Set, t.family, t.name)
					}
					if m.def.IsMap() || len(m.def.Key) != len(st.Fields) {
						return fail(origin{r.line, r.gen}, "set %q does not match a lookup of %d fields", st.Set, len(st.Fields))
					}
					for i, f := range st.Fields {
						if want := fieldType(t.family, f); m.def.Key[i] != want {
							return fail(origin{r.line, r.gen}, "set %q key field %d is %s, lookup gives %s", st.Set, i+1, m.def.Key[i], want)
						}
					}
				case nft.MatchAddr:
					if st.Set == "" {
						continue
					}
					if err := t.checkAddrSet(origin{r.line, r.gen}, st.Set, false, fail); err != nil {
						return err
					}
				case nft.UpdateSaddr:
					if err := t.checkAddrSet(origin{r.line, r.gen}, st.Set, true, fail); err != nil {
						return err
					}
				case nft.DNATMap:
					m := t.sets[st.Map]
					if m == nil {
						return fail(origin{r.line, r.gen}, "no map %q in table %s %s", st.Map, t.family, t.name)
					}
					if m.def.Endpoints != st.Proto || m.def.ByService {
						return fail(origin{r.line, r.gen}, "%q is not a map of %s endpoints", st.Map, nft.ProtoName(st.Proto))
					}
				case nft.DNATByService:
					m := t.sets[st.Map]
					if m == nil {
						return fail(origin{r.line, r.gen}, "no map %q in table %s %s", st.Map, t.family, t.name)
					}
					if m.def.Endpoints != st.Proto || !m.def.ByService {
						return fail(origin{r.line, r.gen}, "%q is not a map of %s endpoints keyed by service", st.Map, nft.ProtoName(st.Proto))
					}
				}
			}
		}
	}
	for _, sn := range t.sorder {
		for _, e := range t.sets[sn].elems {
			if e.verdict != nil && (e.verdict.Kind == nft.Jump || e.verdict.Kind == nft.Goto) {
				if err := checkChain(origin{e.line, e.gen}, e.verdict.Chain); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

func (t *table) checkAddrSet(at origin, name string, dynamic bool, fail func(origin, string, ...any) *ParseError) *ParseError {
	s := t.sets[name]
	switch {
	case s == nil:
		return fail(at, "no set %q in table %s %s", name, t.family, t.name)
	case s.def.IsMap():
		return fail(at, "%q is a map, not a set", name)
	case len(s.def.Key) != 1 || s.def.Key[0] != nft.AddrType(t.family):
		return fail(at, "set %q does not hold %s", name, nft.AddrType(t.family))
	case dynamic && !s.def.Dynamic:
		// The kernel only lets the packet path add to sets flagged dynamic.
		return fail(at, "set %q is updated from the packet path but not flagged dynamic", name)
	}
	return nil
}

// origin is where a rule or element came from.
type origin struct{ line, gen int }

func fieldType(f nft.Family, fl nft.Field) nft.DataType {
	switch fl {
	case nft.FieldDaddr, nft.FieldSaddr:
		return nft.AddrType(f)
	case nft.FieldL4Proto:
		return nft.TypeInetProto
	default:
		return nft.TypeInetService
	}
}

// String dumps the ruleset as one full transaction per table in the text
// form of the nft package: the table, its chains, sets, elements, then
// rules. ParseNFT of the dump gives the same ruleset.
func (r *Ruleset) String() string {
	var b strings.Builder
	for _, t := range r.tables {
		tx := nft.NewTransaction(t.family, t.name)
		tx.Add(&nft.Table{Family: t.family, Name: t.name, Comment: t.comment})
		for _, cn := range t.order {
			c := t.chains[cn]
			def := c.def
			tx.Add(&def)
		}
		for _, sn := range t.sorder {
			def := t.sets[sn].def
			tx.Add(&def)
		}
		for _, sn := range t.sorder {
			for _, e := range t.sets[sn].elems {
				tx.Add(&nft.Element{Set: sn, Key: e.key, Verdict: e.verdict, Comment: e.comment, Index: e.index, To: e.to})
			}
		}
		for _, cn := range t.order {
			for _, ru := range t.chains[cn].rules {
				tx.Add(&nft.Rule{Chain: cn, Stmts: ru.stmts, Comment: ru.comment})
			}
		}
		text := tx.String()
		// nft.Chain has no policy; spell out the rare drop policy here.
		for _, cn := range t.order {
			if c := t.chains[cn]; c.policy == nft.Drop {
				old := chainLine(t, c.def)
				text = strings.Replace(text, old, strings.TrimSuffix(old, " }")+" policy drop ; }", 1)
			}
		}
		b.WriteString(text)
	}
	return b.String()
}

func chainLine(t *table, c nft.Chain) string {
	tx := nft.NewTransaction(t.family, t.name)
	tx.Add(&c)
	return strings.TrimSuffix(tx.String(), "\n")
}

// ruleText is the body of a rule as text.go prints it (statements and
// comment), used in paths and to find the rule a "delete rule" names.
func ruleText(f nft.Family, stmts []nft.Stmt, comment string) string {
	tx := nft.NewTransaction(f, "t")
	tx.Add(&nft.Rule{Chain: "c", Stmts: stmts, Comment: comment})
	s := strings.TrimSuffix(tx.String(), "\n")
	return strings.TrimPrefix(strings.TrimPrefix(s, "add rule "+string(f)+" t c"), " ")
}
