package netns

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

func (n *NS) link(name string) (netlink.Link, error) {
	l, err := n.nl.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("netns %s: link %s: %w", n.Name, name, err)
	}
	return l, nil
}

// LinkUp sets an interface up.
func (n *NS) LinkUp(name string) error {
	l, err := n.link(name)
	if err != nil {
		return err
	}
	if err := n.nl.LinkSetUp(l); err != nil {
		return fmt.Errorf("netns %s: set %s up: %w", n.Name, name, err)
	}
	return nil
}

// AddBridge creates a bridge and sets it up. STP is off (the default), so
// ports forward at once; multicast snooping is off so IPv6 neighbour
// discovery never depends on which MLD reports the bridge saw.
func (n *NS) AddBridge(name string) error {
	snoop := false
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name}, MulticastSnooping: &snoop}
	if err := n.nl.LinkAdd(br); err != nil {
		return fmt.Errorf("netns %s: add bridge %s: %w", n.Name, name, err)
	}
	return n.LinkUp(name)
}

// SetMaster enslaves an interface to a bridge of the same namespace.
func (n *NS) SetMaster(name, bridge string) error {
	l, err := n.link(name)
	if err != nil {
		return err
	}
	br, err := n.link(bridge)
	if err != nil {
		return err
	}
	if err := n.nl.LinkSetMaster(l, br); err != nil {
		return fmt.Errorf("netns %s: set master of %s to %s: %w", n.Name, name, bridge, err)
	}
	return nil
}

// SetHairpin lets a bridge port send frames back out the port they came in
// on. A pod that reaches its own service is DNATed back to itself; with
// bridge-nf-call-iptables the bridge then bridges the packet to the pod's
// own port, which only hairpin mode allows (kubelet's hairpin-veth mode).
func (n *NS) SetHairpin(name string, on bool) error {
	l, err := n.link(name)
	if err != nil {
		return err
	}
	if err := n.nl.LinkSetHairpin(l, on); err != nil {
		return fmt.Errorf("netns %s: hairpin mode of %s: %w", n.Name, name, err)
	}
	return nil
}

// Veth creates a veth pair: aName in a, its peer bName in b, both up. The
// pair is created inside a with the peer placed directly in b, so it never
// exists in the test process's own namespace.
func Veth(a *NS, aName string, b *NS, bName string) error {
	v := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: aName},
		PeerName:      bName,
		PeerNamespace: netlink.NsFd(int(b.handle)),
	}
	if err := a.nl.LinkAdd(v); err != nil {
		return fmt.Errorf("veth %s/%s <-> %s/%s: %w", a.Name, aName, b.Name, bName, err)
	}
	if err := a.LinkUp(aName); err != nil {
		return err
	}
	return b.LinkUp(bName)
}

// AddAddr adds an address (with its prefix length) to an interface. IPv6
// addresses skip duplicate address detection, so they are usable at once.
func (n *NS) AddAddr(dev string, p netip.Prefix) error {
	l, err := n.link(dev)
	if err != nil {
		return err
	}
	a := &netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}}
	if p.Addr().Is6() {
		a.Flags = unix.IFA_F_NODAD
	}
	if err := n.nl.AddrAdd(l, a); err != nil {
		return fmt.Errorf("netns %s: add address %s to %s: %w", n.Name, p, dev, err)
	}
	return nil
}

// AddRoute adds a route to dst via the gateway gw (which must be reachable
// on a connected network). dst may be a default route (0.0.0.0/0, ::/0).
func (n *NS) AddRoute(dst netip.Prefix, gw netip.Addr) error {
	if dst.Addr().Is4() != gw.Is4() {
		return fmt.Errorf("netns %s: route %s via %s mixes IP families", n.Name, dst, gw)
	}
	r := &netlink.Route{
		Dst: &net.IPNet{IP: dst.Masked().Addr().AsSlice(), Mask: net.CIDRMask(dst.Bits(), dst.Addr().BitLen())},
		Gw:  gw.AsSlice(),
	}
	if err := n.nl.RouteAdd(r); err != nil {
		return fmt.Errorf("netns %s: route %s via %s: %w", n.Name, dst, gw, err)
	}
	return nil
}

// Addrs lists the addresses of the namespace's interfaces (loopback
// included), for assertions such as "the source seen is one of node-a's".
func (n *NS) Addrs() ([]netip.Addr, error) {
	as, err := n.nl.AddrList(nil, unix.AF_UNSPEC)
	if err != nil {
		return nil, fmt.Errorf("netns %s: list addresses: %w", n.Name, err)
	}
	var out []netip.Addr
	for _, a := range as {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			out = append(out, ip.Unmap())
		}
	}
	return out, nil
}
