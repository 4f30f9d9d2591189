package proxy

import (
	"net"
	"net/netip"
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
