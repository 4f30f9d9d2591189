package nft

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// This file and parsestmt.go, parseset.go and parsenested.go are the one
// reader of nft text: the flat `nft -f` form text.go prints (one "add|
// insert|create|flush|delete table|chain|set|map|element|rule ..." a
// line), the nested form `nft list table|ruleset` prints ("table ip t {
// ... }"), and the variants the kernel's listing has for what kproxy
// writes ("priority dstnat", "counter packets 0 bytes 0", "reject with
// icmp port-unreachable", protocol numbers, unquoted interface names).
// Only the ip and ip6 families and the statements of types.go are
// understood; anything else is an error naming the line, never skipped.
// Read hands out one operation at a time (the tracer applies them as they
// come); Parse collects them into transactions (nfttest.Fake.Load).

// Parsed is one operation read from nft text, with what an Op does not
// hold.
type Parsed struct {
	Family Family
	Table  string
	// Op is the operation; Op.In is always "" (Table names the table).
	// "create" reads as OpAdd with Create set.
	Op Op
	// Line is the 1-based line the operation was read from: for a chain
	// of a nested block its last declaration line, for a nested set or
	// map its first line.
	Line int
	// Block names the nested set or map the operation came from, "set s
	// (lines 2-6)"; Read prefixes the errors of such operations with it.
	Block string
	// Create is "create": the object must not exist yet.
	Create bool
	// Policy is a base chain's declared policy ("" when none was given;
	// the kernel's default is accept).
	Policy VerdictKind
	// ByHandle is "delete rule FAMILY TABLE CHAIN handle N": Handle is
	// N and Op.Rule has only its Chain. (A "delete rule" without a handle
	// names the rule by its statements, as text.go prints a rule.)
	ByHandle bool
	Handle   int
	// Lossy names the first thing on the line that the objects do not
	// keep, because it does not change where a packet goes: listing
	// detail ("counter packets N bytes M", "reject with tcp reset", a
	// bare "masquerade", set "size", "policy", "gc-interval", "flags
	// constant", element "timeout" and "expires"). Parse refuses such
	// lines: the transaction it returns would not print them.
	Lossy string
}

// SetLookup returns the definition of a set or map that a text adds
// elements to, nil if there is none; elements are read according to it
// (an inet_proto key reads "6" as tcp; endpoint maps' elements have their
// own shape). Without a definition, elements are read by their look.
type SetLookup func(f Family, table, name string) *Set

// Read parses text and calls apply with each operation in order. It stops
// at the first problem: a *ParseError naming the line, for syntax errors
// and for apply's errors alike (apply's are wrapped, with the nested
// block prefixed). sets, when not nil, gives the definitions of the sets
// elements are added to; when nil, those the text itself declared are
// used.
func Read(text string, sets SetLookup, apply func(*Parsed) error) error {
	r := &reader{lines: strings.Split(text, "\n"), sets: sets, apply: apply}
	if sets == nil {
		r.declared = map[setRef]*Set{}
		r.sets = func(f Family, table, name string) *Set { return r.declared[setRef{f, table, name}] }
	}
	for i := 0; i < len(r.lines); i++ {
		raw := strings.TrimSpace(r.lines[i])
		toks, err := tokenize(raw)
		if err != nil {
			return r.fail(i, err)
		}
		if len(toks) == 0 {
			continue
		}
		if !toks[0].quoted && toks[0].s == "table" {
			// Nested `nft list` form: consumes lines up to its closing brace.
			next, err := r.nested(i)
			if err != nil {
				return err
			}
			i = next
			continue
		}
		ops, err := r.flat(toks, i+1)
		if err != nil {
			return r.fail(i, err)
		}
		if err := r.emit(ops...); err != nil {
			return err
		}
	}
	return nil
}

// Parse reads text (see Read) into transactions: consecutive operations
// of the same family form one transaction, whose Table is the table of
// its first operation (operations on other tables have Op.In set), as
// `nft -f` applies a file as one kernel transaction. It refuses what a
// Transaction cannot hold: "create", "delete rule" (the kernel names a
// rule by its handle), a chain's "policy drop", and the listing detail
// Parsed.Lossy names. nfttest.Fake.Load uses it to restore a Dump.
func Parse(text string) ([]*Transaction, error) {
	var out []*Transaction
	err := Read(text, nil, func(p *Parsed) error {
		switch {
		case p.Create:
			return errors.New("create is not kept in a transaction (use add)")
		case p.Op.Rule != nil && p.Op.Kind == OpDelete:
			return errors.New("rules can only be added or inserted (a rule is deleted by its handle)")
		case p.Policy == Drop:
			return errors.New("a chain policy is not kept in a transaction")
		case p.Lossy != "":
			return fmt.Errorf("%s is not kept in a transaction", p.Lossy)
		}
		if len(out) == 0 || out[len(out)-1].Family != p.Family {
			out = append(out, NewTransaction(p.Family, p.Table))
		}
		t := out[len(out)-1]
		op := p.Op
		if p.Table != t.Table {
			op.In = p.Table
		}
		t.Ops = append(t.Ops, op)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

type setRef struct {
	family      Family
	table, name string
}

// reader is one Read.
type reader struct {
	lines    []string
	sets     SetLookup
	declared map[setRef]*Set // sets declared by the text (when sets was nil)
	apply    func(*Parsed) error
}

func (r *reader) fail(i int, err error) error {
	return &ParseError{Line: i + 1, Text: strings.TrimSpace(r.lines[i]), Err: err}
}

// emit hands operations to apply, wrapping its errors.
func (r *reader) emit(ops ...*Parsed) error {
	for _, p := range ops {
		if r.declared != nil && p.Op.Set != nil && p.Op.Kind == OpAdd {
			r.declared[setRef{p.Family, p.Table, p.Op.Set.Name}] = p.Op.Set
		}
		err := r.apply(p)
		if err == nil {
			continue
		}
		if pe, ok := err.(*ParseError); ok {
			return pe
		}
		if p.Block != "" {
			err = fmt.Errorf("%s: %w", p.Block, err)
		}
		return r.fail(p.Line-1, err)
	}
	return nil
}

// flat parses one line of the flat form.
func (r *reader) flat(toks []token, line int) ([]*Parsed, error) {
	c := &cursor{toks: toks}
	verb, err := c.expect("add", "insert", "create", "flush", "delete")
	if err != nil {
		return nil, err
	}
	obj, err := c.expect("table", "chain", "set", "map", "element", "rule")
	if err != nil {
		return nil, err
	}
	fam, err := c.word("family")
	if err != nil {
		return nil, err
	}
	f := Family(fam)
	if f != IPv4 && f != IPv6 {
		return nil, fmt.Errorf("unsupported family %q (only ip and ip6)", fam)
	}
	tname, err := c.word("table name")
	if err != nil {
		return nil, err
	}
	if verb == "insert" && obj != "rule" {
		return nil, fmt.Errorf("insert only applies to rules")
	}
	return r.op(verb, obj, f, tname, c, line)
}

// op parses an operation on an object after "VERB OBJECT FAMILY TABLE".
func (r *reader) op(verb, obj string, f Family, table string, c *cursor, line int) ([]*Parsed, error) {
	p := &Parsed{Family: f, Table: table, Line: line, Create: verb == "create", Op: Op{Kind: OpKind(verb)}}
	if p.Create {
		p.Op.Kind = OpAdd
	}
	add := p.Op.Kind == OpAdd
	var err error
	switch obj {
	case "table":
		p.Op.Table = &Table{Family: f, Name: table}
		if add && c.accept("{") {
			err = parseBlock(c, func(c *cursor, key string) error {
				if key == "comment" {
					s, err := c.quoted("comment")
					p.Op.Table.Comment = s
					return err
				}
				// Flags (dormant, owner...) change whether and for whom the
				// table runs: refuse them rather than read something else.
				return fmt.Errorf("unsupported table attribute %q", key)
			})
		}
	case "chain":
		p.Op.Chain, p.Policy, err = parseChain(c, add)
	case "set", "map":
		var elems []*Element
		p.Op.Set, elems, err = parseSet(c, f, add, obj == "map")
		if err == nil {
			out := []*Parsed{p}
			for _, e := range elems {
				out = append(out, &Parsed{Family: f, Table: table, Line: line, Op: Op{Kind: OpAdd, Element: e}})
			}
			if err = c.end(); err == nil {
				for _, q := range out {
					q.Lossy = c.lossy
				}
				return out, nil
			}
		}
	case "element":
		return r.elements(p, c)
	default: // rule
		name, err := c.word("chain name")
		if err != nil {
			return nil, err
		}
		p.Op.Rule = &Rule{Chain: name}
		if p.Op.Kind == OpDelete && c.accept("handle") {
			w, err := c.word("handle")
			if err != nil {
				return nil, err
			}
			h, err := strconv.Atoi(w)
			if err != nil {
				return nil, fmt.Errorf("invalid handle %q", w)
			}
			p.ByHandle, p.Handle = true, h
			break
		}
		if p.Op.Rule.Stmts, p.Op.Rule.Comment, err = parseRule(c, f); err != nil {
			return nil, err
		}
		if p.Op.Kind == OpFlush {
			return nil, errors.New("flush rule is not an operation (flush the chain)")
		}
	}
	if err != nil {
		return nil, err
	}
	if err := c.end(); err != nil {
		return nil, err
	}
	p.Lossy = c.lossy
	return []*Parsed{p}, nil
}

// elements parses "SET { ELEMENT, ... }": one operation per element.
func (r *reader) elements(p *Parsed, c *cursor) ([]*Parsed, error) {
	if p.Op.Kind == OpFlush {
		return nil, errors.New("flush element is not an operation (flush the set)")
	}
	name, err := c.word("set name")
	if err != nil {
		return nil, err
	}
	if _, err := c.expect("{"); err != nil {
		return nil, err
	}
	def := r.sets(p.Family, p.Table, name)
	elems, err := parseElements(c, p.Family, name, def, p.Op.Kind != OpDelete)
	if err != nil {
		return nil, err
	}
	if err := c.end(); err != nil {
		return nil, err
	}
	out := make([]*Parsed, len(elems))
	for i, e := range elems {
		q := *p
		q.Op.Element = e
		q.Lossy = c.lossy
		out[i] = &q
	}
	return out, nil
}

// parseBlock parses "{ key ... ; key ... ; }" calling attr for each key;
// attr consumes the attribute's value.
func parseBlock(c *cursor, attr func(c *cursor, key string) error) error {
	for {
		w, err := c.word("attribute or }")
		if err != nil {
			return err
		}
		switch w {
		case "}":
			return nil
		case ";":
			continue
		}
		if err := attr(c, w); err != nil {
			return err
		}
		if p := c.peek(); p != ";" && p != "}" {
			return fmt.Errorf("expected ; or } after %s, found %q", w, p)
		}
	}
}

var namedPriorities = map[string]int{
	"raw": -300, "mangle": -150, "dstnat": -100, "filter": 0, "security": 50, "srcnat": 100,
}

// parsePriority reads "-110", "dstnat", "dstnat - 10" or "dstnat+10".
func parsePriority(c *cursor) (int, error) {
	w, err := c.word("priority")
	if err != nil {
		return 0, err
	}
	base, named := 0, false
	for name, v := range namedPriorities {
		if w == name {
			base, named = v, true
		} else if strings.HasPrefix(w, name+"+") || strings.HasPrefix(w, name+"-") {
			n, err := strconv.Atoi(w[len(name):])
			if err != nil {
				return 0, fmt.Errorf("invalid priority %q", w)
			}
			return v + n, nil
		}
	}
	if !named {
		n, err := strconv.Atoi(w)
		if err != nil {
			return 0, fmt.Errorf("invalid priority %q", w)
		}
		return n, nil
	}
	if op := c.peek(); op == "+" || op == "-" {
		c.pos++
		ns, err := c.word("priority offset")
		if err != nil {
			return 0, err
		}
		n, err := strconv.Atoi(ns)
		if err != nil {
			return 0, fmt.Errorf("invalid priority offset %q", ns)
		}
		if op == "-" {
			n = -n
		}
		return base + n, nil
	}
	return base, nil
}

var hooks = map[string]bool{
	HookPrerouting: true, HookInput: true, HookForward: true, HookOutput: true, HookPostrouting: true,
}

// parseChain reads "NAME [{ type T hook H priority P ; policy X ; comment
// C ; }]" (the block only when add).
func parseChain(c *cursor, add bool) (*Chain, VerdictKind, error) {
	name, err := c.word("chain name")
	if err != nil {
		return nil, "", err
	}
	ch := &Chain{Name: name}
	if !add || !c.accept("{") {
		return ch, "", nil
	}
	var policy VerdictKind
	err = parseBlock(c, func(c *cursor, key string) error {
		switch key {
		case "type":
			typ, err := c.expect(TypeFilter, TypeNAT)
			if err != nil {
				return err
			}
			if _, err := c.expect("hook"); err != nil {
				return err
			}
			hook, err := c.word("hook")
			if err != nil {
				return err
			}
			if !hooks[hook] {
				return fmt.Errorf("unsupported hook %q", hook)
			}
			if _, err := c.expect("priority"); err != nil {
				return err
			}
			prio, err := parsePriority(c)
			if err != nil {
				return err
			}
			if typ == TypeNAT && hook == HookForward {
				return errors.New("nat chains cannot use the forward hook")
			}
			ch.Type, ch.Hook, ch.Priority = typ, hook, prio
			return nil
		case "policy":
			p, err := c.expect("accept", "drop")
			policy = VerdictKind(p)
			return err
		case "comment":
			s, err := c.quoted("comment")
			ch.Comment = s
			return err
		}
		return fmt.Errorf("unknown chain attribute %q", key)
	})
	if err != nil {
		return nil, "", err
	}
	if policy == Drop && ch.Hook == "" {
		return nil, "", fmt.Errorf("policy on regular chain %q", name)
	}
	return ch, policy, nil
}

// parseDuration reads nft durations: "10800s", "3h", "1d2h30m", "500ms".
func parseDuration(s string) (time.Duration, error) {
	if s == "" {
		return 0, errors.New("empty duration")
	}
	var total time.Duration
	rest := s
	for rest != "" {
		i := 0
		for i < len(rest) && rest[i] >= '0' && rest[i] <= '9' {
			i++
		}
		if i == 0 {
			return 0, fmt.Errorf("invalid duration %q", s)
		}
		n, _ := strconv.ParseInt(rest[:i], 10, 64)
		rest = rest[i:]
		j := 0
		for j < len(rest) && (rest[j] < '0' || rest[j] > '9') {
			j++
		}
		unit := map[string]time.Duration{"d": 24 * time.Hour, "h": time.Hour, "m": time.Minute, "s": time.Second, "ms": time.Millisecond}[rest[:j]]
		if unit == 0 {
			return 0, fmt.Errorf("invalid duration %q", s)
		}
		total += time.Duration(n) * unit
		rest = rest[j:]
	}
	return total, nil
}
