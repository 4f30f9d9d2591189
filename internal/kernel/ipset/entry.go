package ipset

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// Errors of Handle, the same from the real Handle and from ipsettest's
// fake (test with errors.Is; the real Handle wraps the kernel's error).
var (
	// ErrNoSet: the set does not exist.
	ErrNoSet = errors.New("no such set")
	// ErrSetExists: Create found a set of that name with another type or
	// family.
	ErrSetExists = errors.New("a set of that name exists with another type")
	// ErrEntryExists: Add of a member the set has.
	ErrEntryExists = errors.New("the set has this member already")
	// ErrNoEntry: Del of a member the set does not have.
	ErrNoEntry = errors.New("the set has no such member")
	// ErrBadEntry: the entry's text does not fit the set's type and
	// family.
	ErrBadEntry = errors.New("entry does not fit the set")
	// ErrBadSet: a name or type the kernel does not take.
	ErrBadSet = errors.New("invalid set")
	// ErrInUse: Destroy of a set an iptables rule still matches.
	ErrInUse = errors.New("set is in use")
)

// Types are the set types this package handles.
var Types = []string{"hash:ip", "hash:ip,port", "hash:ip,port,ip", "hash:ip,port,net", "hash:net", "bitmap:port"}

// MaxNameLen is the longest set name the kernel takes (IPSET_MAXNAMELEN
// less the NUL).
const MaxNameLen = 31

// CheckSet says why the kernel would not take s, or nil.
func CheckSet(s Set) error {
	if s.Name == "" || len(s.Name) > MaxNameLen {
		return fmt.Errorf("%w: name %q is empty or longer than %d bytes", ErrBadSet, s.Name, MaxNameLen)
	}
	if !validType(s.Type) {
		return fmt.Errorf("%w: %s: unknown type %q", ErrBadSet, s.Name, s.Type)
	}
	if s.Type == "bitmap:port" && s.IPv6 {
		return fmt.Errorf("%w: %s: bitmap:port has no family", ErrBadSet, s.Name)
	}
	return nil
}

func validType(t string) bool {
	for _, v := range Types {
		if v == t {
			return true
		}
	}
	return false
}

// Entry is one member of a set, parsed. Which fields are used depends on
// the set's type:
//
//	hash:ip            Addr
//	hash:ip,port       Addr, Protocol, Port
//	hash:ip,port,ip    Addr, Protocol, Port, Addr2
//	hash:ip,port,net   Addr, Protocol, Port, Net
//	hash:net           Net
//	bitmap:port        Port
type Entry struct {
	Addr     netip.Addr
	Protocol uint8 // IP protocol number: 6 tcp, 17 udp, 132 sctp
	Port     uint16
	Addr2    netip.Addr
	Net      netip.Prefix // masked
}

var protoNames = map[string]uint8{"tcp": 6, "udp": 17, "sctp": 132}

func protoName(p uint8) string {
	for n, v := range protoNames {
		if v == p {
			return n
		}
	}
	return strconv.Itoa(int(p))
}

// ParseEntry parses an entry in ipset's text form for a set of the given
// type and family. Errors wrap ErrBadEntry.
func ParseEntry(typ string, ipv6 bool, s string) (Entry, error) {
	e, err := parseEntry(typ, ipv6, s)
	if err != nil {
		return Entry{}, fmt.Errorf("%w: %q for %s (%s): %v", ErrBadEntry, s, typ, family(typ, ipv6), err)
	}
	return e, nil
}

func family(typ string, ipv6 bool) string {
	switch {
	case typ == "bitmap:port":
		return "no family"
	case ipv6:
		return "inet6"
	}
	return "inet"
}

func parseEntry(typ string, ipv6 bool, s string) (Entry, error) {
	var e Entry
	parts := strings.Split(s, ",")
	want := map[string]int{"hash:ip": 1, "hash:net": 1, "bitmap:port": 1, "hash:ip,port": 2, "hash:ip,port,ip": 3, "hash:ip,port,net": 3}[typ]
	if want == 0 {
		return e, fmt.Errorf("unknown set type")
	}
	if len(parts) != want {
		return e, fmt.Errorf("want %d comma-separated parts, have %d", want, len(parts))
	}
	var err error
	switch typ {
	case "bitmap:port":
		e.Port, err = parsePort(parts[0])
		return e, err
	case "hash:net":
		e.Net, err = parseNet(parts[0], ipv6)
		return e, err
	}
	if e.Addr, err = parseAddr(parts[0], ipv6); err != nil {
		return e, err
	}
	if typ == "hash:ip" {
		return e, nil
	}
	pp := strings.SplitN(parts[1], ":", 2)
	if len(pp) != 2 {
		return e, fmt.Errorf("%q is no proto:port", parts[1])
	}
	p, ok := protoNames[pp[0]]
	if !ok {
		return e, fmt.Errorf("protocol %q is none of tcp, udp, sctp", pp[0])
	}
	e.Protocol = p
	if e.Port, err = parsePort(pp[1]); err != nil {
		return e, err
	}
	switch typ {
	case "hash:ip,port,ip":
		e.Addr2, err = parseAddr(parts[2], ipv6)
	case "hash:ip,port,net":
		e.Net, err = parseNet(parts[2], ipv6)
	}
	return e, err
}

func parseAddr(s string, ipv6 bool) (netip.Addr, error) {
	a, err := netip.ParseAddr(s)
	if err != nil {
		return a, err
	}
	if a.Zone() != "" || a.Is4In6() {
		return a, fmt.Errorf("address %s: no zone or IPv4-mapped address", s)
	}
	if a.Is6() != ipv6 {
		return a, fmt.Errorf("address %s is not of the set's family", s)
	}
	return a, nil
}

// parseNet takes a prefix or a bare address (a host prefix), as ipset
// does, and masks it (the kernel stores the network).
func parseNet(s string, ipv6 bool) (netip.Prefix, error) {
	if !strings.Contains(s, "/") {
		a, err := parseAddr(s, ipv6)
		if err != nil {
			return netip.Prefix{}, err
		}
		return netip.PrefixFrom(a, a.BitLen()), nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return p, err
	}
	if _, err := parseAddr(p.Addr().String(), ipv6); err != nil {
		return p, err
	}
	if p.Bits() == 0 {
		// The kernel refuses a zero prefix length in hash:net types.
		return p, fmt.Errorf("prefix length 0")
	}
	return p.Masked(), nil
}

func parsePort(s string) (uint16, error) {
	n, err := strconv.ParseUint(s, 10, 16)
	if err != nil {
		return 0, fmt.Errorf("port %q: not a number 0-65535", s)
	}
	return uint16(n), nil
}

// Format writes the entry in ipset's text form for a set of type typ, as
// `ipset list` prints it: a host prefix is a bare address.
func (e Entry) Format(typ string) string {
	net := func(p netip.Prefix) string {
		if p.Bits() == p.Addr().BitLen() {
			return p.Addr().String()
		}
		return p.String()
	}
	ipPort := func() string {
		return e.Addr.String() + "," + protoName(e.Protocol) + ":" + strconv.Itoa(int(e.Port))
	}
	switch typ {
	case "bitmap:port":
		return strconv.Itoa(int(e.Port))
	case "hash:net":
		return net(e.Net)
	case "hash:ip":
		return e.Addr.String()
	case "hash:ip,port":
		return ipPort()
	case "hash:ip,port,ip":
		return ipPort() + "," + e.Addr2.String()
	case "hash:ip,port,net":
		return ipPort() + "," + net(e.Net)
	}
	return fmt.Sprintf("%+v", e)
}

// Canonical returns the entry as Entries lists it (ipset's form: a host
// prefix without its length, a masked network, compressed IPv6), so a
// caller can compare what it wants with what Entries lists.
func Canonical(typ string, ipv6 bool, s string) (string, error) {
	e, err := ParseEntry(typ, ipv6, s)
	if err != nil {
		return "", err
	}
	return e.Format(typ), nil
}
