package iptables

import (
	"errors"
	"fmt"
	"math"
	"net/netip"
	"strconv"
	"strings"
)

// ruleParser turns the words of one rule (after "-A CHAIN") into rules.
type ruleParser struct {
	toks []token
	pos  int
	// family is 4 or 6 once an address fixed it, else 0; addresses of the
	// other family are an error.
	family *int
	// chains says whether a user chain exists in the table (for -j/-g).
	chainKind func(name string) (exists, builtin bool)

	r    rule
	srcs []netip.Prefix // -s/-d may list several (iptables adds one rule per pair)
	dsts []netip.Prefix
}

func (p *ruleParser) next(what string) (string, error) {
	if p.pos >= len(p.toks) {
		return "", fmt.Errorf("option %s needs an argument", what)
	}
	t := p.toks[p.pos]
	p.pos++
	return t.s, nil
}

// parseRule parses the words of a rule. It returns one rule per source ×
// destination pair, as iptables does for comma-separated address lists.
func parseRule(toks []token, family *int, chainKind func(string) (bool, bool)) ([]*rule, error) {
	p := &ruleParser{toks: toks, family: family, chainKind: chainKind}
	if err := p.parse(); err != nil {
		return nil, err
	}
	if err := p.finish(); err != nil {
		return nil, err
	}
	srcs, dsts := p.srcs, p.dsts
	if len(srcs) == 0 {
		srcs = []netip.Prefix{{}}
	}
	if len(dsts) == 0 {
		dsts = []netip.Prefix{{}}
	}
	var out []*rule
	for _, s := range srcs {
		for _, d := range dsts {
			r := p.r
			if s.IsValid() {
				r.src.prefix = s
			}
			if d.IsValid() {
				r.dst.prefix = d
			}
			out = append(out, &r)
		}
	}
	return out, nil
}

func (p *ruleParser) parse() error {
	negate := false
	for p.pos < len(p.toks) {
		t := p.toks[p.pos]
		p.pos++
		if !t.quoted && t.s == "!" {
			if negate {
				return errors.New(`"!" given twice`)
			}
			negate = true
			continue
		}
		if t.quoted || !strings.HasPrefix(t.s, "-") {
			return fmt.Errorf("unexpected word %q", t.s)
		}
		if err := p.option(t.s, negate); err != nil {
			return err
		}
		negate = false
	}
	if negate {
		return errors.New(`"!" at the end of the rule`)
	}
	return nil
}

func (p *ruleParser) option(opt string, negate bool) error {
	noNeg := func() error {
		if negate {
			return fmt.Errorf("option %s cannot be negated", opt)
		}
		return nil
	}
	switch opt {
	case "-s", "--source", "--src", "-d", "--destination", "--dst":
		v, err := p.next(opt)
		if err != nil {
			return err
		}
		pfx, err := p.addrList(v)
		if err != nil {
			return err
		}
		if negate && len(pfx) > 1 {
			return fmt.Errorf("! not allowed with multiple addresses in %s", opt)
		}
		am := &p.r.src
		list := &p.srcs
		if opt == "-d" || opt == "--destination" || opt == "--dst" {
			am, list = &p.r.dst, &p.dsts
		}
		if am.set {
			return fmt.Errorf("option %s given twice", opt)
		}
		am.set, am.neg, *list = true, negate, pfx
		return nil
	case "-i", "--in-interface", "-o", "--out-interface":
		v, err := p.next(opt)
		if err != nil {
			return err
		}
		im := &p.r.in
		if opt == "-o" || opt == "--out-interface" {
			im = &p.r.out
		}
		if im.set {
			return fmt.Errorf("option %s given twice", opt)
		}
		if len(v) > 15 {
			return fmt.Errorf("interface name %q longer than 15 characters", v)
		}
		im.set, im.neg = true, negate
		im.name, im.wildcard = strings.CutSuffix(v, "+")
		return nil
	case "-p", "--protocol":
		v, err := p.next(opt)
		if err != nil {
			return err
		}
		if p.r.proto.set {
			return errors.New("option -p given twice")
		}
		n, ok := protoNames[strings.ToLower(v)]
		if !ok {
			x, err := strconv.ParseUint(v, 10, 8)
			if err != nil {
				return fmt.Errorf("unknown protocol %q", v)
			}
			n = uint8(x)
		}
		p.r.proto = protoMatch{set: true, neg: negate, num: n}
		return nil
	case "-m", "--match":
		if err := noNeg(); err != nil {
			return err
		}
		v, err := p.next(opt)
		if err != nil {
			return err
		}
		return p.addMatch(v)
	case "-j", "--jump", "-g", "--goto":
		if err := noNeg(); err != nil {
			return err
		}
		v, err := p.next(opt)
		if err != nil {
			return err
		}
		if p.r.target.kind != tNone {
			return errors.New("more than one target")
		}
		return p.setTarget(v, opt == "-g" || opt == "--goto")
	case "-c", "--set-counters":
		// Counters for the rule: no effect on where packets go.
		if _, err := p.next(opt); err != nil {
			return err
		}
		_, err := p.next(opt)
		return err
	case "-f", "--fragment":
		return unsupported("option %s", opt)
	}
	// An option of the target, or of a loaded match (the latest loaded
	// one that knows it).
	if ok, err := p.targetOption(opt, negate); ok || err != nil {
		return err
	}
	for i := len(p.r.matches) - 1; i >= 0; i-- {
		if ok, err := p.matchOption(p.r.matches[i], opt, negate); ok || err != nil {
			return err
		}
	}
	// iptables loads the protocol's match by itself for its options
	// ("-p tcp --dport 80"), if -p came first.
	if p.r.proto.set && !p.r.proto.neg && (opt == "--dport" || opt == "--sport" || opt == "--destination-port" || opt == "--source-port" || opt == "--syn" || opt == "--tcp-flags") {
		if name := protoName(p.r.proto.num); name == "tcp" || name == "udp" || name == "sctp" {
			m := &l4Match{proto: name}
			p.r.matches = append(p.r.matches, m)
			if ok, err := p.matchOption(m, opt, negate); ok || err != nil {
				return err
			}
		}
	}
	return fmt.Errorf("unknown option %q", opt)
}

func (p *ruleParser) addrList(v string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, a := range strings.Split(v, ",") {
		pfx, err := parsePrefix(a)
		if err != nil {
			return nil, err
		}
		if err := p.checkFamily(pfx.Addr()); err != nil {
			return nil, err
		}
		out = append(out, pfx)
	}
	return out, nil
}

func (p *ruleParser) checkFamily(a netip.Addr) error {
	f := 4
	if a.Is6() {
		f = 6
	}
	return p.fixFamily(f, a.String())
}

// fixFamily records that the ruleset is of family f (what says so is
// named in the error when it is of the other family).
func (p *ruleParser) fixFamily(f int, what string) error {
	if *p.family == 0 {
		*p.family = f
		return nil
	}
	if *p.family != f {
		return fmt.Errorf("%s is IPv%d but the ruleset holds IPv%d rules", what, f, *p.family)
	}
	return nil
}

// parsePrefix reads an address with an optional /len or dotted /mask, as
// -s and -d take it. Host names are not resolved.
func parsePrefix(s string) (netip.Prefix, error) {
	addr, bits, hasBits := strings.Cut(s, "/")
	a, err := netip.ParseAddr(addr)
	if err != nil || a.Zone() != "" {
		return netip.Prefix{}, fmt.Errorf("invalid address %q (host names are not resolved)", s)
	}
	a = a.Unmap()
	n := a.BitLen()
	if hasBits {
		if m, err := netip.ParseAddr(bits); err == nil && m.Is4() == a.Is4() {
			n, err = maskLen(m)
			if err != nil {
				return netip.Prefix{}, fmt.Errorf("invalid mask in %q: %v", s, err)
			}
		} else {
			x, err := strconv.Atoi(bits)
			if err != nil || x < 0 || x > a.BitLen() {
				return netip.Prefix{}, fmt.Errorf("invalid prefix length in %q", s)
			}
			n = x
		}
	}
	return netip.PrefixFrom(a, n).Masked(), nil
}

// maskLen is the length of a contiguous mask such as 255.255.0.0.
func maskLen(m netip.Addr) (int, error) {
	b := m.AsSlice()
	n := 0
	for i, x := range b {
		ones := 0
		for ones < 8 && x&(0x80>>ones) != 0 {
			ones++
		}
		if x != byte(0xff<<(8-ones)) {
			return 0, errors.New("not contiguous")
		}
		n += ones
		if ones < 8 {
			for _, y := range b[i+1:] {
				if y != 0 {
					return 0, errors.New("not contiguous")
				}
			}
			break
		}
	}
	return n, nil
}

func (p *ruleParser) addMatch(name string) error {
	var m match
	switch name {
	case "tcp", "udp", "sctp":
		m = &l4Match{proto: name}
	case "addrtype":
		m = &addrtypeMatch{}
	case "comment":
		m = &commentMatch{}
	case "mark":
		m = &markMatch{}
	case "conntrack", "state":
		m = &ctMatch{module: name}
	case "statistic":
		m = &statisticMatch{}
	case "recent":
		m = &recentMatch{name: "DEFAULT"}
	case "nfacct":
		m = &nfacctMatch{}
	default:
		return unsupported("match %q", name)
	}
	p.r.matches = append(p.r.matches, m)
	return nil
}

// matchOption parses opt if it belongs to m; ok reports whether it did.
func (p *ruleParser) matchOption(m match, opt string, negate bool) (ok bool, err error) {
	arg := func() (string, error) { return p.next(opt) }
	noNeg := func() error {
		if negate {
			return fmt.Errorf("option %s cannot be negated", opt)
		}
		return nil
	}
	switch m := m.(type) {
	case *l4Match:
		switch opt {
		case "--dport", "--destination-port", "--sport", "--source-port":
			v, err := arg()
			if err != nil {
				return true, err
			}
			pr, err := parsePortRange(v)
			if err != nil {
				return true, err
			}
			pr.neg = negate
			dst := &m.dport
			if opt == "--sport" || opt == "--source-port" {
				dst = &m.sport
			}
			if dst.set {
				return true, fmt.Errorf("option %s given twice", opt)
			}
			*dst = pr
			return true, nil
		case "--syn", "--tcp-flags":
			if m.proto != "tcp" {
				return false, nil
			}
			if m.flags != nil {
				return true, errors.New("TCP flags given twice")
			}
			f := &tcpFlags{neg: negate, mask: 0x17, comp: 0x02} // --syn
			if opt == "--tcp-flags" {
				mask, err := arg()
				if err != nil {
					return true, err
				}
				comp, err := arg()
				if err != nil {
					return true, err
				}
				if f.mask, err = parseTCPFlags(mask); err != nil {
					return true, err
				}
				if f.comp, err = parseTCPFlags(comp); err != nil {
					return true, err
				}
			}
			m.flags = f
			return true, nil
		case "--tcp-option", "--chunk-types":
			return true, unsupported("option %s", opt)
		}
	case *addrtypeMatch:
		switch opt {
		case "--src-type", "--dst-type":
			v, err := arg()
			if err != nil {
				return true, err
			}
			tm := typeMatch{set: true, neg: negate}
			for _, t := range strings.Split(v, ",") {
				t = strings.ToUpper(t)
				if !addrTypes[t] {
					switch t {
					case "ANYCAST", "BLACKHOLE", "UNREACHABLE", "PROHIBIT", "THROW", "NAT", "XRESOLVE":
						return true, unsupported("address type %s (routes are not modelled)", t)
					}
					return true, fmt.Errorf("unknown address type %q", t)
				}
				tm.types = append(tm.types, t)
			}
			if opt == "--src-type" {
				m.src = tm
			} else {
				m.dst = tm
			}
			return true, nil
		case "--limit-iface-in", "--limit-iface-out":
			return true, unsupported("option %s (addresses per interface are not modelled)", opt)
		}
	case *commentMatch:
		if opt == "--comment" {
			if err := noNeg(); err != nil {
				return true, err
			}
			v, err := arg()
			if err != nil {
				return true, err
			}
			if len(v) > 255 {
				return true, errors.New("comment longer than 255 characters")
			}
			m.text, m.set = v, true
			return true, nil
		}
	case *markMatch:
		if opt == "--mark" {
			v, err := arg()
			if err != nil {
				return true, err
			}
			val, mask, err := parseMark(v)
			if err != nil {
				return true, err
			}
			m.set, m.neg, m.value, m.mask = true, negate, val, mask
			return true, nil
		}
	case *ctMatch:
		if (m.module == "conntrack" && opt == "--ctstate") || (m.module == "state" && opt == "--state") {
			v, err := arg()
			if err != nil {
				return true, err
			}
			for _, s := range strings.Split(v, ",") {
				bit := 0
				for _, n := range ctStateNames {
					if n.name == strings.ToUpper(s) && (m.module == "conntrack" || n.bit < ctSNAT) {
						bit = n.bit
					}
				}
				if bit == 0 {
					return true, fmt.Errorf("unknown conntrack state %q", s)
				}
				m.states |= bit
			}
			m.set, m.neg = true, negate
			return true, nil
		}
		if m.module == "conntrack" && strings.HasPrefix(opt, "--ct") {
			return true, unsupported("conntrack option %s", opt)
		}
	case *statisticMatch:
		switch opt {
		case "--mode":
			if err := noNeg(); err != nil {
				return true, err
			}
			v, err := arg()
			if err != nil {
				return true, err
			}
			if v != "random" {
				return true, unsupported("statistic mode %q", v)
			}
			m.mode = v
			return true, nil
		case "--probability":
			v, err := arg()
			if err != nil {
				return true, err
			}
			f, err := strconv.ParseFloat(v, 64)
			if err != nil || f < 0 || f > 1 {
				return true, fmt.Errorf("invalid probability %q (must be between 0 and 1)", v)
			}
			m.prob, m.neg, m.set = uint32(math.Round(f*(1<<31))), negate, true
			return true, nil
		case "--every", "--packet":
			return true, unsupported("statistic option %s", opt)
		}
	case *recentMatch:
		switch opt {
		case "--set", "--rcheck":
			if m.opSeen {
				return true, errors.New("recent: only one of --set, --rcheck may be given")
			}
			m.op, m.neg, m.opSeen = opt[2:], negate, true
			return true, nil
		case "--update", "--remove", "--hitcount", "--rttl":
			return true, unsupported("recent option %s", opt)
		case "--name":
			if err := noNeg(); err != nil {
				return true, err
			}
			v, err := arg()
			if err != nil {
				return true, err
			}
			if v == "" || len(v) > 200 || strings.ContainsAny(v, "/ ") {
				return true, fmt.Errorf("invalid recent list name %q", v)
			}
			m.name, m.nameSet = v, true
			return true, nil
		case "--seconds":
			if err := noNeg(); err != nil {
				return true, err
			}
			v, err := arg()
			if err != nil {
				return true, err
			}
			n, err := strconv.Atoi(v)
			if err != nil || n <= 0 {
				return true, fmt.Errorf("invalid --seconds %q", v)
			}
			m.seconds = n
			return true, nil
		case "--reap":
			m.reap = true
			return true, noNeg()
		case "--rsource", "--rdest":
			m.rdest = opt == "--rdest"
			return true, noNeg()
		case "--mask":
			if err := noNeg(); err != nil {
				return true, err
			}
			v, err := arg()
			if err != nil {
				return true, err
			}
			a, err := netip.ParseAddr(v)
			if err != nil {
				return true, fmt.Errorf("invalid recent mask %q", v)
			}
			m.mask = a
			return true, nil
		}
	case *nfacctMatch:
		if opt == "--nfacct-name" {
			v, err := arg()
			if err != nil {
				return true, err
			}
			m.name = v
			return true, noNeg()
		}
	}
	return false, nil
}

func parseTCPFlags(v string) (uint8, error) {
	var b uint8
	for _, n := range strings.Split(v, ",") {
		switch n = strings.ToUpper(n); n {
		case "ALL":
			b = 0xff
			continue
		case "NONE":
			continue
		}
		found := false
		for _, f := range tcpFlagBits {
			if f.name == n {
				b |= f.bit
				found = true
			}
		}
		if !found {
			return 0, fmt.Errorf("unknown TCP flag %q", n)
		}
	}
	return b, nil
}

func parsePortRange(v string) (portRange, error) {
	lo, hi, isRange := strings.Cut(v, ":")
	parse := func(s string, def uint16) (uint16, error) {
		if s == "" {
			return def, nil
		}
		n, err := strconv.ParseUint(s, 10, 16)
		if err != nil {
			return 0, fmt.Errorf("invalid port %q (service names are not resolved)", s)
		}
		return uint16(n), nil
	}
	l, err := parse(lo, 0)
	if err != nil {
		return portRange{}, err
	}
	h := l
	if isRange {
		if h, err = parse(hi, 65535); err != nil {
			return portRange{}, err
		}
	}
	if l > h {
		return portRange{}, fmt.Errorf("invalid port range %q", v)
	}
	return portRange{set: true, lo: l, hi: h}, nil
}

// parseMark reads "value[/mask]"; the mask defaults to all ones.
func parseMark(v string) (val, mask uint32, err error) {
	vs, ms, hasMask := strings.Cut(v, "/")
	x, err := strconv.ParseUint(vs, 0, 32)
	if err != nil {
		return 0, 0, fmt.Errorf("invalid mark %q", v)
	}
	mask = math.MaxUint32
	if hasMask {
		y, err := strconv.ParseUint(ms, 0, 32)
		if err != nil {
			return 0, 0, fmt.Errorf("invalid mark mask %q", v)
		}
		mask = uint32(y)
	}
	return uint32(x), mask, nil
}

func (p *ruleParser) setTarget(name string, isGoto bool) error {
	t := &p.r.target
	if isGoto {
		exists, builtin := p.chainKind(name)
		switch {
		case !exists:
			return fmt.Errorf("goto: no chain %q", name)
		case builtin:
			return fmt.Errorf("cannot goto built-in chain %q", name)
		}
		t.kind, t.chain = tGoto, name
		return nil
	}
	switch name {
	case tAccept, tDrop, tReturn:
		t.kind = name
	case tReject:
		t.kind = tReject
	case tMark:
		t.kind = tMark
	case tDNAT:
		t.kind = tDNAT
	case tMasquerade:
		t.kind = tMasquerade
	default:
		exists, builtin := p.chainKind(name)
		switch {
		case exists && builtin:
			return fmt.Errorf("cannot jump to built-in chain %q", name)
		case exists:
			t.kind, t.chain = tJump, name
		case knownTargets[name]:
			return unsupported("target %s", name)
		default:
			return fmt.Errorf("no chain or target named %q", name)
		}
	}
	return nil
}

// targetOption parses opt if it belongs to the target.
func (p *ruleParser) targetOption(opt string, negate bool) (bool, error) {
	t := &p.r.target
	arg := func() (string, error) {
		if negate {
			return "", fmt.Errorf("option %s cannot be negated", opt)
		}
		return p.next(opt)
	}
	switch t.kind {
	case tReject:
		if opt == "--reject-with" {
			v, err := arg()
			if err != nil {
				return true, err
			}
			canon, err := p.rejectType(v)
			if err != nil {
				return true, err
			}
			t.rejectWith = canon
			return true, nil
		}
	case tMark:
		var val, mask uint32
		switch opt {
		case "--set-xmark", "--set-mark", "--or-mark", "--and-mark", "--xor-mark":
			v, err := arg()
			if err != nil {
				return true, err
			}
			if t.markSet {
				return true, errors.New("MARK: more than one operation")
			}
			x, m, err := parseMark(v)
			if err != nil {
				return true, err
			}
			switch opt {
			case "--set-xmark":
				val, mask = x, m
			case "--set-mark":
				// (mark & ^m) | x, which iptables sends as xmark with the
				// value also cleared by the mask.
				val, mask = x, m|x
			case "--or-mark":
				if strings.Contains(v, "/") {
					return true, errors.New("--or-mark takes no mask")
				}
				val, mask = x, x
			case "--and-mark":
				if strings.Contains(v, "/") {
					return true, errors.New("--and-mark takes no mask")
				}
				val, mask = 0, ^x
			case "--xor-mark":
				if strings.Contains(v, "/") {
					return true, errors.New("--xor-mark takes no mask")
				}
				val, mask = x, 0
			}
			t.markValue, t.markMask, t.markSet = val, mask, true
			return true, nil
		}
	case tDNAT:
		switch opt {
		case "--to-destination", "--to":
			v, err := arg()
			if err != nil {
				return true, err
			}
			if t.toAddr.IsValid() {
				return true, unsupported("more than one --to-destination")
			}
			a, port, err := parseNATDest(v)
			if err != nil {
				return true, err
			}
			if err := p.checkFamily(a); err != nil {
				return true, err
			}
			t.toAddr, t.toPort = a, port
			return true, nil
		case "--random", "--persistent":
			if negate {
				return true, fmt.Errorf("option %s cannot be negated", opt)
			}
			t.dnatOpts = append(t.dnatOpts, opt)
			return true, nil
		}
	case tMasquerade:
		switch opt {
		case "--random", "--random-fully":
			if negate {
				return true, fmt.Errorf("option %s cannot be negated", opt)
			}
			t.masqOpts = append(t.masqOpts, opt)
			return true, nil
		case "--to-ports":
			return true, unsupported("MASQUERADE --to-ports")
		}
	}
	return false, nil
}

// parseNATDest reads "ip", "ip:port", "[ipv6]" or "[ipv6]:port". Ranges
// are refused: the kernel would choose within them.
func parseNATDest(v string) (netip.Addr, uint16, error) {
	if strings.ContainsAny(v, "-") {
		return netip.Addr{}, 0, unsupported("DNAT range %q", v)
	}
	if ap, err := netip.ParseAddrPort(v); err == nil {
		if ap.Port() == 0 {
			return netip.Addr{}, 0, fmt.Errorf("invalid port 0 in %q", v)
		}
		return ap.Addr().Unmap(), ap.Port(), nil
	}
	s := v
	if strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]") {
		s = s[1 : len(s)-1]
	}
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" {
		return netip.Addr{}, 0, fmt.Errorf("invalid DNAT destination %q", v)
	}
	return a.Unmap(), 0, nil
}

// rejectType resolves a --reject-with name. A name only one family knows
// (icmp-* or icmp6-*) fixes the ruleset's family; a name both know
// (port-unreach, tcp-reset) is read in the family known so far.
func (p *ruleParser) rejectType(v string) (string, error) {
	c4, in4 := rejectTypes4[v]
	c6, in6 := rejectTypes6[v]
	switch {
	case in4 && in6:
		if *p.family == 6 {
			return c6, nil
		}
		return c4, nil
	case in4:
		return c4, p.fixFamily(4, "reject type "+v)
	case in6:
		return c6, p.fixFamily(6, "reject type "+v)
	}
	return "", fmt.Errorf("unknown reject type %q", v)
}

// finish checks what iptables and the kernel check once the whole rule is
// known.
func (p *ruleParser) finish() error {
	r := &p.r
	tcpish := func() string {
		if !r.proto.set || r.proto.neg {
			return ""
		}
		return protoName(r.proto.num)
	}
	for _, m := range r.matches {
		switch m := m.(type) {
		case *l4Match:
			// The kernel: "tcp match: only valid for protocol 6".
			if tcpish() != m.proto {
				return fmt.Errorf("match %s needs -p %s", m.proto, m.proto)
			}
		case *addrtypeMatch:
			if !m.src.set && !m.dst.set {
				return errors.New("addrtype needs --src-type or --dst-type")
			}
		case *commentMatch:
			if !m.set {
				return errors.New("comment needs --comment")
			}
		case *markMatch:
			if !m.set {
				return errors.New("mark needs --mark")
			}
		case *ctMatch:
			if !m.set {
				return fmt.Errorf("match %s needs a state option", m.module)
			}
		case *statisticMatch:
			if m.mode != "random" || !m.set {
				return errors.New("statistic needs --mode random --probability P")
			}
		case *recentMatch:
			if !m.opSeen {
				return errors.New("recent needs --set or --rcheck")
			}
			if m.op == "set" && (m.seconds > 0 || m.reap) {
				return errors.New("recent: --seconds and --reap go with --rcheck")
			}
			if m.reap && m.seconds == 0 {
				return errors.New("recent: --reap needs --seconds")
			}
			if m.mask.IsValid() {
				if err := p.checkFamily(m.mask); err != nil {
					return err
				}
			}
		case *nfacctMatch:
			if m.name == "" {
				return errors.New("nfacct needs --nfacct-name")
			}
		}
	}
	t := &r.target
	switch t.kind {
	case tReject:
		if t.rejectWith == "" {
			t.rejectWith = "icmp-port-unreachable"
			if *p.family == 6 {
				t.rejectWith = "icmp6-port-unreachable"
			}
		}
		if t.rejectWith == "tcp-reset" && tcpish() != "tcp" {
			return errors.New("REJECT --reject-with tcp-reset needs -p tcp")
		}
	case tMark:
		if !t.markSet {
			return errors.New("MARK needs one of --set-xmark, --set-mark, --or-mark, --and-mark, --xor-mark")
		}
	case tDNAT:
		if !t.toAddr.IsValid() {
			return errors.New("DNAT needs --to-destination")
		}
		if t.toPort != 0 {
			if s := tcpish(); s != "tcp" && s != "udp" && s != "sctp" {
				return errors.New("DNAT to a port needs -p tcp, udp or sctp")
			}
		}
	}
	return nil
}
