package nft

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
)

// parseRule reads the statements of a rule and its trailing comment: every
// shape text.go prints, plus the small variations `nft list` prints for
// them ("counter packets N bytes M", "== 0x00000000", "reject with ...").
func parseRule(c *cursor, f Family) ([]Stmt, string, error) {
	var stmts []Stmt
	comment := ""
	final := false // a verdict was seen: only a comment may follow
	for !c.done() {
		if c.toks[c.pos].quoted {
			return nil, "", fmt.Errorf("unexpected quoted string %q", c.toks[c.pos].s)
		}
		w := c.peek()
		if w == "comment" {
			c.pos++
			s, err := c.quoted("comment")
			if err != nil {
				return nil, "", err
			}
			comment = s
			if err := c.end(); err != nil {
				return nil, "", fmt.Errorf("after comment: %w", err)
			}
			break
		}
		if final {
			return nil, "", fmt.Errorf("statement %q after a verdict", w)
		}
		s, err := parseStmt(c, f)
		if err != nil {
			return nil, "", err
		}
		switch s.(type) {
		case Verdict, NumgenVmap, Reject:
			final = true
		}
		stmts = append(stmts, s)
	}
	if len(stmts) == 0 {
		return nil, "", errors.New("rule without statements")
	}
	return stmts, comment, nil
}

func parseStmt(c *cursor, f Family) (Stmt, error) {
	w, _ := c.word("statement")
	switch w {
	case "ct":
		if _, err := c.expect("state"); err != nil {
			return nil, err
		}
		if _, err := c.expect("new"); err != nil {
			return nil, fmt.Errorf("only ct state new is supported: %w", err)
		}
		return MatchCtStateNew{}, nil
	case "ip", "ip6":
		if w != addrKeyword(f) {
			return nil, fmt.Errorf("%q match in a table of family %s", w, f)
		}
		fl, err := c.expect("saddr", "daddr")
		if err != nil {
			return nil, err
		}
		field := FieldDaddr
		if fl == "saddr" {
			field = FieldSaddr
		}
		if p := c.peek(); p == "." || p == "vmap" {
			return parseVmap(c, f, field)
		}
		return parseAddrMatch(c, f, field == FieldSaddr)
	case "meta":
		k, err := c.expect("l4proto", "mark", "iifname")
		if err != nil {
			return nil, err
		}
		switch k {
		case "l4proto":
			if p := c.peek(); p == "." || p == "vmap" {
				return parseVmap(c, f, FieldL4Proto)
			}
			pw, err := c.word("protocol")
			if err != nil {
				return nil, err
			}
			proto, err := parseProto(pw)
			if err != nil {
				return nil, err
			}
			if !c.accept("dnat") {
				return MatchL4Proto{Proto: proto}, nil
			}
			return parseDNAT(c, f, proto)
		case "mark":
			return parseMark(c)
		default:
			return parseIifname(c)
		}
	case "iifname":
		return parseIifname(c)
	case "th":
		if _, err := c.expect("dport"); err != nil {
			return nil, err
		}
		if p := c.peek(); p != "." && p != "vmap" {
			return nil, errors.New("th dport is only supported as a map lookup key")
		}
		return parseVmap(c, f, FieldDport)
	case "tcp", "udp", "sctp":
		if _, err := c.expect("dport"); err != nil {
			return nil, err
		}
		pw, err := c.word("port")
		if err != nil {
			return nil, err
		}
		port, err := parsePort(pw)
		if err != nil {
			return nil, err
		}
		proto, _ := parseProto(w)
		return MatchDport{Proto: proto, Port: port}, nil
	case "fib":
		dir, err := c.expect("saddr", "daddr")
		if err != nil {
			return nil, err
		}
		if _, err := c.expect("type"); err != nil {
			return nil, err
		}
		if _, err := c.expect("local"); err != nil {
			return nil, fmt.Errorf("only fib ... type local is supported: %w", err)
		}
		return MatchFibLocal{Source: dir == "saddr"}, nil
	case "dnat":
		// nft lists "meta l4proto tcp dnat ip to ip daddr . th dport .
		// numgen ..." as "dnat ip to ip daddr . tcp dport . numgen ...":
		// the protocol is that of the port.
		return parseListedDNATByService(c, f)
	case "masquerade":
		// text.go always writes fully-random; a bare masquerade has the
		// same effect on where the packet goes.
		if !c.accept("fully-random") {
			c.drop("masquerade without fully-random")
		}
		return Masquerade{}, nil
	case "update":
		return parseUpdate(c, f)
	case "numgen":
		return parseNumgen(c)
	case "reject":
		if c.accept("with") {
			c.drop("reject with ...")
			// "with tcp reset", "with icmp [type] port-unreachable",
			// "with icmpv6 ...", "with icmpx ...": all reject the packet.
			kind, err := c.expect("tcp", "icmp", "icmpv6", "icmpx")
			if err != nil {
				return nil, err
			}
			if kind == "tcp" {
				if _, err := c.expect("reset"); err != nil {
					return nil, err
				}
			} else {
				c.accept("type")
				if _, err := c.word("icmp code"); err != nil {
					return nil, err
				}
			}
		}
		return Reject{}, nil
	case "counter":
		if c.accept("packets") {
			c.drop("counter values")
			for i, what := range []string{"packet count", "bytes", "byte count"} {
				x, err := c.word(what)
				if err != nil {
					return nil, err
				}
				if i == 1 {
					if x != "bytes" {
						return nil, fmt.Errorf("expected bytes, found %q", x)
					}
				} else if _, err := strconv.ParseUint(x, 10, 64); err != nil {
					return nil, fmt.Errorf("invalid %s %q", what, x)
				}
			}
		}
		return Counter{}, nil
	case "accept", "drop", "return", "jump", "goto":
		c.pos--
		return parseVerdict(c)
	}
	return nil, fmt.Errorf("unsupported statement %q", w)
}

// parseVmap reads the rest of "FIELD [. FIELD]... vmap @MAP", the first
// field already consumed.
func parseVmap(c *cursor, f Family, first Field) (Stmt, error) {
	fields := []Field{first}
	for c.accept(".") {
		w, err := c.word("lookup field")
		if err != nil {
			return nil, err
		}
		var fl Field
		switch w {
		case addrKeyword(f):
			x, err := c.expect("saddr", "daddr")
			if err != nil {
				return nil, err
			}
			fl = Field(x)
		case "meta":
			if _, err := c.expect("l4proto"); err != nil {
				return nil, err
			}
			fl = FieldL4Proto
		case "th":
			if _, err := c.expect("dport"); err != nil {
				return nil, err
			}
			fl = FieldDport
		default:
			return nil, fmt.Errorf("unsupported lookup field %q", w)
		}
		fields = append(fields, fl)
	}
	if p := c.peek(); len(fields) > 1 && strings.HasPrefix(p, "@") && len(p) > 1 {
		// "FIELD . FIELD @set": membership of the concatenation.
		c.word("@set")
		return MatchInSet{Fields: fields, Set: p[1:]}, nil
	}
	if _, err := c.expect("vmap"); err != nil {
		return nil, err
	}
	m, err := c.word("@map")
	if err != nil {
		return nil, err
	}
	if !strings.HasPrefix(m, "@") || len(m) == 1 {
		return nil, fmt.Errorf("only named verdict maps (@name) are supported, found %q", m)
	}
	return VmapLookup{Fields: fields, Map: m[1:]}, nil
}

// parseAddrMatch reads "[!=] ADDR|PREFIX|{ A, B/n }|@SET".
func parseAddrMatch(c *cursor, f Family, source bool) (Stmt, error) {
	m := MatchAddr{Source: source}
	if c.accept("!=") {
		m.Negate = true
	} else {
		c.accept("==")
	}
	w, err := c.word("address, prefix, { list } or @set")
	if err != nil {
		return nil, err
	}
	switch {
	case strings.HasPrefix(w, "@") && len(w) > 1:
		m.Set = w[1:]
		return m, nil
	case w == "{":
		for {
			x, err := c.word("address or prefix")
			if err != nil {
				return nil, err
			}
			p, err := familyPrefix(f, x)
			if err != nil {
				return nil, err
			}
			m.Prefixes = append(m.Prefixes, p)
			if !c.accept(",") {
				break
			}
			if c.peek() == "}" {
				break
			}
		}
		if _, err := c.expect("}"); err != nil {
			return nil, err
		}
		return m, nil
	}
	p, err := familyPrefix(f, w)
	if err != nil {
		return nil, err
	}
	m.Prefixes = []netip.Prefix{p}
	return m, nil
}

func familyPrefix(f Family, w string) (netip.Prefix, error) {
	p, err := parsePrefix(w)
	if err != nil {
		return p, err
	}
	if p.Addr().Is4() != (f == IPv4) {
		return p, fmt.Errorf("address %s in a table of family %s", w, f)
	}
	return p, nil
}

// parseMark reads the rest of "meta mark & MASK == 0" or "meta mark set meta
// mark |/^ MASK".
func parseMark(c *cursor) (Stmt, error) {
	op, err := c.expect("&", "set")
	if err != nil {
		return nil, err
	}
	if op == "&" {
		mask, err := parseMask(c)
		if err != nil {
			return nil, err
		}
		if _, err := c.expect("=="); err != nil {
			return nil, err
		}
		v, err := parseMask(c)
		if err != nil {
			return nil, err
		}
		if v != 0 {
			return nil, errors.New("only meta mark & MASK == 0 is supported")
		}
		return MatchMarkZero{Mask: mask}, nil
	}
	if _, err := c.expect("meta"); err != nil {
		return nil, err
	}
	if _, err := c.expect("mark"); err != nil {
		return nil, err
	}
	bop, err := c.expect("|", "^", "or", "xor")
	if err != nil {
		return nil, err
	}
	mask, err := parseMask(c)
	if err != nil {
		return nil, err
	}
	if bop == "|" || bop == "or" {
		return SetMarkOr{Mask: mask}, nil
	}
	return SetMarkXor{Mask: mask}, nil
}

func parseMask(c *cursor) (uint32, error) {
	w, err := c.word("mark value")
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseUint(w, 0, 32)
	if err != nil {
		return 0, fmt.Errorf("invalid mark value %q", w)
	}
	return uint32(n), nil
}

func parseIifname(c *cursor) (Stmt, error) {
	m := MatchIifname{}
	if c.accept("!=") {
		m.Negate = true
	}
	name, err := c.quoted("interface name")
	if err != nil {
		return nil, err
	}
	// A trailing '*' is nft's interface wildcard (it escapes a literal one
	// as "\*", which kproxy never writes).
	if strings.HasSuffix(name, "*") {
		m.Prefix = true
		name = strings.TrimSuffix(name, "*")
	}
	if name == "" && !m.Prefix {
		return nil, errors.New("empty interface name")
	}
	m.Name = name
	return m, nil
}

// parseDNAT reads the rest of "meta l4proto P dnat [ip|ip6] to ADDR:PORT".
func parseDNAT(c *cursor, f Family, proto v1.Protocol) (Stmt, error) {
	if p := c.peek(); p == "ip" || p == "ip6" {
		if p != addrKeyword(f) {
			return nil, fmt.Errorf("dnat %s in a table of family %s", p, f)
		}
		c.pos++
	}
	if _, err := c.expect("to"); err != nil {
		return nil, err
	}
	if c.accept("numgen") {
		return parseDNATMap(c, proto)
	}
	if c.accept(addrKeyword(f)) {
		return parseDNATByService(c, proto)
	}
	w, err := c.word("address:port")
	if err != nil {
		return nil, err
	}
	ap, err := netip.ParseAddrPort(w)
	if err != nil {
		return nil, fmt.Errorf("invalid dnat destination %q (want addr:port or [addr6]:port)", w)
	}
	if ap.Addr().Is4() != (f == IPv4) || ap.Addr().Zone() != "" {
		return nil, fmt.Errorf("dnat destination %s in a table of family %s", w, f)
	}
	return DNAT{Proto: proto, To: ap}, nil
}

// parseDNATMap reads the rest of "dnat ip to numgen random mod N offset
// O map @MAP" after numgen.
func parseDNATMap(c *cursor, proto v1.Protocol) (Stmt, error) {
	var nums [2]uint64
	for i, kw := range []string{"mod", "offset"} {
		if i == 0 {
			if _, err := c.expect("random"); err != nil {
				return nil, err
			}
		}
		// nft lists "offset 0" as nothing.
		if kw == "offset" && !c.accept(kw) {
			continue
		}
		if kw == "mod" {
			if _, err := c.expect(kw); err != nil {
				return nil, err
			}
		}
		w, err := c.word(kw)
		if err != nil {
			return nil, err
		}
		if nums[i], err = strconv.ParseUint(w, 10, 32); err != nil {
			return nil, fmt.Errorf("invalid numgen %s %q", kw, w)
		}
	}
	if nums[0] == 0 || nums[0]+nums[1] > 1<<32 {
		return nil, fmt.Errorf("numgen mod %d offset %d out of range", nums[0], nums[1])
	}
	m, err := parseMapRef(c)
	if err != nil {
		return nil, err
	}
	return DNATMap{Proto: proto, Mod: uint32(nums[0]), Offset: uint32(nums[1]), Map: m}, nil
}

// parseMapRef reads "map @MAP" and returns MAP.
func parseMapRef(c *cursor) (string, error) {
	if _, err := c.expect("map"); err != nil {
		return "", err
	}
	m, err := c.word("@map")
	if err != nil {
		return "", err
	}
	if !strings.HasPrefix(m, "@") || len(m) == 1 {
		return "", fmt.Errorf("expected @map, found %q", m)
	}
	return m[1:], nil
}

// parseDNATByService reads the rest of "dnat ip to ip daddr . th dport .
// numgen random mod N map @MAP" after the second "ip".
func parseDNATByService(c *cursor, proto v1.Protocol) (Stmt, error) {
	for _, w := range []string{"daddr", ".", "th", "dport", ".", "numgen", "random", "mod"} {
		if _, err := c.expect(w); err != nil {
			return nil, err
		}
	}
	return parseModMap(c, proto)
}

// parseModMap reads "N map @MAP" after "numgen random mod" of a dnat to
// an endpoint map keyed by service.
func parseModMap(c *cursor, proto v1.Protocol) (Stmt, error) {
	w, err := c.word("mod")
	if err != nil {
		return nil, err
	}
	mod, err := strconv.ParseUint(w, 10, 32)
	if err != nil || mod == 0 {
		return nil, fmt.Errorf("invalid numgen mod %q", w)
	}
	m, err := parseMapRef(c)
	if err != nil {
		return nil, err
	}
	return DNATByService{Proto: proto, Mod: uint32(mod), Map: m}, nil
}

// parseListedDNATByService reads the rest of "dnat ip to ip daddr . tcp
// dport . numgen random mod N map @MAP", nft's listing of DNATByService.
func parseListedDNATByService(c *cursor, f Family) (Stmt, error) {
	for _, w := range []string{addrKeyword(f), "to", addrKeyword(f), "daddr", "."} {
		if _, err := c.expect(w); err != nil {
			return nil, fmt.Errorf("only dnat to an endpoint map keyed by service is supported here: %w", err)
		}
	}
	pw, err := c.word("protocol")
	if err != nil {
		return nil, err
	}
	proto, err := parseProto(pw)
	if err != nil {
		return nil, err
	}
	for _, w := range []string{"dport", ".", "numgen", "random", "mod"} {
		if _, err := c.expect(w); err != nil {
			return nil, err
		}
	}
	return parseModMap(c, proto)
}

// parseUpdate reads the rest of "update @SET { ip saddr }".
func parseUpdate(c *cursor, f Family) (Stmt, error) {
	w, err := c.word("@set")
	if err != nil {
		return nil, err
	}
	if !strings.HasPrefix(w, "@") || len(w) == 1 {
		return nil, fmt.Errorf("expected @set, found %q", w)
	}
	for _, want := range []string{"{", addrKeyword(f), "saddr"} {
		if _, err := c.expect(want); err != nil {
			return nil, fmt.Errorf("only update @set { %s saddr } is supported: %w", addrKeyword(f), err)
		}
	}
	// nft list prints the element timeout of the update when the set has
	// none; kproxy's sets carry it, so nothing else may follow.
	if _, err := c.expect("}"); err != nil {
		return nil, err
	}
	return UpdateSaddr{Set: w[1:]}, nil
}

// parseNumgen reads the rest of "numgen random mod N vmap { 0 : goto C0, ... }".
func parseNumgen(c *cursor) (Stmt, error) {
	if _, err := c.expect("random"); err != nil {
		return nil, err
	}
	if _, err := c.expect("mod"); err != nil {
		return nil, err
	}
	nw, err := c.word("modulus")
	if err != nil {
		return nil, err
	}
	n, err := strconv.Atoi(nw)
	if err != nil || n < 1 || n > 1<<20 {
		return nil, fmt.Errorf("invalid numgen modulus %q", nw)
	}
	if c.peek() != "vmap" {
		vw, err := c.word("numgen value")
		if err != nil {
			return nil, err
		}
		v, err := strconv.Atoi(vw)
		if err != nil || v < 0 || v >= n {
			return nil, fmt.Errorf("numgen value %q out of 0..%d", vw, n-1)
		}
		return MatchNumgen{Mod: uint32(n), Value: uint32(v)}, nil
	}
	for _, want := range []string{"vmap", "{"} {
		if _, err := c.expect(want); err != nil {
			return nil, err
		}
	}
	chains := make([]string, n)
	for {
		iw, err := c.word("index")
		if err != nil {
			return nil, err
		}
		i, err := strconv.Atoi(iw)
		if err != nil || i < 0 || i >= n {
			return nil, fmt.Errorf("numgen index %q out of 0..%d", iw, n-1)
		}
		if chains[i] != "" {
			return nil, fmt.Errorf("numgen index %d given twice", i)
		}
		if _, err := c.expect(":"); err != nil {
			return nil, err
		}
		if _, err := c.expect("goto"); err != nil {
			return nil, fmt.Errorf("numgen branches must goto a chain: %w", err)
		}
		if chains[i], err = c.word("chain name"); err != nil {
			return nil, err
		}
		if !c.accept(",") || c.peek() == "}" {
			break
		}
	}
	if _, err := c.expect("}"); err != nil {
		return nil, err
	}
	for i, ch := range chains {
		if ch == "" {
			return nil, fmt.Errorf("numgen index %d has no branch", i)
		}
	}
	return NumgenVmap{Chains: chains}, nil
}
