package iptables

// This file is what ipvs mode's rules need beyond iptables mode's: the
// ipset match ("-m set --match-set NAME dst,dst") and physdev's
// "--physdev-is-in". They plug into the rule parser and the walker
// through extMatch, so the rest of the package does not know them.
//
// The set match tests the packet against the kernel's ipsets, which
// iptables-save does not print: Trace reads them from trace.Host.IPSets.
// As xt_set does, the flags pick, dimension by dimension, the source or
// destination address or port of the packet; a port dimension also
// compares the packet's protocol (hash:ip,port entries are
// "198.19.0.10,tcp:80"), except in bitmap:port sets. A rule naming a set
// that does not exist, or one of the other family, is an error: the kernel
// refuses such a rule. The options --return-nomatch, --update-counters,
// --packets-* and --bytes-* are not modelled (ErrUnsupported).
//
// physdev: bridges are not modelled; a packet never arrives through a
// bridge port, so --physdev-is-in is false (what kube-proxy's rule
// "! --physdev-is-in" expects of traffic that is not bridged). Other
// physdev options are ErrUnsupported.

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/kproxy/kproxy/internal/kernel/ipset"
)

// extMatch is a match that parses its own options and evaluates itself.
type extMatch interface {
	match
	// option parses opt if it is one of the match's; ok says whether.
	option(p *ruleParser, opt string, negate bool) (ok bool, err error)
	// check is called when the rule is complete.
	check() error
	eval(w *walker, s *state) (bool, error)
}

// newExtMatch returns the extMatch for "-m name", or nil.
func newExtMatch(name string) extMatch {
	switch name {
	case "set":
		return &setMatch{}
	case "physdev":
		return &physdevMatch{}
	case "ipvs":
		return &ipvsMatch{}
	}
	return nil
}

// setMatch is "-m set [!] --match-set NAME FLAGS".
type setMatch struct {
	name  string
	neg   bool
	flags []string // "src" or "dst", one per dimension
}

func (m *setMatch) String() string {
	return "-m set" + neg(m.neg) + " --match-set " + m.name + " " + strings.Join(m.flags, ",")
}

func (m *setMatch) option(p *ruleParser, opt string, negate bool) (bool, error) {
	switch opt {
	case "--match-set":
		if m.name != "" {
			return true, errors.New("set: --match-set given twice")
		}
		name, err := p.next(opt)
		if err != nil {
			return true, err
		}
		flags, err := p.next(opt)
		if err != nil {
			return true, err
		}
		if name == "" || len(name) > 31 {
			return true, fmt.Errorf("invalid ipset name %q", name)
		}
		fs := strings.Split(flags, ",")
		if len(fs) > 6 {
			return true, fmt.Errorf("set: more than 6 flags in %q", flags)
		}
		for _, f := range fs {
			if f != "src" && f != "dst" {
				return true, fmt.Errorf("set: flag %q is not src or dst", f)
			}
		}
		m.name, m.neg, m.flags = name, negate, fs
		return true, nil
	case "--return-nomatch", "--update-counters", "--update-subcounters",
		"--packets-eq", "--packets-lt", "--packets-gt", "--bytes-eq", "--bytes-lt", "--bytes-gt":
		return true, unsupported("set option %s", opt)
	}
	return false, nil
}

func (m *setMatch) check() error {
	if m.name == "" {
		return errors.New("set needs --match-set NAME FLAGS")
	}
	return nil
}

// setDims is the number of dimensions of each set type.
var setDims = map[string]int{
	"hash:ip": 1, "hash:net": 1, "bitmap:port": 1,
	"hash:ip,port": 2, "hash:ip,port,ip": 3, "hash:ip,port,net": 3,
}

func (m *setMatch) eval(w *walker, s *state) (bool, error) {
	set := w.h.IPSets[m.name]
	if set == nil {
		return false, fmt.Errorf("-m set: ipset %q does not exist (the kernel refuses a rule naming it)", m.name)
	}
	dims, ok := setDims[set.Type]
	if !ok {
		return false, unsupported("ipset %s of type %s", set.Name, set.Type)
	}
	if len(m.flags) < dims {
		return false, unsupported("ipset %s (%s) matched with %d flags", set.Name, set.Type, len(m.flags))
	}
	if set.Type != "bitmap:port" && set.IPv6 != (w.fam == 6) {
		return false, fmt.Errorf("-m set: ipset %s is of the other family than the rules (the kernel refuses the rule)", set.Name)
	}
	pick := func(i int) (src bool) { return m.flags[i] == "src" }
	in := false
	for _, text := range set.Entries {
		e, err := ipset.ParseEntry(set.Type, set.IPv6, text)
		if err != nil {
			return false, fmt.Errorf("ipset %s: %w", set.Name, err)
		}
		if setEntryMatches(set.Type, e, s, pick) {
			in = true
			break
		}
	}
	return in != m.neg, nil
}

// setEntryMatches tests one entry; src(i) says whether dimension i takes
// the packet's source (else its destination).
func setEntryMatches(typ string, e ipset.Entry, s *state, src func(int) bool) bool {
	addr := func(i int) netip.Addr {
		if src(i) {
			return s.src
		}
		return s.dst
	}
	port := func(i int) uint16 {
		if src(i) {
			return s.sport
		}
		return s.dport
	}
	switch typ {
	case "bitmap:port":
		return e.Port == port(0)
	case "hash:net":
		return e.Net.Contains(addr(0))
	case "hash:ip":
		return e.Addr == addr(0)
	}
	if e.Addr != addr(0) || e.Protocol != s.proto || e.Port != port(1) {
		return false
	}
	switch typ {
	case "hash:ip,port,ip":
		return e.Addr2 == addr(2)
	case "hash:ip,port,net":
		return e.Net.Contains(addr(2))
	}
	return true
}

// physdevMatch is "-m physdev [!] --physdev-is-in".
type physdevMatch struct {
	isIn, neg bool
}

func (m *physdevMatch) String() string { return "-m physdev" + neg(m.neg) + " --physdev-is-in" }

func (m *physdevMatch) option(_ *ruleParser, opt string, negate bool) (bool, error) {
	switch opt {
	case "--physdev-is-in":
		m.isIn, m.neg = true, negate
		return true, nil
	case "--physdev-in", "--physdev-out", "--physdev-is-out", "--physdev-is-bridged":
		return true, unsupported("physdev option %s (bridges are not modelled)", opt)
	}
	return false, nil
}

func (m *physdevMatch) check() error {
	if !m.isIn {
		return errors.New("physdev needs an option")
	}
	return nil
}

// eval: the packet never came through a bridge port.
func (m *physdevMatch) eval(*walker, *state) (bool, error) { return m.neg, nil }
