package trace

import (
	"fmt"
	"slices"
	"strings"

	"github.com/kproxy/kproxy/internal/kernel/nft"
	"github.com/kproxy/kproxy/internal/kernel/nft/nftstate"
)

// Ruleset is the state of the nftables tables of families ip and ip6 after
// a sequence of transactions. Build one with ParseNFT, change it with Apply
// or Remember, walk packets through it with Trace. The state is an
// nftstate.State, as nfttest.Fake's is: Of traces a state built by other
// means.
//
// Trace only reads the ruleset, so traces may run concurrently; Apply and
// Remember must not run concurrently with anything else.
type Ruleset struct {
	state nftstate.State
	gen   int // counts Apply calls, to tell this text's lines from older ones
}

// Of returns a Ruleset that traces st, nfttest.Fake's state for one
// (Fake.State). It shares st's tables; Apply and Remember copy before
// they change anything, so st stays as it is.
func Of(st *nftstate.State) *Ruleset { return &Ruleset{state: *st} }

type (
	table   = nftstate.Table
	chain   = nftstate.Chain
	rule    = nftstate.Rule
	element = nftstate.Element
)

// clone copies the ruleset deeply enough that Apply can work on the copy
// and drop it on error.
func (r *Ruleset) clone() *Ruleset {
	return &Ruleset{state: *r.state.Clone(), gen: r.gen}
}

// chainUsers reports where a chain is still referenced from, ignoring the
// rules of the chain itself (deleting a chain deletes its rules first).
func chainUsers(t *table, name string) string {
	for _, cn := range t.ChainOrder {
		if cn == name {
			continue
		}
		for _, r := range t.Chains[cn].Rules {
			for _, s := range r.Stmts {
				if cs, _ := nft.Refs([]nft.Stmt{s}); slices.Contains(cs, name) {
					return "a rule in chain " + cn
				}
			}
		}
	}
	for _, sn := range t.SetOrder {
		for _, e := range t.Sets[sn].Elems {
			if e.Verdict != nil && e.Verdict.Chain == name {
				return "an element of map " + sn
			}
		}
	}
	return ""
}

func setUsers(t *table, name string) string {
	for _, cn := range t.ChainOrder {
		for _, r := range t.Chains[cn].Rules {
			for _, s := range r.Stmts {
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
func validate(t *table) *ParseError {
	fail := func(at origin, format string, args ...any) *ParseError {
		err := fmt.Errorf(format, args...)
		if at.gen != t.Gen {
			// Added by an earlier text: its line number means nothing here.
			return &ParseError{Err: fmt.Errorf("%w (from line %d of an earlier text)", err, at.line)}
		}
		return &ParseError{Line: at.line, Err: err}
	}
	checkChain := func(line origin, name string) *ParseError {
		c := t.Chains[name]
		if c == nil {
			return fail(line, "no chain %q in table %s %s", name, t.Family, t.Name)
		}
		if c.Base() {
			return fail(line, "cannot jump or goto base chain %q", name)
		}
		return nil
	}
	for _, cn := range t.ChainOrder {
		for _, r := range t.Chains[cn].Rules {
			for _, st := range r.Stmts {
				cs, _ := nft.Refs([]nft.Stmt{st})
				for _, c := range cs {
					if err := checkChain(origin{r.Line, r.Gen}, c); err != nil {
						return err
					}
				}
				switch st := st.(type) {
				case nft.VmapLookup:
					m := t.Sets[st.Map]
					if m == nil {
						return fail(origin{r.Line, r.Gen}, "no map %q in table %s %s", st.Map, t.Family, t.Name)
					}
					if m.Def.Data != nft.TypeVerdict {
						return fail(origin{r.Line, r.Gen}, "%q is not a verdict map", st.Map)
					}
					if len(m.Def.Key) != len(st.Fields) {
						return fail(origin{r.Line, r.Gen}, "map %q has %d key fields, lookup gives %d", st.Map, len(m.Def.Key), len(st.Fields))
					}
					for i, f := range st.Fields {
						if want := fieldType(t.Family, f); m.Def.Key[i] != want {
							return fail(origin{r.Line, r.Gen}, "map %q key field %d is %s, lookup gives %s", st.Map, i+1, m.Def.Key[i], want)
						}
					}
				case nft.MatchInSet:
					m := t.Sets[st.Set]
					if m == nil {
						return fail(origin{r.Line, r.Gen}, "no set %q in table %s %s", st.Set, t.Family, t.Name)
					}
					if m.Def.IsMap() || len(m.Def.Key) != len(st.Fields) {
						return fail(origin{r.Line, r.Gen}, "set %q does not match a lookup of %d fields", st.Set, len(st.Fields))
					}
					for i, f := range st.Fields {
						if want := fieldType(t.Family, f); m.Def.Key[i] != want {
							return fail(origin{r.Line, r.Gen}, "set %q key field %d is %s, lookup gives %s", st.Set, i+1, m.Def.Key[i], want)
						}
					}
				case nft.MatchAddr:
					if st.Set == "" {
						continue
					}
					if err := checkAddrSet(t, origin{r.Line, r.Gen}, st.Set, false, fail); err != nil {
						return err
					}
				case nft.UpdateSaddr:
					if err := checkAddrSet(t, origin{r.Line, r.Gen}, st.Set, true, fail); err != nil {
						return err
					}
				case nft.DNATMap:
					m := t.Sets[st.Map]
					if m == nil {
						return fail(origin{r.Line, r.Gen}, "no map %q in table %s %s", st.Map, t.Family, t.Name)
					}
					if m.Def.Endpoints != st.Proto || m.Def.ByService {
						return fail(origin{r.Line, r.Gen}, "%q is not a map of %s endpoints", st.Map, nft.ProtoName(st.Proto))
					}
				case nft.DNATByService:
					m := t.Sets[st.Map]
					if m == nil {
						return fail(origin{r.Line, r.Gen}, "no map %q in table %s %s", st.Map, t.Family, t.Name)
					}
					if m.Def.Endpoints != st.Proto || !m.Def.ByService {
						return fail(origin{r.Line, r.Gen}, "%q is not a map of %s endpoints keyed by service", st.Map, nft.ProtoName(st.Proto))
					}
				default:
					// Statements without checks of their own: what they
					// name must exist.
					_, ss := nft.Refs([]nft.Stmt{st})
					for _, n := range ss {
						if t.Sets[n] == nil {
							return fail(origin{r.Line, r.Gen}, "no set %q in table %s %s", n, t.Family, t.Name)
						}
					}
				}
			}
		}
	}
	for _, sn := range t.SetOrder {
		for _, e := range t.Sets[sn].Elems {
			if e.Verdict != nil && (e.Verdict.Kind == nft.Jump || e.Verdict.Kind == nft.Goto) {
				if err := checkChain(origin{e.Line, e.Gen}, e.Verdict.Chain); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

func checkAddrSet(t *table, at origin, name string, dynamic bool, fail func(origin, string, ...any) *ParseError) *ParseError {
	s := t.Sets[name]
	switch {
	case s == nil:
		return fail(at, "no set %q in table %s %s", name, t.Family, t.Name)
	case s.Def.IsMap():
		return fail(at, "%q is a map, not a set", name)
	case len(s.Def.Key) != 1 || s.Def.Key[0] != nft.AddrType(t.Family):
		return fail(at, "set %q does not hold %s", name, nft.AddrType(t.Family))
	case dynamic && !s.Def.Dynamic:
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
	for _, t := range r.state.Tables {
		tx := nft.NewTransaction(t.Family, t.Name)
		tx.Add(&nft.Table{Family: t.Family, Name: t.Name, Comment: t.Comment})
		for _, cn := range t.ChainOrder {
			c := t.Chains[cn]
			def := c.Def
			tx.Add(&def)
		}
		for _, sn := range t.SetOrder {
			def := t.Sets[sn].Def
			tx.Add(&def)
		}
		for _, sn := range t.SetOrder {
			for _, e := range t.Sets[sn].Elems {
				tx.Add(&nft.Element{Set: sn, Key: e.Key, Verdict: e.Verdict, Comment: e.Comment, Index: e.Index, To: e.To})
			}
		}
		for _, cn := range t.ChainOrder {
			for _, ru := range t.Chains[cn].Rules {
				tx.Add(&nft.Rule{Chain: cn, Stmts: ru.Stmts, Comment: ru.Comment})
			}
		}
		text := tx.String()
		// nft.Chain has no policy; spell out the rare drop policy here.
		for _, cn := range t.ChainOrder {
			if c := t.Chains[cn]; c.Policy == nft.Drop {
				old := chainLine(t, c.Def)
				text = strings.Replace(text, old, strings.TrimSuffix(old, " }")+" policy drop ; }", 1)
			}
		}
		b.WriteString(text)
	}
	return b.String()
}

func chainLine(t *table, c nft.Chain) string {
	tx := nft.NewTransaction(t.Family, t.Name)
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
