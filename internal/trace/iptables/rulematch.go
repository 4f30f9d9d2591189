package iptables

import (
	"errors"
	"fmt"
	"math"
	"net/netip"
	"strconv"
	"strings"
)

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
		if m = newExtMatch(name); m == nil {
			return unsupported("match %q", name)
		}
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
	case extMatch:
		return m.option(p, opt, negate)
	case *l4Match:
		switch opt {
		case "--dport", "--destination-port", "--sport", "--source-port":
			pr, err := p.portRangeArg(opt, negate)
			if err != nil {
				return true, err
			}
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

// portRangeArg reads option opt's port or port range (negated when negate).
func (p *ruleParser) portRangeArg(opt string, negate bool) (portRange, error) {
	v, err := p.next(opt)
	if err != nil {
		return portRange{}, err
	}
	pr, err := parsePortRange(v)
	if err != nil {
		return portRange{}, err
	}
	pr.neg = negate
	return pr, nil
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
