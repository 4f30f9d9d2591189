// Package conntrack lists and removes connection tracking entries over
// netlink.
//
// UDP has no connection teardown: once conntrack has an entry that DNATs a
// flow to an endpoint, every later packet of that flow (same addresses and
// ports) follows the entry, even after the endpoint is gone, until the entry
// times out. The entries must therefore be deleted when an endpoint goes
// away, and when a service that rejected traffic gains endpoints.
package conntrack

import (
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Filter selects entries; zero fields match anything. Protocol is fixed by
// the caller of Delete.
type Filter struct {
	// OrigSrc/OrigSrcPort: the client. Set only to delete one listed flow
	// exactly (see Flow.Filter).
	OrigSrc     netip.Addr
	OrigSrcPort uint16
	// OrigDst/OrigDstPort: where the client sent the packet (a service IP
	// and port, or a node port on any address).
	OrigDst     netip.Addr
	OrigDstPort uint16
	// ReplySrc: who answers, after DNAT (an endpoint IP).
	ReplySrc netip.Addr
}

func (f Filter) String() string {
	s := fmt.Sprintf("orig-dst=%v orig-dport=%d reply-src=%v", f.OrigDst, f.OrigDstPort, f.ReplySrc)
	if f.OrigSrc.IsValid() || f.OrigSrcPort != 0 {
		s = fmt.Sprintf("orig-src=%v orig-sport=%d ", f.OrigSrc, f.OrigSrcPort) + s
	}
	return s
}

// Matches reports whether a flow is selected by the filter, as the kernel
// side (the netlink library's filter) decides it.
func (f Filter) Matches(fl Flow) bool {
	return (!f.OrigSrc.IsValid() || f.OrigSrc == fl.OrigSrc) &&
		(f.OrigSrcPort == 0 || f.OrigSrcPort == fl.OrigSrcPort) &&
		(!f.OrigDst.IsValid() || f.OrigDst == fl.OrigDst) &&
		(f.OrigDstPort == 0 || f.OrigDstPort == fl.OrigDstPort) &&
		(!f.ReplySrc.IsValid() || f.ReplySrc == fl.ReplySrc)
}

// Flow is one UDP conntrack entry: the original direction (client to
// service) and the source of the reply direction, which is the DNAT
// target when the packet was DNATed (else the original destination).
type Flow struct {
	OrigSrc      netip.Addr
	OrigSrcPort  uint16
	OrigDst      netip.Addr
	OrigDstPort  uint16
	ReplySrc     netip.Addr
	ReplySrcPort uint16
}

func (fl Flow) String() string {
	return fmt.Sprintf("%v -> %v reply-from %v",
		netip.AddrPortFrom(fl.OrigSrc, fl.OrigSrcPort), netip.AddrPortFrom(fl.OrigDst, fl.OrigDstPort),
		netip.AddrPortFrom(fl.ReplySrc, fl.ReplySrcPort))
}

// DNATed reports whether the reply comes from somewhere else than where the
// client sent the packet.
func (fl Flow) DNATed() bool {
	return fl.ReplySrc != fl.OrigDst || fl.ReplySrcPort != fl.OrigDstPort
}

// Filter returns a filter that selects this flow and nothing else of the
// table: both ends of the original direction plus the reply source. (Two
// entries cannot share an original tuple.)
func (fl Flow) Filter() Filter {
	return Filter{OrigSrc: fl.OrigSrc, OrigSrcPort: fl.OrigSrcPort, OrigDst: fl.OrigDst, OrigDstPort: fl.OrigDstPort, ReplySrc: fl.ReplySrc}
}

// Interface lists and deletes conntrack entries.
type Interface interface {
	// ListUDP returns the UDP entries of one family.
	ListUDP(ipv6 bool) ([]Flow, error)
	// DeleteUDP deletes the UDP entries of one family matching any filter
	// and returns how many were deleted.
	DeleteUDP(ipv6 bool, filters []Filter) (int, error)
}

// Netlink talks to the kernel's conntrack table of the current network
// namespace.
type Netlink struct{}

var _ Interface = Netlink{}

func family(ipv6 bool) netlink.InetFamily {
	if ipv6 {
		return unix.AF_INET6
	}
	return unix.AF_INET
}

// ListUDP implements Interface. The kernel has no server-side filter for
// dumps either: the whole table of the family comes back and other
// protocols are dropped here.
func (Netlink) ListUDP(ipv6 bool) ([]Flow, error) {
	flows, err := netlink.ConntrackTableList(netlink.ConntrackTable, family(ipv6))
	if err != nil {
		return nil, fmt.Errorf("listing conntrack entries over netlink: %w", err)
	}
	var out []Flow
	for _, f := range flows {
		if f.Forward.Protocol != unix.IPPROTO_UDP {
			continue
		}
		out = append(out, Flow{
			OrigSrc:      addrOf(f.Forward.SrcIP),
			OrigSrcPort:  f.Forward.SrcPort,
			OrigDst:      addrOf(f.Forward.DstIP),
			OrigDstPort:  f.Forward.DstPort,
			ReplySrc:     addrOf(f.Reverse.SrcIP),
			ReplySrcPort: f.Reverse.SrcPort,
		})
	}
	return out, nil
}

// addrOf unmaps IPv4 addresses, which net.IP may hold in 16 bytes, so that
// they compare equal to the model's 4-byte addresses.
func addrOf(ip net.IP) netip.Addr {
	a, _ := netip.AddrFromSlice(ip)
	return a.Unmap()
}

// DeleteUDP implements Interface. The kernel offers no server-side filter
// for deletes, so the library dumps the table once and deletes matches; all
// filters share that one dump.
func (Netlink) DeleteUDP(ipv6 bool, filters []Filter) (int, error) {
	if len(filters) == 0 {
		return 0, nil
	}
	var nf []netlink.CustomConntrackFilter
	for _, f := range filters {
		cf := &netlink.ConntrackFilter{}
		if err := cf.AddProtocol(unix.IPPROTO_UDP); err != nil {
			return 0, err
		}
		if f.OrigSrc.IsValid() {
			if err := cf.AddIP(netlink.ConntrackOrigSrcIP, net.IP(f.OrigSrc.AsSlice())); err != nil {
				return 0, err
			}
		}
		if f.OrigSrcPort != 0 {
			if err := cf.AddPort(netlink.ConntrackOrigSrcPort, f.OrigSrcPort); err != nil {
				return 0, err
			}
		}
		if f.OrigDst.IsValid() {
			if err := cf.AddIP(netlink.ConntrackOrigDstIP, net.IP(f.OrigDst.AsSlice())); err != nil {
				return 0, err
			}
		}
		if f.OrigDstPort != 0 {
			if err := cf.AddPort(netlink.ConntrackOrigDstPort, f.OrigDstPort); err != nil {
				return 0, err
			}
		}
		if f.ReplySrc.IsValid() {
			if err := cf.AddIP(netlink.ConntrackReplySrcIP, net.IP(f.ReplySrc.AsSlice())); err != nil {
				return 0, err
			}
		}
		nf = append(nf, cf)
	}
	n, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, family(ipv6), nf...)
	if err != nil {
		return int(n), fmt.Errorf("deleting stale UDP conntrack entries over netlink: %w", err)
	}
	return int(n), nil
}

// Fake is a conntrack table for unit tests: tests script the flows of each
// family, DeleteUDP removes the matching ones and records the call.
type Fake struct {
	// Flows4 and Flows6 are the UDP entries of each family.
	Flows4, Flows6 []Flow
	// Calls are the DeleteUDP calls with at least one filter.
	Calls []FakeCall
	// ListErr, when set, is returned by ListUDP.
	ListErr error
}

// FakeCall is one DeleteUDP call.
type FakeCall struct {
	IPv6    bool
	Filters []Filter
}

var _ Interface = (*Fake)(nil)

func (f *Fake) table(ipv6 bool) *[]Flow {
	if ipv6 {
		return &f.Flows6
	}
	return &f.Flows4
}

// ListUDP implements Interface.
func (f *Fake) ListUDP(ipv6 bool) ([]Flow, error) {
	if f.ListErr != nil {
		return nil, f.ListErr
	}
	return slices.Clone(*f.table(ipv6)), nil
}

// DeleteUDP implements Interface: it deletes the scripted flows that match
// a filter and returns how many.
func (f *Fake) DeleteUDP(ipv6 bool, filters []Filter) (int, error) {
	if len(filters) == 0 {
		return 0, nil
	}
	f.Calls = append(f.Calls, FakeCall{ipv6, filters})
	t := f.table(ipv6)
	before := len(*t)
	*t = slices.DeleteFunc(*t, func(fl Flow) bool {
		return slices.ContainsFunc(filters, func(fi Filter) bool { return fi.Matches(fl) })
	})
	return before - len(*t), nil
}
