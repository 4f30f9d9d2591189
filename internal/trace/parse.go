package trace

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/kernel/nft"
)

// ParseNFT parses nftables text and returns the resulting state. The text
// is a sequence of operations in the `nft -f` form the nft package prints
// (one "add|insert|create|flush|delete table|chain|set|map|element|rule ..."
// per line), typically a full sync followed by partial syncs; operations
// apply in order. Tables in the nested form `nft list table` prints
// ("table ip kube-proxy { ... }") are accepted too. Only the ip and ip6
// families and the statements kproxy writes are understood; anything else
// is an error naming the line.
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
	lines := strings.Split(text, "\n")
	for i := 0; i < len(lines); i++ {
		raw := strings.TrimSpace(lines[i])
		toks, err := tokenize(raw)
		if err != nil {
			return &ParseError{Line: i + 1, Text: raw, Err: err}
		}
		if len(toks) == 0 {
			continue
		}
		if !toks[0].quoted && toks[0].s == "table" {
			// Nested `nft list` form: consumes lines up to its closing brace.
			next, err := work.applyNested(lines, i)
			if err != nil {
				return err
			}
			i = next
			continue
		}
		if err := work.applyLine(toks, i+1); err != nil {
			return &ParseError{Line: i + 1, Text: raw, Err: err}
		}
	}
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

// applyLine applies one flat operation.
func (r *Ruleset) applyLine(toks []token, line int) error {
	c := &cursor{toks: toks}
	verb, err := c.expect("add", "insert", "create", "flush", "delete")
	if err != nil {
		return err
	}
	obj, err := c.expect("table", "chain", "set", "map", "element", "rule")
	if err != nil {
		return err
	}
	fam, err := c.word("family")
	if err != nil {
		return err
	}
	f := nft.Family(fam)
	if f != nft.IPv4 && f != nft.IPv6 {
		return fmt.Errorf("unsupported family %q (only ip and ip6)", fam)
	}
	tname, err := c.word("table name")
	if err != nil {
		return err
	}
	if verb == "insert" && obj != "rule" {
		return fmt.Errorf("insert only applies to rules")
	}
	t := r.table(f, tname)
	if obj == "table" {
		return r.tableOp(verb, f, tname, t, c)
	}
	if t == nil {
		return fmt.Errorf("no table %s %s", f, tname)
	}
	switch obj {
	case "chain":
		return t.chainOp(verb, c, line)
	case "set", "map":
		return t.setOp(verb, obj == "map", c, line)
	case "element":
		return t.elementOp(verb, c, line)
	default:
		return t.ruleOp(verb, c, line)
	}
}

func (r *Ruleset) tableOp(verb string, f nft.Family, name string, t *table, c *cursor) error {
	switch verb {
	case "add", "create":
		if t != nil && verb == "create" {
			return fmt.Errorf("table %s %s exists", f, name)
		}
		if t == nil {
			t = newTable(f, name)
			t.gen = r.gen
			r.tables = append(r.tables, t)
		}
		if c.accept("{") {
			if err := parseBlock(c, func(c *cursor, key string) error {
				switch key {
				case "comment":
					s, err := c.quoted("comment")
					t.comment = s
					return err
				}
				// Flags (dormant, owner...) change whether and for whom the
				// table runs: refuse them rather than trace something else.
				return fmt.Errorf("unsupported table attribute %q", key)
			}); err != nil {
				return err
			}
		}
		return c.end()
	case "flush":
		if t == nil {
			return fmt.Errorf("no table %s %s", f, name)
		}
		// Like nft: flushing a table removes the rules of all its chains,
		// and keeps chains, sets and set elements.
		for _, ch := range t.chains {
			ch.rules = nil
		}
		return c.end()
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
		return c.end()
	}
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
	nft.HookPrerouting: true, nft.HookInput: true, nft.HookForward: true, nft.HookOutput: true, nft.HookPostrouting: true,
}

// parseChainSpec parses "{ type T hook H priority P ; policy X ; comment C ; }".
func parseChainSpec(c *cursor, ch *chain) error {
	return parseBlock(c, func(c *cursor, key string) error {
		switch key {
		case "type":
			typ, err := c.expect(nft.TypeFilter, nft.TypeNAT)
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
			if typ == nft.TypeNAT && hook == nft.HookForward {
				return errors.New("nat chains cannot use the forward hook")
			}
			ch.def.Type, ch.def.Hook, ch.def.Priority = typ, hook, prio
			return nil
		case "policy":
			p, err := c.expect("accept", "drop")
			ch.policy = nft.VerdictKind(p)
			return err
		case "comment":
			s, err := c.quoted("comment")
			ch.def.Comment = s
			return err
		}
		return fmt.Errorf("unknown chain attribute %q", key)
	})
}

func (t *table) chainOp(verb string, c *cursor, line int) error {
	name, err := c.word("chain name")
	if err != nil {
		return err
	}
	ch := t.chains[name]
	switch verb {
	case "add", "create":
		if ch != nil && verb == "create" {
			return fmt.Errorf("chain %q exists", name)
		}
		spec := &chain{def: nft.Chain{Name: name}, policy: nft.Accept, line: line}
		if c.accept("{") {
			if err := parseChainSpec(c, spec); err != nil {
				return err
			}
		}
		if err := c.end(); err != nil {
			return err
		}
		if spec.policy == nft.Drop && !spec.base() {
			return fmt.Errorf("policy on regular chain %q", name)
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
	case "flush":
		if ch == nil {
			return fmt.Errorf("no chain %q", name)
		}
		ch.rules = nil
		return c.end()
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
		return c.end()
	}
}

var dataTypes = map[string]nft.DataType{
	"ipv4_addr": nft.TypeIPv4Addr, "ipv6_addr": nft.TypeIPv6Addr,
	"inet_proto": nft.TypeInetProto, "inet_service": nft.TypeInetService,
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

// parseSetSpec parses "{ type K [. K]... [: verdict] ; flags ... ; timeout
// T ; comment C ; elements = { ... } }".
func parseSetSpec(c *cursor, s *set, isMap bool, at origin) error {
	var elems []*element
	err := parseBlock(c, func(c *cursor, key string) error {
		switch key {
		case "typeof":
			// Only endpoint maps: "typeof numgen random mod 1 : ip daddr .
			// tcp dport", or keyed by service "typeof ip daddr . tcp dport
			// . numgen random mod 1 : ip daddr . tcp dport".
			if c.accept(addrKeyword(s.family)) {
				if _, err := c.expect("daddr"); err != nil {
					return err
				}
				if _, err := c.expect("."); err != nil {
					return err
				}
				pw, err := c.word("protocol")
				if err != nil {
					return err
				}
				proto, err := parseProto(pw)
				if err != nil {
					return err
				}
				for _, w := range []string{"dport", "."} {
					if _, err := c.expect(w); err != nil {
						return err
					}
				}
				s.def.Endpoints, s.def.ByService = proto, true
			}
			keyProto := s.def.Endpoints
			if _, err := c.expect("numgen"); err != nil {
				return err
			}
			for _, w := range []string{"random", "mod", "1", ":", addrKeyword(s.family), "daddr", "."} {
				if _, err := c.expect(w); err != nil {
					return err
				}
			}
			pw, err := c.word("protocol")
			if err != nil {
				return err
			}
			proto, err := parseProto(pw)
			if err != nil {
				return err
			}
			if keyProto != "" && keyProto != proto {
				return fmt.Errorf("endpoint map keyed by %s ports maps to %s ports", nft.ProtoName(keyProto), pw)
			}
			s.def.Endpoints = proto
			_, err = c.expect("dport")
			return err
		case "type":
			s.def.Key = nil
			for {
				w, err := c.word("data type")
				if err != nil {
					return err
				}
				dt, ok := dataTypes[w]
				if !ok {
					return fmt.Errorf("unsupported data type %q", w)
				}
				s.def.Key = append(s.def.Key, dt)
				if !c.accept(".") {
					break
				}
			}
			if c.accept(":") {
				if _, err := c.expect(string(nft.TypeVerdict)); err != nil {
					return err
				}
				s.def.Data = nft.TypeVerdict
			}
			return nil
		case "flags":
			for {
				f, err := c.expect("interval", "dynamic", "timeout", "constant")
				if err != nil {
					return err
				}
				switch f {
				case "interval":
					s.def.Interval = true
				case "dynamic":
					s.def.Dynamic = true
				}
				if !c.accept(",") {
					return nil
				}
			}
		case "timeout", "gc-interval":
			w, err := c.word(key)
			if err != nil {
				return err
			}
			d, err := parseDuration(w)
			if key == "timeout" {
				s.def.Timeout = d
			}
			return err
		case "size":
			w, err := c.word("size")
			if err == nil {
				_, err = strconv.ParseUint(w, 10, 32)
			}
			return err
		case "policy":
			_, err := c.expect("performance", "memory")
			return err
		case "comment":
			str, err := c.quoted("comment")
			s.def.Comment = str
			return err
		case "elements":
			if _, err := c.expect("="); err != nil {
				return err
			}
			if _, err := c.expect("{"); err != nil {
				return err
			}
			var err error
			elems, err = parseElements(c, s, true, at)
			return err
		}
		return fmt.Errorf("unknown set attribute %q", key)
	})
	if err != nil {
		return err
	}
	if len(s.def.Key) == 0 && s.def.Endpoints == "" {
		return errors.New("set without type")
	}
	if isMap != s.def.IsMap() {
		if isMap {
			return errors.New("map without value type")
		}
		return errors.New("set with a value type (use map)")
	}
	for _, e := range elems {
		s.add(e)
	}
	return nil
}

func (t *table) setOp(verb string, isMap bool, c *cursor, line int) error {
	name, err := c.word("set name")
	if err != nil {
		return err
	}
	s := t.sets[name]
	switch verb {
	case "add", "create":
		if s != nil && verb == "create" {
			return fmt.Errorf("set %q exists", name)
		}
		spec := &set{def: nft.Set{Name: name}, index: map[string]int{}, line: line, family: t.family}
		if _, err := c.expect("{"); err != nil {
			return err
		}
		if err := parseSetSpec(c, spec, isMap, origin{line, t.gen}); err != nil {
			return err
		}
		if err := c.end(); err != nil {
			return err
		}
		if s == nil {
			t.sets[name] = spec
			t.sorder = append(t.sorder, name)
			return nil
		}
		if !slices.Equal(s.def.Key, spec.def.Key) || s.def.Data != spec.def.Data || s.def.Endpoints != spec.def.Endpoints || s.def.ByService != spec.def.ByService || s.def.Interval != spec.def.Interval {
			return fmt.Errorf("set %q exists with a different type or flags", name)
		}
		for _, e := range spec.elems {
			s.add(e)
		}
		return nil
	case "flush":
		// "flush set" and "flush map" both work on either (the nft
		// package names the kind from the object it was given).
		if s == nil {
			return fmt.Errorf("no set or map %q", name)
		}
		s.flush()
		return c.end()
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
		return c.end()
	}
}

func (t *table) elementOp(verb string, c *cursor, line int) error {
	if verb == "flush" {
		return errors.New("flush element is not an operation (flush the set)")
	}
	name, err := c.word("set name")
	if err != nil {
		return err
	}
	s := t.sets[name]
	if s == nil {
		return fmt.Errorf("no set or map %q", name)
	}
	if _, err := c.expect("{"); err != nil {
		return err
	}
	elems, err := parseElements(c, s, verb != "delete", origin{line, t.gen})
	if err != nil {
		return err
	}
	if err := c.end(); err != nil {
		return err
	}
	for _, e := range elems {
		switch verb {
		case "add":
			s.add(e)
		case "create":
			if _, ok := s.index[e.id()]; ok {
				return fmt.Errorf("element %s exists in %q", e.id(), name)
			}
			s.add(e)
		default:
			if !s.remove(e.id()) {
				return fmt.Errorf("no element %s in %q", e.id(), name)
			}
		}
	}
	return nil
}

// parseElements reads "KEY [timeout T] [expires T] [comment C] [: VERDICT]
// [, ...] }" after the opening brace. For adds, map elements need a verdict;
// deletes name keys only.
func parseElements(c *cursor, s *set, add bool, at origin) ([]*element, error) {
	var out []*element
	for {
		if c.accept("}") {
			return out, nil
		}
		e := &element{line: at.line, gen: at.gen}
		if s.def.Endpoints != "" {
			if err := parseEndpointElem(c, s, e); err != nil {
				return nil, err
			}
			out = append(out, e)
			if !c.accept(",") {
				if _, err := c.expect("}"); err != nil {
					return nil, err
				}
				return out, nil
			}
			continue
		}
		for i, dt := range s.def.Key {
			if i > 0 {
				if _, err := c.expect("."); err != nil {
					return nil, fmt.Errorf("key of %q has %d fields: %w", s.def.Name, len(s.def.Key), err)
				}
			}
			w, err := c.word("element key")
			if err != nil {
				return nil, err
			}
			v, err := parseValue(dt, w, s.def.Interval)
			if err != nil {
				return nil, fmt.Errorf("element of %q: %w", s.def.Name, err)
			}
			e.key = append(e.key, v)
		}
	attrs:
		for {
			switch c.peek() {
			case "timeout", "expires":
				c.pos++
				w, err := c.word("duration")
				if err != nil {
					return nil, err
				}
				if _, err := parseDuration(w); err != nil {
					return nil, err
				}
			case "comment":
				c.pos++
				str, err := c.quoted("comment")
				if err != nil {
					return nil, err
				}
				e.comment = str
			case ":":
				c.pos++
				v, err := parseVerdict(c)
				if err != nil {
					return nil, err
				}
				e.verdict = &v
			default:
				break attrs
			}
		}
		switch {
		case e.verdict != nil && !s.def.IsMap():
			return nil, fmt.Errorf("element with a value in set %q", s.def.Name)
		case e.verdict == nil && s.def.IsMap() && add:
			return nil, fmt.Errorf("element without a verdict in map %q", s.def.Name)
		}
		out = append(out, e)
		if !c.accept(",") {
			if _, err := c.expect("}"); err != nil {
				return nil, err
			}
			return out, nil
		}
	}
}

// parseEndpointElem reads "INDEX : ADDR . PORT", or "ADDR . PORT . INDEX
// : ADDR . PORT" in a map keyed by service (the data in deletions too, as
// kproxy writes them).
func parseEndpointElem(c *cursor, s *set, e *element) error {
	if s.def.ByService {
		svc, err := parseAddrPort(c, s, "service address")
		if err != nil {
			return err
		}
		if _, err := c.expect("."); err != nil {
			return err
		}
		e.key = []nft.Value{{Addr: svc.Addr()}, {Port: svc.Port()}}
	}
	w, err := c.word("element key")
	if err != nil {
		return err
	}
	idx, err := strconv.ParseUint(w, 10, 32)
	if err != nil {
		return fmt.Errorf("element of %q: bad index %q", s.def.Name, w)
	}
	if _, err := c.expect(":"); err != nil {
		return err
	}
	to, err := parseAddrPort(c, s, "address")
	if err != nil {
		return err
	}
	e.index, e.to = uint32(idx), to
	return nil
}

// parseAddrPort reads "ADDR . PORT" of an element of s, ADDR of s's
// family; what names the address in errors.
func parseAddrPort(c *cursor, s *set, what string) (netip.AddrPort, error) {
	aw, err := c.word(what)
	if err != nil {
		return netip.AddrPort{}, err
	}
	a, err := netip.ParseAddr(aw)
	if err != nil || a.Is4() != (s.family == nft.IPv4) || a.Zone() != "" {
		return netip.AddrPort{}, fmt.Errorf("element of %q: bad %s %q", s.def.Name, what, aw)
	}
	if _, err := c.expect("."); err != nil {
		return netip.AddrPort{}, err
	}
	pw, err := c.word("port")
	if err != nil {
		return netip.AddrPort{}, err
	}
	port, err := parsePort(pw)
	if err != nil {
		return netip.AddrPort{}, err
	}
	return netip.AddrPortFrom(a, port), nil
}

// parseValue reads one key component of data type dt.
func parseValue(dt nft.DataType, w string, interval bool) (nft.Value, error) {
	switch dt {
	case nft.TypeIPv4Addr, nft.TypeIPv6Addr:
		p, err := parsePrefix(w)
		if err != nil {
			return nft.Value{}, err
		}
		if p.Addr().Is4() != (dt == nft.TypeIPv4Addr) {
			return nft.Value{}, fmt.Errorf("%s is not an %s", w, dt)
		}
		if p.IsSingleIP() {
			return nft.Value{Addr: p.Addr()}, nil
		}
		if !interval {
			return nft.Value{}, fmt.Errorf("prefix %s in a set without flags interval", w)
		}
		return nft.Value{Prefix: p}, nil
	case nft.TypeInetProto:
		p, err := parseProto(w)
		return nft.Value{Proto: p}, err
	default:
		n, err := parsePort(w)
		return nft.Value{Port: n}, err
	}
}

// parsePrefix reads an address (a full-length prefix) or a prefix; host
// bits are masked as nft does.
func parsePrefix(w string) (netip.Prefix, error) {
	if strings.Contains(w, "/") {
		p, err := netip.ParsePrefix(w)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("invalid prefix %q", w)
		}
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(w)
	if err != nil || a.Zone() != "" {
		return netip.Prefix{}, fmt.Errorf("invalid address %q", w)
	}
	return netip.PrefixFrom(a, a.BitLen()), nil
}

func parseProto(w string) (v1.Protocol, error) {
	switch w {
	case "tcp", "6":
		return v1.ProtocolTCP, nil
	case "udp", "17":
		return v1.ProtocolUDP, nil
	case "sctp", "132":
		return v1.ProtocolSCTP, nil
	}
	return "", fmt.Errorf("unsupported protocol %q", w)
}

func parsePort(w string) (uint16, error) {
	n, err := strconv.ParseUint(w, 10, 16)
	if err != nil {
		return 0, fmt.Errorf("invalid port %q", w)
	}
	return uint16(n), nil
}

func parseVerdict(c *cursor) (nft.Verdict, error) {
	w, err := c.expect("accept", "drop", "return", "jump", "goto")
	if err != nil {
		return nft.Verdict{}, err
	}
	v := nft.Verdict{Kind: nft.VerdictKind(w)}
	if v.Kind == nft.Jump || v.Kind == nft.Goto {
		if v.Chain, err = c.word("chain name"); err != nil {
			return nft.Verdict{}, err
		}
	}
	return v, nil
}

func (t *table) ruleOp(verb string, c *cursor, line int) error {
	name, err := c.word("chain name")
	if err != nil {
		return err
	}
	ch := t.chains[name]
	if ch == nil {
		return fmt.Errorf("no chain %q", name)
	}
	if verb == "delete" && c.accept("handle") {
		w, err := c.word("handle")
		if err != nil {
			return err
		}
		h, err := strconv.Atoi(w)
		if err != nil {
			return fmt.Errorf("invalid handle %q", w)
		}
		for i, ru := range ch.rules {
			if ru.handle == h {
				ch.rules = append(ch.rules[:i:i], ch.rules[i+1:]...)
				return c.end()
			}
		}
		return fmt.Errorf("no rule with handle %d in chain %q", h, name)
	}
	stmts, comment, err := parseRule(c, t.family)
	if err != nil {
		return err
	}
	switch verb {
	case "add", "create":
		t.handle++
		ch.rules = append(ch.rules, &rule{handle: t.handle, stmts: stmts, comment: comment, line: line, gen: t.gen})
	case "insert":
		t.handle++
		ch.rules = append([]*rule{{handle: t.handle, stmts: stmts, comment: comment, line: line, gen: t.gen}}, ch.rules...)
	case "flush":
		return errors.New("flush rule is not an operation (flush the chain)")
	default:
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
	}
	return nil
}
