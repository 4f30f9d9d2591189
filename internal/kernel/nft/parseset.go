package nft

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
)

var dataTypes = map[string]DataType{
	"ipv4_addr": TypeIPv4Addr, "ipv6_addr": TypeIPv6Addr,
	"inet_proto": TypeInetProto, "inet_service": TypeInetService,
}

// parseSet reads "NAME [{ type K [. K]... [: verdict] ; flags ... ;
// timeout T ; comment C ; elements = { ... } }]" (the block, required,
// only when add) and returns the set and the elements its block lists.
func parseSet(c *cursor, f Family, add, isMap bool) (*Set, []*Element, error) {
	name, err := c.word("set name")
	if err != nil {
		return nil, nil, err
	}
	s := &Set{Name: name}
	if !add {
		if isMap {
			s.Data = TypeVerdict // flush/delete map: only the kind matters
		}
		return s, nil, nil
	}
	if _, err := c.expect("{"); err != nil {
		return nil, nil, err
	}
	var elems []*Element
	err = parseBlock(c, func(c *cursor, key string) error {
		switch key {
		case "typeof":
			// Only endpoint maps: "typeof numgen random mod 1 : ip daddr .
			// tcp dport", or keyed by service "typeof ip daddr . tcp dport
			// . numgen random mod 1 : ip daddr . tcp dport".
			if c.accept(addrKeyword(f)) {
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
				s.Endpoints, s.ByService = proto, true
			}
			keyProto := s.Endpoints
			if _, err := c.expect("numgen"); err != nil {
				return err
			}
			for _, w := range []string{"random", "mod", "1", ":", addrKeyword(f), "daddr", "."} {
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
				return fmt.Errorf("endpoint map keyed by %s ports maps to %s ports", ProtoName(keyProto), pw)
			}
			s.Endpoints = proto
			_, err = c.expect("dport")
			return err
		case "type":
			s.Key = nil
			for {
				w, err := c.word("data type")
				if err != nil {
					return err
				}
				dt, ok := dataTypes[w]
				if !ok {
					return fmt.Errorf("unsupported data type %q", w)
				}
				s.Key = append(s.Key, dt)
				if !c.accept(".") {
					break
				}
			}
			if c.accept(":") {
				if _, err := c.expect(string(TypeVerdict)); err != nil {
					return err
				}
				s.Data = TypeVerdict
			}
			return nil
		case "flags":
			for {
				fl, err := c.expect("interval", "dynamic", "timeout", "constant")
				if err != nil {
					return err
				}
				switch fl {
				case "interval":
					s.Interval = true
				case "dynamic":
					s.Dynamic = true
				case "constant":
					c.drop("flags constant")
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
				s.Timeout = d
			} else {
				c.drop("gc-interval")
			}
			return err
		case "size":
			c.drop("size")
			w, err := c.word("size")
			if err == nil {
				_, err = strconv.ParseUint(w, 10, 32)
			}
			return err
		case "policy":
			c.drop("set policy")
			_, err := c.expect("performance", "memory")
			return err
		case "comment":
			str, err := c.quoted("comment")
			s.Comment = str
			return err
		case "elements":
			if _, err := c.expect("="); err != nil {
				return err
			}
			if _, err := c.expect("{"); err != nil {
				return err
			}
			var err error
			elems, err = parseElements(c, f, name, s, true)
			return err
		}
		return fmt.Errorf("unknown set attribute %q", key)
	})
	if err != nil {
		return nil, nil, err
	}
	if len(s.Key) == 0 && s.Endpoints == "" {
		return nil, nil, errors.New("set without type")
	}
	if isMap != s.IsMap() {
		if isMap {
			return nil, nil, errors.New("map without value type")
		}
		return nil, nil, errors.New("set with a value type (use map)")
	}
	return s, elems, nil
}

// parseElements reads "KEY [timeout T] [expires T] [comment C] [:
// VERDICT] [, ...] }" after the opening brace, the elements of set name
// in a table of family f. def is the set's definition; nil reads the
// elements by their look. For adds, map elements need a verdict; deletes
// name keys only.
func parseElements(c *cursor, f Family, name string, def *Set, add bool) ([]*Element, error) {
	var out []*Element
	for {
		if c.accept("}") {
			return out, nil
		}
		e := &Element{Set: name}
		endpoints, byService := def != nil && def.Endpoints != "", def != nil && def.ByService
		if def == nil {
			endpoints, byService = endpointLook(c)
		}
		if endpoints {
			if err := parseEndpointElem(c, f, name, byService, e); err != nil {
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
		if def != nil {
			for i, dt := range def.Key {
				if i > 0 {
					if _, err := c.expect("."); err != nil {
						return nil, fmt.Errorf("key of %q has %d fields: %w", name, len(def.Key), err)
					}
				}
				w, err := c.word("element key")
				if err != nil {
					return nil, err
				}
				v, err := parseValue(dt, w, def.Interval)
				if err != nil {
					return nil, fmt.Errorf("element of %q: %w", name, err)
				}
				e.Key = append(e.Key, v)
			}
		} else {
			for {
				w, err := c.word("element key")
				if err != nil {
					return nil, err
				}
				v, err := valueByLook(w)
				if err != nil {
					return nil, fmt.Errorf("element of %q: %w", name, err)
				}
				e.Key = append(e.Key, v)
				if !c.accept(".") {
					break
				}
			}
		}
	attrs:
		for {
			switch c.peek() {
			case "timeout", "expires":
				c.drop("element " + c.peek())
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
				e.Comment = str
			case ":":
				c.pos++
				v, err := parseVerdict(c)
				if err != nil {
					return nil, err
				}
				e.Verdict = &v
			default:
				break attrs
			}
		}
		switch {
		case def == nil:
		case e.Verdict != nil && !def.IsMap():
			return nil, fmt.Errorf("element with a value in set %q", name)
		case e.Verdict == nil && def.IsMap() && add:
			return nil, fmt.Errorf("element without a verdict in map %q", name)
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

// endpointLook tells an endpoint map element from others by its look:
// "INDEX : ADDR . PORT", or "ADDR . PORT . INDEX : ADDR . PORT" (keyed
// by service).
func endpointLook(c *cursor) (endpoint, byService bool) {
	at := func(k int) string {
		if c.pos+k < len(c.toks) && !c.toks[c.pos+k].quoted {
			return c.toks[c.pos+k].s
		}
		return ""
	}
	isAddr := func(w string) bool { _, err := netip.ParseAddr(w); return err == nil }
	if at(1) == ":" && isAddr(at(2)) {
		return true, false
	}
	if at(1) == "." && at(3) == "." && at(5) == ":" && isAddr(at(6)) {
		return true, true
	}
	return false, false
}

// valueByLook reads one key component without knowing its type: a
// protocol name, an address, a prefix or a port.
func valueByLook(w string) (Value, error) {
	switch w {
	case "tcp", "udp", "sctp":
		p, _ := parseProto(w)
		return Value{Proto: p}, nil
	}
	if strings.Contains(w, "/") {
		p, err := parsePrefix(w)
		return Value{Prefix: p}, err
	}
	if a, err := netip.ParseAddr(w); err == nil {
		return Value{Addr: a}, nil
	}
	n, err := strconv.ParseUint(w, 10, 16)
	if err != nil {
		return Value{}, fmt.Errorf("bad key component %q", w)
	}
	return Value{Port: uint16(n)}, nil
}

// parseEndpointElem reads "INDEX : ADDR . PORT", or "ADDR . PORT . INDEX
// : ADDR . PORT" in a map keyed by service (the data in deletions too, as
// kproxy writes them).
func parseEndpointElem(c *cursor, f Family, name string, byService bool, e *Element) error {
	if byService {
		svc, err := parseAddrPort(c, f, name, "service address")
		if err != nil {
			return err
		}
		if _, err := c.expect("."); err != nil {
			return err
		}
		e.Key = []Value{{Addr: svc.Addr()}, {Port: svc.Port()}}
	}
	w, err := c.word("element key")
	if err != nil {
		return err
	}
	idx, err := strconv.ParseUint(w, 10, 32)
	if err != nil {
		return fmt.Errorf("element of %q: bad index %q", name, w)
	}
	if _, err := c.expect(":"); err != nil {
		return err
	}
	to, err := parseAddrPort(c, f, name, "address")
	if err != nil {
		return err
	}
	e.Index, e.To = uint32(idx), to
	return nil
}

// parseAddrPort reads "ADDR . PORT" of an element of set name, ADDR of
// family f; what names the address in errors.
func parseAddrPort(c *cursor, f Family, name, what string) (netip.AddrPort, error) {
	aw, err := c.word(what)
	if err != nil {
		return netip.AddrPort{}, err
	}
	a, err := netip.ParseAddr(aw)
	if err != nil || a.Is4() != (f == IPv4) || a.Zone() != "" {
		return netip.AddrPort{}, fmt.Errorf("element of %q: bad %s %q", name, what, aw)
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
func parseValue(dt DataType, w string, interval bool) (Value, error) {
	switch dt {
	case TypeIPv4Addr, TypeIPv6Addr:
		p, err := parsePrefix(w)
		if err != nil {
			return Value{}, err
		}
		if p.Addr().Is4() != (dt == TypeIPv4Addr) {
			return Value{}, fmt.Errorf("%s is not an %s", w, dt)
		}
		if p.IsSingleIP() {
			return Value{Addr: p.Addr()}, nil
		}
		if !interval {
			return Value{}, fmt.Errorf("prefix %s in a set without flags interval", w)
		}
		return Value{Prefix: p}, nil
	case TypeInetProto:
		p, err := parseProto(w)
		return Value{Proto: p}, err
	default:
		n, err := parsePort(w)
		return Value{Port: n}, err
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

func parseVerdict(c *cursor) (Verdict, error) {
	w, err := c.expect("accept", "drop", "return", "jump", "goto")
	if err != nil {
		return Verdict{}, err
	}
	v := Verdict{Kind: VerdictKind(w)}
	if v.Kind == Jump || v.Kind == Goto {
		if v.Chain, err = c.word("chain name"); err != nil {
			return Verdict{}, err
		}
	}
	return v, nil
}
