package ipvs

import (
	"errors"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	kipset "github.com/kproxy/kproxy/internal/kernel/ipset"
	"github.com/kproxy/kproxy/internal/kernel/netdev"
)

// Handles are the kernel handles ipvs mode's proxier works through. With
// WithHandles, FindLeftovers and CleanupLeftovers read and change the
// kernel through them instead of their own netlink sockets: tests run the
// cleanup on the same stateful fakes (ipvstest, ipsettest, netdevtest) the
// proxier programmed, so "removes what ipvs mode made and nothing else"
// is checked against what the proxier really made.
type Handles struct {
	IPVS   Handle
	IPSet  kipset.Handle
	NetDev netdev.Handle
	// LocalAddrs lists the node's addresses on every interface (NodePort
	// virtual servers are on them).
	LocalAddrs func() ([]netip.Addr, error)
}

// WithHandles acts through h; the caller keeps and closes the handles.
func WithHandles(h Handles) Option { return withKernel(handlesKernel{h}) }

type handlesKernel struct{ h Handles }

var _ kernel = handlesKernel{}

func (k handlesKernel) link(name string) (bool, []netip.Addr, error) {
	addrs, err := k.h.NetDev.Addresses(name)
	if errors.Is(err, netdev.ErrNoLink) {
		return false, nil, nil
	}
	return err == nil, addrs, err
}

func (k handlesKernel) deleteLink(name string) error { return k.h.NetDev.DeleteLink(name) }

func (k handlesKernel) localAddrs() ([]netip.Addr, error) {
	if k.h.LocalAddrs == nil {
		return nil, nil
	}
	return k.h.LocalAddrs()
}

// ipsets lists kube-proxy's sets with their addresses and ports, read
// from the members' text form as the netlink kernel reads them from
// attributes: an address where the member has one, a port (with its
// protocol, if any) where it has one.
func (k handlesKernel) ipsets() ([]ipset, error) {
	have, err := k.h.IPSet.Sets()
	if err != nil {
		return nil, err
	}
	var out []ipset
	for _, name := range kubeProxySetNames() {
		if !slices.Contains(have, name) {
			continue
		}
		es, err := k.h.IPSet.Entries(name)
		if err != nil {
			return nil, err
		}
		s := ipset{Name: name}
		for _, e := range es {
			parts := strings.Split(e, ",")
			if a, err := netip.ParseAddr(parts[0]); err == nil {
				s.Addrs = append(s.Addrs, a.Unmap())
			} else if p, err := strconv.ParseUint(parts[0], 10, 16); err == nil {
				s.Ports = append(s.Ports, portEntry{Port: uint16(p)})
			}
			if len(parts) > 1 {
				proto, port, ok := strings.Cut(parts[1], ":")
				p, err := strconv.ParseUint(port, 10, 16)
				if ok && err == nil {
					s.Ports = append(s.Ports, portEntry{Protocol: map[string]uint8{"tcp": protoTCP, "udp": protoUDP, "sctp": protoSCTP}[proto], Port: uint16(p)})
				}
			}
		}
		out = append(out, s)
	}
	return out, nil
}

func (k handlesKernel) destroyIPSet(name string) error { return k.h.IPSet.Destroy(name) }

func (k handlesKernel) ipvsAvailable() (bool, error) { return true, nil }

func (k handlesKernel) virtualServers() ([]VirtualServer, error) {
	svcs, err := k.h.IPVS.Services()
	if err != nil {
		return nil, err
	}
	out := make([]VirtualServer, 0, len(svcs))
	for _, s := range svcs {
		out = append(out, s.VirtualServer)
	}
	return out, nil
}

func (k handlesKernel) deleteVirtualServer(vs VirtualServer) error {
	return k.h.IPVS.DeleteService(vs)
}

func (k handlesKernel) close() {}
