package proxy

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/kproxy/kproxy/internal/model"
)

// LocalAddrs lists this network namespace's interface addresses (every
// mode's Handles.LocalAddrs; trace --live).
func LocalAddrs() ([]netip.Addr, error) { return LocalAddrsExcept("") }

// LocalAddrsExcept lists the addresses of every interface but the one
// named skip (ipvs mode's kube-ipvs0, whose service addresses are no node
// addresses).
func LocalAddrsExcept(skip string) ([]netip.Addr, error) {
	ifaces, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, ifc := range ifaces {
		if skip != "" && ifc.Name == skip {
			continue
		}
		addrs, err := ifc.Addrs()
		if err != nil {
			return nil, err
		}
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(n.IP); ok {
					out = append(out, ip.Unmap())
				}
			}
		}
	}
	return out, nil
}

// NodePortHostAddrs reads the host's addresses for a full sync's node
// port rules (nodePortAddresses given as CIDRs) with read; with no host
// to ask (read nil) the Node's own addresses stand in, none without a
// Node.
func NodePortHostAddrs(read func() ([]netip.Addr, error), node *model.Node) ([]netip.Addr, error) {
	if read == nil {
		if node == nil {
			return nil, nil
		}
		return node.Addresses, nil
	}
	addrs, err := read()
	if err != nil {
		return nil, fmt.Errorf("reading local addresses for nodePortAddresses: %w", err)
	}
	return addrs, nil
}
