package iptables

// ipvsMatch is xt_ipvs ("-m ipvs"): ipvs mode writes "-m ipvs --vaddr IP
// --vproto tcp --vport PORT" to drop the node's own connections to a load
// balancer IP whose source ranges leave the node out. As xt_ipvs: --ipvs
// tests that IPVS handled the packet (skb->ipvs_property); the other
// options test the virtual server of its IPVS connection, and never match
// a packet IPVS did not handle, negated or not. --vdir, --vmethod and
// --vportctl are not modelled (ErrUnsupported).

import (
	"errors"
	"strconv"
	"strings"
)

type ipvsMatch struct {
	ipvs, ipvsNeg bool
	vaddr         addrMatch
	vproto        protoMatch
	vport         portRange
	vaddrText     string
	any           bool // an option other than --ipvs was given
}

func (m *ipvsMatch) String() string {
	s := "-m ipvs"
	if m.ipvs {
		s += neg(m.ipvsNeg) + " --ipvs"
	}
	if m.vproto.set {
		s += neg(m.vproto.neg) + " --vproto " + protoName(m.vproto.num)
	}
	if m.vaddr.set {
		s += neg(m.vaddr.neg) + " --vaddr " + m.vaddrText
	}
	if m.vport.set {
		s += neg(m.vport.neg) + " --vport " + m.vport.String()
	}
	return s
}

func (m *ipvsMatch) option(p *ruleParser, opt string, negate bool) (bool, error) {
	switch opt {
	case "--ipvs":
		m.ipvs, m.ipvsNeg = true, negate
		return true, nil
	case "--vaddr":
		v, err := p.next(opt)
		if err != nil {
			return true, err
		}
		pfx, err := parsePrefix(v)
		if err != nil {
			return true, err
		}
		if err := p.checkFamily(pfx.Addr()); err != nil {
			return true, err
		}
		m.vaddr, m.vaddrText, m.any = addrMatch{set: true, neg: negate, prefix: pfx}, v, true
		return true, nil
	case "--vproto":
		v, err := p.next(opt)
		if err != nil {
			return true, err
		}
		n, ok := protoNames[strings.ToLower(v)]
		if !ok {
			x, err := strconv.ParseUint(v, 10, 8)
			if err != nil {
				return true, errors.New("ipvs: unknown --vproto " + v)
			}
			n = uint8(x)
		}
		m.vproto, m.any = protoMatch{set: true, neg: negate, num: n}, true
		return true, nil
	case "--vport":
		pr, err := p.portRangeArg(opt, negate)
		if err != nil {
			return true, err
		}
		m.vport, m.any = pr, true
		return true, nil
	case "--vdir", "--vmethod", "--vportctl":
		return true, unsupported("ipvs option %s", opt)
	}
	return false, nil
}

func (m *ipvsMatch) check() error {
	if !m.ipvs && !m.any {
		return errors.New("ipvs needs an option")
	}
	return nil
}

func (m *ipvsMatch) eval(_ *walker, s *state) (bool, error) {
	handled := s.ipvs != nil
	if m.ipvs && handled == m.ipvsNeg {
		return false, nil
	}
	if !m.any {
		return true, nil
	}
	if !handled {
		return false, nil
	}
	vs := s.ipvs
	if !m.vaddr.matches(vs.Addr.Addr()) || !m.vport.matches(vs.Addr.Port()) {
		return false, nil
	}
	if m.vproto.set && (protoNumber(vs.Proto) == m.vproto.num) == m.vproto.neg {
		return false, nil
	}
	return true, nil
}
