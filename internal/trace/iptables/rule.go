package iptables

import (
	"fmt"
	"math"
	"net/netip"
	"strconv"
	"strings"

	"github.com/kproxy/kproxy/internal/kernel/xtables"
)

// rule is one parsed iptables rule. The fields of the IP header part
// (-s -d -i -o -p) are checked by the kernel before any -m match, whatever
// their order on the line; the matches then run in the order written, so a
// "-m recent --set" before a failing match still records the source.
type rule struct {
	src, dst addrMatch
	in, out  ifaceMatch
	proto    protoMatch
	matches  []match
	target   target
}

type addrMatch struct {
	set, neg bool
	prefix   netip.Prefix
}

func (m addrMatch) matches(a netip.Addr) bool {
	return !m.set || m.prefix.Contains(a) != m.neg
}

type ifaceMatch struct {
	set, neg bool
	// name without a trailing "+"; wildcard means the name is a prefix.
	name     string
	wildcard bool
}

func (m ifaceMatch) matches(dev string) bool {
	if !m.set {
		return true
	}
	var in bool
	if m.wildcard {
		in = strings.HasPrefix(dev, m.name)
	} else {
		in = dev == m.name
	}
	return in != m.neg
}

func (m ifaceMatch) String() string {
	if m.wildcard {
		return m.name + "+"
	}
	return m.name
}

type protoMatch struct {
	set, neg bool
	num      uint8 // 0 is "all"
}

// Protocol numbers and the names iptables accepts for them.
var protoNames = map[string]uint8{
	"all": 0, "icmp": 1, "igmp": 2, "tcp": 6, "udp": 17, "gre": 47, "esp": 50, "ah": 51,
	"icmpv6": 58, "ipv6-icmp": 58, "sctp": 132, "udplite": 136, "dccp": 33, "mh": 135,
}

func protoName(n uint8) string {
	switch n {
	case 0:
		return "all"
	case 6:
		return "tcp"
	case 17:
		return "udp"
	case 132:
		return "sctp"
	case 1:
		return "icmp"
	case 58:
		return "ipv6-icmp"
	}
	return strconv.Itoa(int(n))
}

// match is one "-m module" with its options.
type match interface {
	// String is the match as iptables-save writes it ("-m tcp --dport 80").
	String() string
}

type portRange struct {
	set, neg bool
	lo, hi   uint16
}

func (p portRange) matches(port uint16) bool {
	return !p.set || (port >= p.lo && port <= p.hi) != p.neg
}

func (p portRange) String() string {
	if p.lo == p.hi {
		return strconv.Itoa(int(p.lo))
	}
	return fmt.Sprintf("%d:%d", p.lo, p.hi)
}

// l4Match is "-m tcp", "-m udp" or "-m sctp".
type l4Match struct {
	proto        string
	dport, sport portRange
	flags        *tcpFlags
}

// tcpFlags is --tcp-flags MASK COMP (--syn is FIN,SYN,RST,ACK SYN): the
// flags under the mask must equal comp.
type tcpFlags struct {
	neg        bool
	mask, comp uint8
}

// The TCP flag bits by the names iptables uses.
var tcpFlagBits = []struct {
	name string
	bit  uint8
}{{"FIN", 0x01}, {"SYN", 0x02}, {"RST", 0x04}, {"PSH", 0x08}, {"ACK", 0x10}, {"URG", 0x20}, {"ECE", 0x40}, {"CWR", 0x80}}

func tcpFlagNames(b uint8) string {
	if b == 0 {
		return "NONE"
	}
	var names []string
	for _, f := range tcpFlagBits {
		if b&f.bit != 0 {
			names = append(names, f.name)
		}
	}
	return strings.Join(names, ",")
}

func (m *l4Match) String() string {
	s := "-m " + m.proto
	if m.sport.set {
		s += neg(m.sport.neg) + " --sport " + m.sport.String()
	}
	if m.dport.set {
		s += neg(m.dport.neg) + " --dport " + m.dport.String()
	}
	if m.flags != nil {
		s += neg(m.flags.neg) + " --tcp-flags " + tcpFlagNames(m.flags.mask) + " " + tcpFlagNames(m.flags.comp)
	}
	return s
}

func neg(b bool) string {
	if b {
		return " !"
	}
	return ""
}

// Address types of the addrtype match that the tracer can decide from
// Host.LocalAddrs alone; the others depend on routes it does not model.
var addrTypes = map[string]bool{"UNSPEC": true, "UNICAST": true, "LOCAL": true, "BROADCAST": true, "MULTICAST": true}

type typeMatch struct {
	set, neg bool
	types    []string
}

type addrtypeMatch struct {
	src, dst typeMatch
}

func (m *addrtypeMatch) String() string {
	s := "-m addrtype"
	if m.src.set {
		s += neg(m.src.neg) + " --src-type " + strings.Join(m.src.types, ",")
	}
	if m.dst.set {
		s += neg(m.dst.neg) + " --dst-type " + strings.Join(m.dst.types, ",")
	}
	return s
}

type commentMatch struct {
	text string
	set  bool
}

func (m *commentMatch) String() string { return "-m comment --comment " + xtables.SaveString(m.text) }

type markMatch struct {
	set, neg    bool
	value, mask uint32
}

func (m *markMatch) String() string {
	return "-m mark" + neg(m.neg) + " --mark " + markString(m.value, m.mask)
}

func markString(v, m uint32) string {
	if m == math.MaxUint32 {
		return fmt.Sprintf("0x%x", v)
	}
	return fmt.Sprintf("0x%x/0x%x", v, m)
}

// Conntrack states, as bits the way xt_conntrack tests them.
const (
	ctInvalid = 1 << iota
	ctNew
	ctEstablished
	ctRelated
	ctUntracked
	ctSNAT
	ctDNAT
)

var ctStateNames = []struct {
	name string
	bit  int
}{
	{"INVALID", ctInvalid}, {"NEW", ctNew}, {"RELATED", ctRelated}, {"ESTABLISHED", ctEstablished},
	{"UNTRACKED", ctUntracked}, {"SNAT", ctSNAT}, {"DNAT", ctDNAT},
}

// ctMatch is "-m conntrack --ctstate" or the older "-m state --state".
type ctMatch struct {
	module string
	set    bool
	neg    bool
	states int
}

func (m *ctMatch) String() string {
	var names []string
	for _, n := range ctStateNames {
		if m.states&n.bit != 0 {
			names = append(names, n.name)
		}
	}
	opt := " --ctstate "
	if m.module == "state" {
		opt = " --state "
	}
	return "-m " + m.module + neg(m.neg) + opt + strings.Join(names, ",")
}

// statisticMatch is "-m statistic --mode random --probability P". The
// kernel keeps P as a 31-bit fraction (round(P * 2^31)) and matches when a
// random 31-bit number is below it, so that fraction is the exact share.
type statisticMatch struct {
	mode string
	neg  bool
	prob uint32 // round(P * 2^31)
	set  bool
}

// p is the probability that the match succeeds.
func (m *statisticMatch) p() float64 {
	p := float64(m.prob) / (1 << 31)
	if m.neg {
		return 1 - p
	}
	return p
}

func (m *statisticMatch) String() string {
	return fmt.Sprintf("-m statistic --mode random%s --probability %.11f", neg(m.neg), float64(m.prob)/(1<<31))
}

// recentMatch is "-m recent": --set adds the source (or destination) to a
// named list, --rcheck tests whether it is there.
type recentMatch struct {
	name    string
	op      string // "set" or "rcheck"
	neg     bool
	seconds int
	reap    bool
	rdest   bool
	mask    netip.Addr // invalid until given or defaulted
	opSeen  bool
	nameSet bool
}

func (m *recentMatch) String() string {
	s := "-m recent" + neg(m.neg) + " --" + m.op
	if m.seconds > 0 {
		s += " --seconds " + strconv.Itoa(m.seconds)
	}
	if m.reap {
		s += " --reap"
	}
	s += " --name " + m.name
	if m.mask.IsValid() {
		s += " --mask " + m.mask.String()
	}
	if m.rdest {
		return s + " --rdest"
	}
	return s + " --rsource"
}

type nfacctMatch struct{ name string }

func (m *nfacctMatch) String() string { return "-m nfacct --nfacct-name " + m.name }

// Target kinds.
const (
	tNone       = ""
	tAccept     = "ACCEPT"
	tDrop       = "DROP"
	tReturn     = "RETURN"
	tJump       = "jump"
	tGoto       = "goto"
	tReject     = "REJECT"
	tMark       = "MARK"
	tDNAT       = "DNAT"
	tMasquerade = "MASQUERADE"
)

// Reject types iptables and ip6tables accept (with their aliases).
var rejectTypes4 = map[string]string{
	"icmp-net-unreachable": "icmp-net-unreachable", "net-unreach": "icmp-net-unreachable",
	"icmp-host-unreachable": "icmp-host-unreachable", "host-unreach": "icmp-host-unreachable",
	"icmp-proto-unreachable": "icmp-proto-unreachable", "proto-unreach": "icmp-proto-unreachable",
	"icmp-port-unreachable": "icmp-port-unreachable", "port-unreach": "icmp-port-unreachable",
	"icmp-net-prohibited": "icmp-net-prohibited", "net-prohib": "icmp-net-prohibited",
	"icmp-host-prohibited": "icmp-host-prohibited", "host-prohib": "icmp-host-prohibited",
	"icmp-admin-prohibited": "icmp-admin-prohibited", "admin-prohib": "icmp-admin-prohibited",
	"tcp-reset": "tcp-reset", "tcp-rst": "tcp-reset",
}

var rejectTypes6 = map[string]string{
	"icmp6-no-route": "icmp6-no-route", "no-route": "icmp6-no-route",
	"icmp6-adm-prohibited": "icmp6-adm-prohibited", "adm-prohibited": "icmp6-adm-prohibited",
	"icmp6-addr-unreachable": "icmp6-addr-unreachable", "addr-unreach": "icmp6-addr-unreachable",
	"icmp6-port-unreachable": "icmp6-port-unreachable", "port-unreach": "icmp6-port-unreachable",
	"icmp6-policy-fail": "icmp6-policy-fail", "policy-fail": "icmp6-policy-fail",
	"icmp6-reject-route": "icmp6-reject-route", "reject-route": "icmp6-reject-route",
	"tcp-reset": "tcp-reset", "tcp-rst": "tcp-reset",
}

type target struct {
	kind  string
	chain string // jump and goto
	// REJECT
	rejectWith string
	// MARK: mark = (mark & ^markMask) ^ markValue, the kernel's form of
	// every --set-mark/--or-mark/--and-mark/--xor-mark.
	markValue, markMask uint32
	markSet             bool
	// DNAT; toPort 0 keeps the destination port.
	toAddr   netip.Addr
	toPort   uint16
	dnatOpts []string // --random, --persistent: no effect without ranges
	// MASQUERADE
	masqOpts []string
}

func (t target) String() string {
	switch t.kind {
	case tNone:
		return ""
	case tJump:
		return "-j " + t.chain
	case tGoto:
		return "-g " + t.chain
	case tReject:
		return "-j REJECT --reject-with " + t.rejectWith
	case tMark:
		return "-j MARK --set-xmark " + markString(t.markValue, t.markMask)
	case tDNAT:
		s := "-j DNAT --to-destination " + t.toString()
		for _, o := range t.dnatOpts {
			s += " " + o
		}
		return s
	case tMasquerade:
		s := "-j MASQUERADE"
		for _, o := range t.masqOpts {
			s += " " + o
		}
		return s
	}
	return "-j " + t.kind
}

func (t target) toString() string {
	if t.toPort == 0 {
		return t.toAddr.String()
	}
	return netip.AddrPortFrom(t.toAddr, t.toPort).String()
}

// String is the rule body in the style of iptables-save (header fields
// first, then matches in order, then the target), without "-A CHAIN".
func (r *rule) String() string {
	var parts []string
	add := func(n bool, opt, val string) {
		if n {
			parts = append(parts, "!")
		}
		parts = append(parts, opt, val)
	}
	if r.src.set {
		add(r.src.neg, "-s", r.src.prefix.String())
	}
	if r.dst.set {
		add(r.dst.neg, "-d", r.dst.prefix.String())
	}
	if r.in.set {
		add(r.in.neg, "-i", r.in.String())
	}
	if r.out.set {
		add(r.out.neg, "-o", r.out.String())
	}
	if r.proto.set {
		add(r.proto.neg, "-p", protoName(r.proto.num))
	}
	for _, m := range r.matches {
		parts = append(parts, m.String())
	}
	if t := r.target.String(); t != "" {
		parts = append(parts, t)
	}
	return strings.Join(parts, " ")
}
