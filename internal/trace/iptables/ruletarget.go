package iptables

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
)

// setTarget records the rule's target. Package restore resolved it
// already: a goto names a user chain, a jump a user chain, a verdict or
// an extension target.
func (p *ruleParser) setTarget(name string, isGoto bool) error {
	t := &p.r.target
	if isGoto {
		t.kind, t.chain = tGoto, name
		return nil
	}
	switch name {
	case tAccept, tDrop, tReturn, tReject, tMark, tDNAT, tMasquerade:
		t.kind = name
		return nil
	}
	if p.isChain(name) {
		t.kind, t.chain = tJump, name
		return nil
	}
	return unsupported("target %s", name)
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
