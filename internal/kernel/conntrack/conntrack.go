// Package conntrack removes stale connection tracking entries over netlink.
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

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Filter selects entries; zero fields match anything. Protocol is fixed by
// the caller of Delete.
type Filter struct {
	// OrigDst/OrigDstPort: where the client sent the packet (a service IP
	// and port, or a node port on any address).
	OrigDst     netip.Addr
	OrigDstPort uint16
	// ReplySrc: who answers, after DNAT (an endpoint IP).
	ReplySrc netip.Addr
}

func (f Filter) String() string {
	return fmt.Sprintf("orig-dst=%v orig-dport=%d reply-src=%v", f.OrigDst, f.OrigDstPort, f.ReplySrc)
}

// Interface deletes conntrack entries.
type Interface interface {
	// DeleteUDP deletes the UDP entries of one family matching any filter
	// and returns how many were deleted.
	DeleteUDP(ipv6 bool, filters []Filter) (int, error)
}

// Netlink talks to the kernel's conntrack table of the current network
// namespace.
type Netlink struct{}

var _ Interface = Netlink{}

// DeleteUDP implements Interface. The kernel offers no server-side filter
// for deletes, so the library dumps the table once and deletes matches; all
// filters share that one dump.
func (Netlink) DeleteUDP(ipv6 bool, filters []Filter) (int, error) {
	if len(filters) == 0 {
		return 0, nil
	}
	fam := netlink.InetFamily(unix.AF_INET)
	if ipv6 {
		fam = unix.AF_INET6
	}
	var nf []netlink.CustomConntrackFilter
	for _, f := range filters {
		cf := &netlink.ConntrackFilter{}
		if err := cf.AddProtocol(unix.IPPROTO_UDP); err != nil {
			return 0, err
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
	n, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, fam, nf...)
	if err != nil {
		return int(n), fmt.Errorf("deleting stale UDP conntrack entries over netlink: %w", err)
	}
	return int(n), nil
}

// Fake records what was asked; for unit tests.
type Fake struct {
	Calls []FakeCall
}

// FakeCall is one DeleteUDP call.
type FakeCall struct {
	IPv6    bool
	Filters []Filter
}

var _ Interface = (*Fake)(nil)

// DeleteUDP implements Interface.
func (f *Fake) DeleteUDP(ipv6 bool, filters []Filter) (int, error) {
	if len(filters) > 0 {
		f.Calls = append(f.Calls, FakeCall{ipv6, filters})
	}
	return 0, nil
}
