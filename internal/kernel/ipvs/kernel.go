package ipvs

import (
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Files that tell whether ip_vs and ip_set are loaded.
var (
	procIPVS = "/proc/net/ip_vs"
	sysIPSet = "/sys/module/ip_set"
)

// errUnsupported: the kernel lacks the feature (ipset).
var errUnsupported = errors.New("not supported by the kernel")

// kernel is everything the cleanup reads and changes; unit tests use a
// fake.
type kernel interface {
	link(name string) (exists bool, addrs []netip.Addr, err error)
	deleteLink(name string) error
	localAddrs() ([]netip.Addr, error)
	// ipsets lists all sets; errUnsupported without ipset in the kernel.
	ipsets() ([]ipset, error)
	destroyIPSet(name string) error
	ipvsAvailable() (bool, error)
	virtualServers() ([]VirtualServer, error)
	deleteVirtualServer(VirtualServer) error
	close()
}

// netlinkKernel talks netlink in one network namespace: rtnetlink for
// the interface, nfnetlink for ipsets and generic netlink for IPVS.
type netlinkKernel struct {
	h    *netlink.Handle
	ns   netns.NsHandle // -1: the current namespace
	genl *nl.NetlinkSocket
}

func newNetlinkKernel(netnsPath string) (*netlinkKernel, error) {
	k := &netlinkKernel{ns: -1}
	var err error
	if netnsPath == "" {
		k.h, err = netlink.NewHandle()
	} else {
		if k.ns, err = netns.GetFromPath(netnsPath); err != nil {
			return nil, fmt.Errorf("ipvs: opening network namespace %s: %w", netnsPath, err)
		}
		k.h, err = netlink.NewHandleAt(k.ns)
	}
	if err != nil {
		k.close()
		return nil, fmt.Errorf("ipvs: opening netlink: %w", err)
	}
	return k, nil
}

func (k *netlinkKernel) close() {
	if k.genl != nil {
		k.genl.Close()
		k.genl = nil
	}
	if k.h != nil {
		k.h.Close()
		k.h = nil
	}
	if k.ns >= 0 {
		_ = k.ns.Close()
		k.ns = -1
	}
}

func (k *netlinkKernel) link(name string) (bool, []netip.Addr, error) {
	l, err := k.h.LinkByName(name)
	var notFound netlink.LinkNotFoundError
	if errors.As(err, &notFound) {
		return false, nil, nil
	}
	if err != nil {
		return false, nil, fmt.Errorf("reading interface %s: %w", name, err)
	}
	addrs, err := k.h.AddrList(l, netlink.FAMILY_ALL)
	if err != nil {
		return true, nil, fmt.Errorf("reading the addresses of %s: %w", name, err)
	}
	var out []netip.Addr
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			out = append(out, ip.Unmap())
		}
	}
	return true, out, nil
}

func (k *netlinkKernel) deleteLink(name string) error {
	l, err := k.h.LinkByName(name)
	var notFound netlink.LinkNotFoundError
	if errors.As(err, &notFound) {
		return nil
	}
	if err != nil {
		return err
	}
	return k.h.LinkDel(l)
}

func (k *netlinkKernel) localAddrs() ([]netip.Addr, error) {
	addrs, err := k.h.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("listing local addresses: %w", err)
	}
	var out []netip.Addr
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			out = append(out, ip.Unmap())
		}
	}
	return out, nil
}

func (k *netlinkKernel) ipsets() ([]ipset, error) {
	// Same for ipset: nfnetlink loads ip_set on the first request. The
	// module directory exists once it is loaded or built in (it has
	// parameters).
	if _, err := os.Stat(sysIPSet); errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("ipset: %w: %s does not exist", errUnsupported, sysIPSet)
	}
	// Only kube-proxy's sets, one by one: listing all would dump every
	// member of other tools' sets too (Calico's and kube-router's can be
	// large).
	var out []ipset
	for _, name := range kubeProxySetNames() {
		r, err := k.h.IpsetList(name)
		if errors.Is(err, unix.ENOENT) {
			continue
		}
		if err != nil {
			// nfnetlink answers for a subsystem it does not have with one
			// of these.
			if errors.Is(err, unix.EPROTONOSUPPORT) || errors.Is(err, unix.EOPNOTSUPP) {
				return nil, fmt.Errorf("ipset: %w: %w", errUnsupported, err)
			}
			return nil, fmt.Errorf("listing ipset %s: %w", name, err)
		}
		s := ipset{Name: r.SetName}
		for _, e := range r.Entries {
			if ip, ok := netip.AddrFromSlice(e.IP); ok {
				s.Addrs = append(s.Addrs, ip.Unmap())
			}
			if e.Port != nil {
				pe := portEntry{Port: *e.Port}
				if e.Protocol != nil {
					pe.Protocol = *e.Protocol
				}
				s.Ports = append(s.Ports, pe)
			}
		}
		out = append(out, s)
	}
	return out, nil
}

func (k *netlinkKernel) destroyIPSet(name string) error {
	return k.h.IpsetDestroy(name)
}

// ipvsFamily returns IPVS's generic netlink family id; 0 when the kernel
// has no IPVS (CONFIG_IP_VS off, or the ip_vs module not loaded, in which
// case kube-proxy cannot have left virtual servers either).
func (k *netlinkKernel) ipvsFamily() (uint16, error) {
	// Asking generic netlink for an unknown family makes the kernel try to
	// load its module (ip_vs has a family alias). /proc/net/ip_vs exists in
	// every namespace once ip_vs is loaded: without it there is no IPVS
	// state to clean, and nothing is loaded just to look.
	if _, err := os.Stat(procIPVS); errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	f, err := k.h.GenlFamilyGet(ipvsGenlName)
	if errors.Is(err, unix.ENOENT) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("looking up the %s generic netlink family: %w", ipvsGenlName, err)
	}
	return f.ID, nil
}

func (k *netlinkKernel) ipvsAvailable() (bool, error) {
	id, err := k.ipvsFamily()
	return id != 0, err
}

// genlSocket opens a generic netlink socket in the namespace (the
// netlink.Handle's own sockets are not reachable for raw requests).
func (k *netlinkKernel) genlSocket() (*nl.NetlinkSocket, error) {
	if k.genl != nil {
		return k.genl, nil
	}
	var err error
	if k.ns >= 0 {
		cur, cerr := netns.Get()
		if cerr != nil {
			return nil, cerr
		}
		defer cur.Close()
		k.genl, err = nl.GetNetlinkSocketAt(k.ns, cur, unix.NETLINK_GENERIC)
	} else {
		k.genl, err = nl.GetNetlinkSocketAt(netns.None(), netns.None(), unix.NETLINK_GENERIC)
	}
	return k.genl, err
}

func (k *netlinkKernel) ipvsRequest(cmd uint8, flags int) (*nl.NetlinkRequest, error) {
	id, err := k.ipvsFamily()
	if err != nil {
		return nil, err
	}
	if id == 0 {
		return nil, fmt.Errorf("ipvs: %w", errUnsupported)
	}
	s, err := k.genlSocket()
	if err != nil {
		return nil, fmt.Errorf("opening a generic netlink socket: %w", err)
	}
	req := nl.NewNetlinkRequest(int(id), flags)
	req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_GENERIC: {Socket: s}}
	req.AddData(&nl.Genlmsg{Command: cmd, Version: ipvsGenlVersion})
	return req, nil
}

func (k *netlinkKernel) virtualServers() ([]VirtualServer, error) {
	req, err := k.ipvsRequest(ipvsCmdGetService, unix.NLM_F_DUMP)
	if err != nil {
		return nil, err
	}
	msgs, err := req.Execute(unix.NETLINK_GENERIC, 0)
	if err != nil {
		return nil, fmt.Errorf("listing IPVS virtual servers: %w", err)
	}
	var out []VirtualServer
	for _, m := range msgs {
		vs, ok, err := parseServiceMessage(m)
		if err != nil {
			return nil, fmt.Errorf("parsing an IPVS virtual server: %w", err)
		}
		if ok {
			out = append(out, vs)
		}
	}
	return out, nil
}

func (k *netlinkKernel) deleteVirtualServer(vs VirtualServer) error {
	req, err := k.ipvsRequest(ipvsCmdDelService, unix.NLM_F_ACK)
	if err != nil {
		return err
	}
	req.AddData(serviceAttr(vs))
	_, err = req.Execute(unix.NETLINK_GENERIC, 0)
	return err
}
