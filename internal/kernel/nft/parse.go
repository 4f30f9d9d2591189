package nft

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
)

// Parse reads text in the form Transaction.String writes (one operation
// per line; blank lines and lines starting with # are ignored) back into
// transactions: consecutive lines of the same family form one
// transaction, whose Table is the table of its first line (operations on
// other tables have Op.In set), as `nft -f` applies a file as one kernel
// transaction. It accepts exactly what text.go prints, not nft's whole
// grammar; nfttest.Fake.Load uses it to restore a Dump.
func Parse(text string) ([]*Transaction, error) {
	var out []*Transaction
	for n, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fam, table, op, err := parseLine(line)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w: %s", n+1, err, line)
		}
		if len(out) == 0 || out[len(out)-1].Family != fam {
			out = append(out, NewTransaction(fam, table))
		}
		t := out[len(out)-1]
		if table != t.Table {
			op.In = table
		}
		t.Ops = append(t.Ops, op)
	}
	return out, nil
}

// tokenize splits a line at spaces, keeping quoted strings whole and
// splitting a trailing comma off into its own token.
func tokenize(line string) ([]string, error) {
	var toks []string
	for i := 0; i < len(line); {
		switch c := line[i]; {
		case c == ' ' || c == '\t':
			i++
		case c == '"':
			j := i + 1
			for j < len(line) && line[j] != '"' {
				if line[j] == '\\' {
					j++
				}
				j++
			}
			if j >= len(line) {
				return nil, fmt.Errorf("unterminated string")
			}
			toks = append(toks, line[i:j+1])
			i = j + 1
		default:
			j := i
			for j < len(line) && line[j] != ' ' && line[j] != '\t' {
				j++
			}
			tok := line[i:j]
			if len(tok) > 1 && strings.HasSuffix(tok, ",") {
				toks = append(toks, tok[:len(tok)-1], ",")
			} else {
				toks = append(toks, tok)
			}
			i = j
		}
	}
	return toks, nil
}

type tokens struct {
	t []string
	i int
}

func (p *tokens) peek() string {
	if p.i < len(p.t) {
		return p.t[p.i]
	}
	return ""
}

func (p *tokens) peekAt(k int) string {
	if p.i+k < len(p.t) {
		return p.t[p.i+k]
	}
	return ""
}

func (p *tokens) next() string {
	s := p.peek()
	if p.i < len(p.t) {
		p.i++
	}
	return s
}

func (p *tokens) done() bool { return p.i >= len(p.t) }

func (p *tokens) expect(words ...string) error {
	for _, w := range words {
		if got := p.next(); got != w {
			return fmt.Errorf("expected %q, found %q", w, got)
		}
	}
	return nil
}

func (p *tokens) str() (string, error) {
	tok := p.next()
	s, err := strconv.Unquote(tok)
	if err != nil {
		return "", fmt.Errorf("expected a quoted string, found %q", tok)
	}
	return s, nil
}

func (p *tokens) name() (string, error) {
	tok := p.next()
	if tok == "" || strings.ContainsAny(tok, "{};,\"") {
		return "", fmt.Errorf("expected a name, found %q", tok)
	}
	return tok, nil
}

func parseLine(line string) (Family, string, Op, error) {
	toks, err := tokenize(line)
	if err != nil {
		return "", "", Op{}, err
	}
	p := &tokens{t: toks}
	var op Op
	switch k := OpKind(p.next()); k {
	case OpAdd, OpFlush, OpDelete, OpInsert:
		op.Kind = k
	default:
		return "", "", op, fmt.Errorf("unknown command %q", k)
	}
	obj := p.next()
	fam := Family(p.next())
	if fam != IPv4 && fam != IPv6 {
		return "", "", op, fmt.Errorf("unknown family %q", fam)
	}
	table, err := p.name()
	if err != nil {
		return "", "", op, err
	}
	switch obj {
	case "table":
		op.Table = &Table{Family: fam, Name: table}
		if op.Kind == OpAdd && !p.done() {
			err = p.block(func(key string) error {
				if key != "comment" {
					return fmt.Errorf("unexpected %q in table", key)
				}
				op.Table.Comment, err = p.str()
				return err
			})
		}
	case "chain":
		op.Chain, err = p.chain(op.Kind)
	case "set", "map":
		op.Set, err = p.set(fam, op.Kind, obj == "map")
	case "element":
		op.Element, err = p.element(op.Kind)
	case "rule":
		if op.Kind != OpAdd && op.Kind != OpInsert {
			return "", "", op, fmt.Errorf("rules can only be added or inserted")
		}
		op.Rule, err = p.rule(fam)
	default:
		return "", "", op, fmt.Errorf("unknown object %q", obj)
	}
	if err != nil {
		return "", "", op, err
	}
	if !p.done() {
		return "", "", op, fmt.Errorf("unexpected %q at the end", p.peek())
	}
	return fam, table, op, nil
}

// block parses "{ KEY ... ; KEY ... ; }", calling fn at each KEY with the
// tokens positioned after it; fn consumes the values.
func (p *tokens) block(fn func(key string) error) error {
	if err := p.expect("{"); err != nil {
		return err
	}
	for {
		key := p.next()
		switch key {
		case "}":
			return nil
		case "":
			return fmt.Errorf("missing }")
		}
		if err := fn(key); err != nil {
			return err
		}
		if err := p.expect(";"); err != nil {
			return err
		}
	}
}

func (p *tokens) chain(kind OpKind) (*Chain, error) {
	name, err := p.name()
	if err != nil {
		return nil, err
	}
	c := &Chain{Name: name}
	if kind != OpAdd || p.done() {
		return c, nil
	}
	err = p.block(func(key string) error {
		switch key {
		case "type":
			c.Type = p.next()
			if err := p.expect("hook"); err != nil {
				return err
			}
			c.Hook = p.next()
			if err := p.expect("priority"); err != nil {
				return err
			}
			prio, err := strconv.Atoi(p.next())
			if err != nil {
				return fmt.Errorf("bad priority: %w", err)
			}
			c.Priority = prio
		case "comment":
			c.Comment, err = p.str()
			return err
		default:
			return fmt.Errorf("unexpected %q in chain", key)
		}
		return nil
	})
	return c, err
}

func (p *tokens) set(fam Family, kind OpKind, isMap bool) (*Set, error) {
	name, err := p.name()
	if err != nil {
		return nil, err
	}
	s := &Set{Name: name}
	if kind != OpAdd {
		if isMap {
			s.Data = TypeVerdict // flush/delete map: only the kind matters
		}
		return s, nil
	}
	err = p.block(func(key string) error {
		switch key {
		case "typeof":
			if p.peek() == addrKeyword(fam) {
				// "typeof ip daddr . PROTO dport . numgen ...": keyed by service.
				p.next()
				if err := p.expect("daddr", "."); err != nil {
					return err
				}
				proto, err := parseProto(p.next())
				if err != nil {
					return err
				}
				if err := p.expect("dport", "."); err != nil {
					return err
				}
				s.Endpoints, s.ByService = proto, true
			}
			if err := p.expect("numgen", "random", "mod", "1", ":", addrKeyword(fam), "daddr", "."); err != nil {
				return fmt.Errorf("only endpoint maps are declared by typeof: %w", err)
			}
			proto, err := parseProto(p.next())
			if err != nil {
				return err
			}
			if s.ByService && proto != s.Endpoints {
				return fmt.Errorf("endpoint map keyed by %s ports maps to %s ports", s.Endpoints, proto)
			}
			s.Endpoints = proto
			return p.expect("dport")
		case "type":
			for {
				s.Key = append(s.Key, DataType(p.next()))
				if p.peek() != "." {
					break
				}
				p.next()
			}
			if p.peek() == ":" {
				p.next()
				s.Data = DataType(p.next())
			}
		case "flags":
			for _, f := range strings.Split(p.next(), ",") {
				switch f {
				case "interval":
					s.Interval = true
				case "dynamic":
					s.Dynamic = true
				case "timeout":
					// implied by dynamic or a timeout
				default:
					return fmt.Errorf("unknown set flag %q", f)
				}
			}
		case "timeout":
			d, err := time.ParseDuration(p.next())
			if err != nil {
				return err
			}
			s.Timeout = d
		case "comment":
			s.Comment, err = p.str()
			return err
		default:
			return fmt.Errorf("unexpected %q in set", key)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if isMap != s.IsMap() {
		return nil, fmt.Errorf("map and set declaration do not match")
	}
	return s, nil
}

// ParseValue reads one key component as Value.String prints it.
func ParseValue(tok string) (Value, error) {
	switch tok {
	case "tcp", "udp", "sctp":
		return Value{Proto: v1.Protocol(strings.ToUpper(tok))}, nil
	}
	if strings.Contains(tok, "/") {
		pfx, err := netip.ParsePrefix(tok)
		if err != nil {
			return Value{}, err
		}
		return Value{Prefix: pfx}, nil
	}
	if a, err := netip.ParseAddr(tok); err == nil {
		return Value{Addr: a}, nil
	}
	port, err := strconv.ParseUint(tok, 10, 16)
	if err != nil {
		return Value{}, fmt.Errorf("bad key component %q", tok)
	}
	return Value{Port: uint16(port)}, nil
}

func (p *tokens) verdict() (Verdict, error) {
	v := Verdict{Kind: VerdictKind(p.next())}
	switch v.Kind {
	case Accept, Drop, Return:
	case Jump, Goto:
		c, err := p.name()
		if err != nil {
			return v, err
		}
		v.Chain = c
	default:
		return v, fmt.Errorf("unknown verdict %q", v.Kind)
	}
	return v, nil
}

func (p *tokens) element(kind OpKind) (*Element, error) {
	set, err := p.name()
	if err != nil {
		return nil, err
	}
	e := &Element{Set: set}
	if err := p.expect("{"); err != nil {
		return nil, err
	}
	// An endpoint map element: "[ADDR . PORT . ]INDEX : ADDR . PORT".
	keyed := p.peekAt(5) == ":" && p.peekAt(1) == "." && p.peekAt(3) == "."
	if p.peekAt(1) == ":" || keyed {
		at := 2
		if keyed {
			at = 6
		}
		if a, err := netip.ParseAddr(p.peekAt(at)); err == nil {
			if keyed {
				svc, err := netip.ParseAddr(p.next())
				if err != nil {
					return nil, fmt.Errorf("endpoint map key: %w", err)
				}
				p.next()
				port, err := strconv.ParseUint(p.next(), 10, 16)
				if err != nil {
					return nil, fmt.Errorf("endpoint map key: %w", err)
				}
				p.next()
				e.Key = []Value{{Addr: svc}, {Port: uint16(port)}}
			}
			idx, err := strconv.ParseUint(p.next(), 10, 32)
			if err != nil {
				return nil, fmt.Errorf("endpoint map key: %w", err)
			}
			p.next()
			p.next()
			if err := p.expect("."); err != nil {
				return nil, err
			}
			port, err := strconv.ParseUint(p.next(), 10, 16)
			if err != nil {
				return nil, fmt.Errorf("endpoint map port: %w", err)
			}
			e.Index, e.To = uint32(idx), netip.AddrPortFrom(a, uint16(port))
			return e, p.expect("}")
		}
	}
	for {
		v, err := ParseValue(p.next())
		if err != nil {
			return nil, err
		}
		e.Key = append(e.Key, v)
		if p.peek() != "." {
			break
		}
		p.next()
	}
	if p.peek() == "comment" {
		p.next()
		if e.Comment, err = p.str(); err != nil {
			return nil, err
		}
	}
	if p.peek() == ":" {
		p.next()
		v, err := p.verdict()
		if err != nil {
			return nil, err
		}
		e.Verdict = &v
	}
	return e, p.expect("}")
}

func parseProto(tok string) (v1.Protocol, error) {
	switch tok {
	case "tcp", "udp", "sctp":
		return v1.Protocol(strings.ToUpper(tok)), nil
	}
	return "", fmt.Errorf("unknown protocol %q", tok)
}

func parsePrefix(tok string) (netip.Prefix, error) {
	if strings.Contains(tok, "/") {
		return netip.ParsePrefix(tok)
	}
	a, err := netip.ParseAddr(tok)
	if err != nil {
		return netip.Prefix{}, err
	}
	return netip.PrefixFrom(a, a.BitLen()), nil
}

func parseMask(tok string) (uint32, error) {
	v, err := strconv.ParseUint(tok, 0, 32)
	return uint32(v), err
}

// field parses one lookup field ("ip daddr", "meta l4proto", "th dport").
func (p *tokens) field(fam Family) (Field, error) {
	a, b := p.next(), p.next()
	switch {
	case (a == "ip" || a == "ip6") && Family(a) == fam && b == "daddr":
		return FieldDaddr, nil
	case (a == "ip" || a == "ip6") && Family(a) == fam && b == "saddr":
		return FieldSaddr, nil
	case a == "meta" && b == "l4proto":
		return FieldL4Proto, nil
	case a == "th" && b == "dport":
		return FieldDport, nil
	}
	return "", fmt.Errorf("unknown field %q %q", a, b)
}

// vmapRest parses ". FIELD ... vmap @MAP" after the first field.
func (p *tokens) vmapRest(fam Family, first Field) (Stmt, error) {
	s := VmapLookup{Fields: []Field{first}}
	for p.peek() == "." {
		p.next()
		f, err := p.field(fam)
		if err != nil {
			return nil, err
		}
		s.Fields = append(s.Fields, f)
	}
	if strings.HasPrefix(p.peek(), "@") && len(s.Fields) > 1 {
		// "FIELD . FIELD @set": a membership test, not a vmap.
		return MatchInSet{Fields: s.Fields, Set: p.next()[1:]}, nil
	}
	if err := p.expect("vmap"); err != nil {
		return nil, err
	}
	m := p.next()
	if !strings.HasPrefix(m, "@") {
		return nil, fmt.Errorf("expected @map, found %q", m)
	}
	s.Map = m[1:]
	return s, nil
}

func (p *tokens) rule(fam Family) (*Rule, error) {
	chain, err := p.name()
	if err != nil {
		return nil, err
	}
	r := &Rule{Chain: chain}
	for !p.done() {
		if p.peek() == "comment" {
			p.next()
			if r.Comment, err = p.str(); err != nil {
				return nil, err
			}
			continue
		}
		s, err := p.stmt(fam)
		if err != nil {
			return nil, err
		}
		r.Stmts = append(r.Stmts, s)
	}
	return r, nil
}

func (p *tokens) stmt(fam Family) (Stmt, error) {
	switch tok := p.peek(); tok {
	case "ct":
		p.next()
		return MatchCtStateNew{}, p.expect("state", "new")
	case "ip", "ip6":
		f, err := p.field(fam)
		if err != nil {
			return nil, err
		}
		if p.peek() == "." || p.peek() == "vmap" {
			return p.vmapRest(fam, f)
		}
		s := MatchAddr{Source: f == FieldSaddr}
		if p.peek() == "!=" {
			p.next()
			s.Negate = true
		}
		switch v := p.next(); {
		case strings.HasPrefix(v, "@"):
			s.Set = v[1:]
		case v == "{":
			for {
				pfx, err := parsePrefix(p.next())
				if err != nil {
					return nil, err
				}
				s.Prefixes = append(s.Prefixes, pfx)
				if p.peek() != "," {
					break
				}
				p.next()
			}
			if err := p.expect("}"); err != nil {
				return nil, err
			}
		default:
			pfx, err := parsePrefix(v)
			if err != nil {
				return nil, err
			}
			s.Prefixes = []netip.Prefix{pfx}
		}
		return s, nil
	case "meta":
		switch p.peekAt(1) {
		case "l4proto":
			if p.peekAt(2) == "." || p.peekAt(2) == "vmap" {
				f, _ := p.field(fam)
				return p.vmapRest(fam, f)
			}
			p.next()
			p.next()
			proto, err := parseProto(p.next())
			if err != nil {
				return nil, err
			}
			if p.peek() != "dnat" {
				return MatchL4Proto{Proto: proto}, nil
			}
			p.next()
			if p.peek() == addrKeyword(fam) {
				// "dnat ip to numgen random mod N offset O map @M"
				p.next()
				if p.peekAt(1) == addrKeyword(fam) {
					// "dnat ip to ip daddr . th dport . numgen random mod N map @M"
					p.next()
					if err := p.expect(addrKeyword(fam), "daddr", ".", "th", "dport", ".", "numgen", "random", "mod"); err != nil {
						return nil, err
					}
					mod, err := strconv.ParseUint(p.next(), 10, 32)
					if err != nil {
						return nil, err
					}
					if err := p.expect("map"); err != nil {
						return nil, err
					}
					m := p.next()
					if !strings.HasPrefix(m, "@") {
						return nil, fmt.Errorf("expected @map, found %q", m)
					}
					return DNATByService{Proto: proto, Mod: uint32(mod), Map: m[1:]}, nil
				}
				if err := p.expect("to", "numgen", "random", "mod"); err != nil {
					return nil, err
				}
				mod, err := strconv.ParseUint(p.next(), 10, 32)
				if err != nil {
					return nil, err
				}
				// nft lists "offset 0" as nothing.
				var off uint64
				if p.peek() == "offset" {
					p.next()
					if off, err = strconv.ParseUint(p.next(), 10, 32); err != nil {
						return nil, err
					}
				}
				if err := p.expect("map"); err != nil {
					return nil, err
				}
				m := p.next()
				if !strings.HasPrefix(m, "@") {
					return nil, fmt.Errorf("expected @map, found %q", m)
				}
				return DNATMap{Proto: proto, Mod: uint32(mod), Offset: uint32(off), Map: m[1:]}, nil
			}
			if err := p.expect("to"); err != nil {
				return nil, err
			}
			to, err := netip.ParseAddrPort(p.next())
			if err != nil {
				return nil, err
			}
			return DNAT{Proto: proto, To: to}, nil
		case "mark":
			p.next()
			p.next()
			if p.peek() == "&" {
				p.next()
				mask, err := parseMask(p.next())
				if err != nil {
					return nil, err
				}
				return MatchMarkZero{Mask: mask}, p.expect("==", "0")
			}
			if err := p.expect("set", "meta", "mark"); err != nil {
				return nil, err
			}
			opTok := p.next()
			mask, err := parseMask(p.next())
			if err != nil {
				return nil, err
			}
			switch opTok {
			case "|":
				return SetMarkOr{Mask: mask}, nil
			case "^":
				return SetMarkXor{Mask: mask}, nil
			}
			return nil, fmt.Errorf("unknown mark operation %q", opTok)
		}
	case "th":
		f, err := p.field(fam)
		if err != nil {
			return nil, err
		}
		return p.vmapRest(fam, f)
	case "tcp", "udp", "sctp":
		p.next()
		proto, _ := parseProto(tok)
		if err := p.expect("dport"); err != nil {
			return nil, err
		}
		port, err := strconv.ParseUint(p.next(), 10, 16)
		if err != nil {
			return nil, err
		}
		return MatchDport{Proto: proto, Port: uint16(port)}, nil
	case "fib":
		p.next()
		src := p.next()
		if src != "saddr" && src != "daddr" {
			return nil, fmt.Errorf("unknown fib input %q", src)
		}
		return MatchFibLocal{Source: src == "saddr"}, p.expect("type", "local")
	case "iifname":
		p.next()
		s := MatchIifname{}
		if p.peek() == "!=" {
			p.next()
			s.Negate = true
		}
		name, err := p.str()
		if err != nil {
			return nil, err
		}
		if strings.HasSuffix(name, "*") {
			s.Prefix = true
			name = strings.TrimSuffix(name, "*")
		}
		s.Name = name
		return s, nil
	case "masquerade":
		p.next()
		return Masquerade{}, p.expect("fully-random")
	case "update":
		p.next()
		set := p.next()
		if !strings.HasPrefix(set, "@") {
			return nil, fmt.Errorf("expected @set, found %q", set)
		}
		if err := p.expect("{", addrKeyword(fam), "saddr", "}"); err != nil {
			return nil, err
		}
		return UpdateSaddr{Set: set[1:]}, nil
	case "numgen":
		p.next()
		if err := p.expect("random", "mod"); err != nil {
			return nil, err
		}
		n, err := strconv.Atoi(p.next())
		if err != nil {
			return nil, err
		}
		if p.peek() != "vmap" {
			v, err := strconv.ParseUint(p.next(), 10, 32)
			if err != nil {
				return nil, fmt.Errorf("numgen: expected vmap or a value: %w", err)
			}
			return MatchNumgen{Mod: uint32(n), Value: uint32(v)}, nil
		}
		if err := p.expect("vmap", "{"); err != nil {
			return nil, err
		}
		s := NumgenVmap{}
		for i := 0; i < n; i++ {
			if i > 0 {
				if err := p.expect(","); err != nil {
					return nil, err
				}
			}
			if err := p.expect(strconv.Itoa(i), ":", "goto"); err != nil {
				return nil, err
			}
			c, err := p.name()
			if err != nil {
				return nil, err
			}
			s.Chains = append(s.Chains, c)
		}
		return s, p.expect("}")
	case "reject":
		p.next()
		return Reject{}, nil
	case "counter":
		p.next()
		return Counter{}, nil
	case "accept", "drop", "return", "jump", "goto":
		return p.verdict()
	}
	return nil, fmt.Errorf("unknown statement at %q", p.peek())
}
