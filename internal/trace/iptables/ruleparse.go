package iptables

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/kproxy/kproxy/internal/kernel/xtables"
)

// ruleParser turns the words of one rule (after "-A CHAIN") into rules.
type ruleParser struct {
	toks []xtables.Token
	pos  int
	// family is 4 or 6 once an address fixed it, else 0; addresses of the
	// other family are an error.
	family *int
	// isChain says whether a user chain exists in the table (for -j).
	isChain func(name string) bool

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
	return t.Text, nil
}

// parseRule parses the words of a rule. It returns one rule per source ×
// destination pair, as iptables does for comma-separated address lists.
func parseRule(toks []xtables.Token, family *int, isChain func(string) bool) ([]*rule, error) {
	p := &ruleParser{toks: toks, family: family, isChain: isChain}
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
		if !t.Quoted && t.Text == "!" {
			if negate {
				return errors.New(`"!" given twice`)
			}
			negate = true
			continue
		}
		if t.Quoted || !strings.HasPrefix(t.Text, "-") {
			return fmt.Errorf("unexpected word %q", t.Text)
		}
		if err := p.option(t.Text, negate); err != nil {
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
		case extMatch:
			if err := m.check(); err != nil {
				return err
			}
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
