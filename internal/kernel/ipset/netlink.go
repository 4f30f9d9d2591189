package ipset

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// ipset's command-level flag for a names-only dump (IPSET_FLAG_LIST_SETNAME
// in include/uapi/linux/netfilter/ipset/ip_set.h).
const ipsetFlagListSetName = 1 << 1

// netlinkHandle is the real Handle: nfnetlink's ipset subsystem, through
// github.com/vishvananda/netlink where it does the job (create, destroy,
// members, hash-type adds and deletes) and raw requests on the same
// library's netlink sockets where it does not: it has no names-only list
// and no header request, its destroy of a missing set succeeds (no
// NLM_F_EXCL), and it sends a protocol with every port, which
// bitmap:port refuses, so bitmap:port members are added and deleted here.
type netlinkHandle struct {
	mu    sync.Mutex
	h     *netlink.Handle
	sock  *nl.NetlinkSocket
	types map[string]Set // name → type and family, as learnt
}

// NewHandle opens ipset in the network namespace at netnsPath ("" is the
// current one).
func NewHandle(netnsPath string) (Handle, error) {
	ns := netns.None()
	if netnsPath != "" {
		var err error
		if ns, err = netns.GetFromPath(netnsPath); err != nil {
			return nil, fmt.Errorf("ipset: opening network namespace %s: %w", netnsPath, err)
		}
		defer ns.Close()
	}
	var (
		h   *netlink.Handle
		err error
	)
	if netnsPath == "" {
		h, err = netlink.NewHandle(unix.NETLINK_NETFILTER)
	} else {
		h, err = netlink.NewHandleAt(ns, unix.NETLINK_NETFILTER)
	}
	if err != nil {
		return nil, fmt.Errorf("ipset: opening netlink: %w", err)
	}
	var sock *nl.NetlinkSocket
	if netnsPath == "" {
		sock, err = nl.GetNetlinkSocketAt(netns.None(), netns.None(), unix.NETLINK_NETFILTER)
	} else {
		cur, cerr := netns.Get()
		if cerr != nil {
			h.Close()
			return nil, cerr
		}
		sock, err = nl.GetNetlinkSocketAt(ns, cur, unix.NETLINK_NETFILTER)
		cur.Close()
	}
	if err != nil {
		h.Close()
		return nil, fmt.Errorf("ipset: opening netlink: %w", err)
	}
	return &netlinkHandle{h: h, sock: sock, types: map[string]Set{}}, nil
}

// kernelErr maps the kernel's answer to this package's errors.
func kernelErr(err error, exist error) error {
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		var ie nl.IPSetError
		if !errors.As(err, &ie) {
			return err
		}
		errno = syscall.Errno(ie)
	}
	switch int(errno) {
	case int(unix.ENOENT):
		return fmt.Errorf("%w (%w)", ErrNoSet, err)
	case nl.IPSET_ERR_EXIST:
		if exist != nil {
			return fmt.Errorf("%w (%w)", exist, err)
		}
	case nl.IPSET_ERR_BUSY, nl.IPSET_ERR_REFERENCED:
		return fmt.Errorf("%w (%w)", ErrInUse, err)
	case nl.IPSET_ERR_EXIST_SETNAME2, int(unix.EEXIST):
		return fmt.Errorf("%w (%w)", ErrSetExists, err)
	case nl.IPSET_ERR_INVALID_CIDR, nl.IPSET_ERR_INVALID_FAMILY, nl.IPSET_ERR_IPADDR_IPV4, nl.IPSET_ERR_IPADDR_IPV6, nl.IPSET_ERR_PROTOCOL:
		return fmt.Errorf("%w (%w)", ErrBadEntry, err)
	}
	return err
}

func (h *netlinkHandle) request(cmd int, flags int) *nl.NetlinkRequest {
	req := nl.NewNetlinkRequest(cmd|(unix.NFNL_SUBSYS_IPSET<<8), flags)
	req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_NETFILTER: {Socket: h.sock}}
	req.AddData(&nl.Nfgenmsg{NfgenFamily: uint8(unix.AF_NETLINK), Version: nl.NFNETLINK_V0})
	req.AddData(nl.NewRtAttr(nl.IPSET_ATTR_PROTOCOL, nl.Uint8Attr(nl.IPSET_PROTOCOL)))
	return req
}

// header reads a set's type and family (IPSET_CMD_HEADER).
func (h *netlinkHandle) header(name string) (Set, error) {
	if s, ok := h.types[name]; ok {
		return s, nil
	}
	req := h.request(nl.IPSET_CMD_HEADER, nl.GetIpsetFlags(nl.IPSET_CMD_HEADER))
	req.AddData(nl.NewRtAttr(nl.IPSET_ATTR_SETNAME, nl.ZeroTerminated(name)))
	msgs, err := req.Execute(unix.NETLINK_NETFILTER, 0)
	if err != nil {
		return Set{}, fmt.Errorf("ipset %s: %w", name, kernelErr(err, nil))
	}
	for _, m := range msgs {
		s, ok := parseHeader(m)
		if ok && s.Name == name {
			h.types[name] = s
			return s, nil
		}
	}
	return Set{}, fmt.Errorf("ipset %s: no header in the kernel's answer", name)
}

// parseHeader reads name, type and family from a LIST or HEADER answer.
func parseHeader(m []byte) (Set, bool) {
	if len(m) < nl.SizeofNfgenmsg {
		return Set{}, false
	}
	var s Set
	var family uint8
	for a := range nl.ParseAttributes(m[nl.SizeofNfgenmsg:]) {
		switch a.Type & nl.NLA_TYPE_MASK {
		case nl.IPSET_ATTR_SETNAME:
			s.Name = nl.BytesToString(a.Value)
		case nl.IPSET_ATTR_TYPENAME:
			s.Type = nl.BytesToString(a.Value)
		case nl.IPSET_ATTR_FAMILY:
			if len(a.Value) > 0 {
				family = a.Value[0]
			}
		}
	}
	s.IPv6 = family == unix.AF_INET6
	return s, s.Name != ""
}

// Sets lists the names, sorted, as the fake does.
func (h *netlinkHandle) Sets() ([]string, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	req := h.request(nl.IPSET_CMD_LIST, nl.GetIpsetFlags(nl.IPSET_CMD_LIST))
	req.AddData(&nl.Uint32Attribute{Type: nl.IPSET_ATTR_FLAGS | nl.NLA_F_NET_BYTEORDER, Value: ipsetFlagListSetName})
	msgs, err := req.Execute(unix.NETLINK_NETFILTER, 0)
	if err != nil {
		return nil, fmt.Errorf("listing ipsets: %w", kernelErr(err, nil))
	}
	seen := map[string]bool{}
	var out []string
	for _, m := range msgs {
		if s, ok := parseHeader(m); ok && !seen[s.Name] {
			seen[s.Name] = true
			out = append(out, s.Name)
		}
	}
	slices.Sort(out)
	return out, nil
}

func (h *netlinkHandle) Create(s Set) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := CheckSet(s); err != nil {
		return err
	}
	o := netlink.IpsetCreateOptions{Family: unix.AF_INET, Comments: s.Comment != ""}
	if s.IPv6 {
		o.Family = unix.AF_INET6
	}
	switch s.Type {
	case "bitmap:port":
		o.PortFrom, o.PortTo = 0, 65535
		if o.Comments {
			o.Revision = 2 // the first with comments
		}
	case "hash:net":
		if o.Comments {
			o.Revision = 4 // idem; the library picks the others' revisions
		}
	}
	err := h.h.IpsetCreate(s.Name, s.Type, o)
	if err == nil {
		h.types[s.Name] = Set{Name: s.Name, Type: s.Type, IPv6: s.IPv6}
		return nil
	}
	if kerr := kernelErr(err, nil); errors.Is(kerr, ErrSetExists) {
		delete(h.types, s.Name)
		cur, herr := h.header(s.Name)
		if herr != nil {
			return fmt.Errorf("creating ipset %s (%s): %w", s.Name, s.Type, kerr)
		}
		if cur.Type == s.Type && cur.IPv6 == s.IPv6 {
			return nil
		}
		return fmt.Errorf("creating ipset %s (%s, %s): %w: %s, %s", s.Name, s.Type, family(s.Type, s.IPv6), ErrSetExists, cur.Type, family(cur.Type, cur.IPv6))
	}
	return fmt.Errorf("creating ipset %s (%s): %w", s.Name, s.Type, kernelErr(err, nil))
}

func (h *netlinkHandle) Destroy(name string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.types, name)
	// With NLM_F_EXCL, as `ipset destroy` without -exist: the kernel
	// answers ENOENT for a missing set instead of nothing (the library's
	// IpsetDestroy leaves it out).
	req := h.request(nl.IPSET_CMD_DESTROY, nl.GetIpsetFlags(nl.IPSET_CMD_DESTROY)|unix.NLM_F_EXCL)
	req.AddData(nl.NewRtAttr(nl.IPSET_ATTR_SETNAME, nl.ZeroTerminated(name)))
	if _, err := req.Execute(unix.NETLINK_NETFILTER, 0); err != nil {
		return fmt.Errorf("destroying ipset %s: %w", name, kernelErr(err, nil))
	}
	return nil
}

func addr(ip net.IP) netip.Addr {
	a, _ := netip.AddrFromSlice(ip)
	return a.Unmap()
}

func (h *netlinkHandle) Entries(name string) ([]string, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	r, err := h.h.IpsetList(name)
	if err != nil {
		return nil, fmt.Errorf("listing ipset %s: %w", name, kernelErr(err, nil))
	}
	if !validType(r.TypeName) {
		return nil, fmt.Errorf("listing ipset %s: type %s is none this package reads", name, r.TypeName)
	}
	h.types[name] = Set{Name: name, Type: r.TypeName, IPv6: r.Family == unix.AF_INET6}
	out := make([]string, 0, len(r.Entries))
	for _, ke := range r.Entries {
		e := Entry{Addr: addr(ke.IP)}
		if ke.Port != nil {
			e.Port = *ke.Port
		}
		if ke.Protocol != nil {
			e.Protocol = *ke.Protocol
		}
		switch r.TypeName {
		case "hash:net":
			e.Net = netip.PrefixFrom(e.Addr, int(ke.CIDR))
		case "hash:ip,port,ip":
			e.Addr2 = addr(ke.IP2)
		case "hash:ip,port,net":
			a2 := addr(ke.IP2)
			bits := int(ke.CIDR2)
			if bits == 0 {
				bits = a2.BitLen()
			}
			e.Net = netip.PrefixFrom(a2, bits)
		}
		out = append(out, e.Format(r.TypeName))
	}
	return out, nil
}

func (h *netlinkHandle) Add(name, entry string) error {
	return h.addDel(nl.IPSET_CMD_ADD, name, entry)
}

func (h *netlinkHandle) Del(name, entry string) error {
	return h.addDel(nl.IPSET_CMD_DEL, name, entry)
}

func (h *netlinkHandle) addDel(cmd int, name, entry string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	verb, exist := "adding %s to ipset %s: %w", ErrEntryExists
	if cmd == nl.IPSET_CMD_DEL {
		verb, exist = "deleting %s from ipset %s: %w", ErrNoEntry
	}
	s, err := h.header(name)
	if err != nil {
		return fmt.Errorf(verb, entry, name, err)
	}
	e, err := ParseEntry(s.Type, s.IPv6, entry)
	if err != nil {
		return fmt.Errorf(verb, entry, name, err)
	}
	if s.Type == "bitmap:port" {
		err = h.bitmapPort(cmd, name, e.Port)
	} else {
		ke := &netlink.IPSetEntry{}
		if e.Addr.IsValid() {
			ke.IP = net.IP(e.Addr.AsSlice())
		}
		switch s.Type {
		case "hash:net":
			ke.IP = net.IP(e.Net.Addr().AsSlice())
			ke.CIDR = uint8(e.Net.Bits())
		case "hash:ip,port", "hash:ip,port,ip", "hash:ip,port,net":
			proto, port := e.Protocol, e.Port
			ke.Protocol, ke.Port = &proto, &port
		}
		switch s.Type {
		case "hash:ip,port,ip":
			ke.IP2 = net.IP(e.Addr2.AsSlice())
		case "hash:ip,port,net":
			ke.IP2 = net.IP(e.Net.Addr().AsSlice())
			ke.CIDR2 = uint8(e.Net.Bits())
		}
		if cmd == nl.IPSET_CMD_ADD {
			err = h.h.IpsetAdd(name, ke)
		} else {
			err = h.h.IpsetDel(name, ke)
		}
	}
	if err != nil {
		// The set may have gone, or come back with another type: learn
		// it again next time.
		delete(h.types, name)
		return fmt.Errorf(verb, entry, name, kernelErr(err, exist))
	}
	return nil
}

// bitmapPort adds or deletes a bitmap:port member: the port alone (the
// library would send a protocol too, which bitmap:port refuses).
func (h *netlinkHandle) bitmapPort(cmd int, name string, port uint16) error {
	req := h.request(cmd, nl.GetIpsetFlags(cmd)|unix.NLM_F_EXCL)
	req.AddData(nl.NewRtAttr(nl.IPSET_ATTR_SETNAME, nl.ZeroTerminated(name)))
	data := nl.NewRtAttr(nl.IPSET_ATTR_DATA|int(nl.NLA_F_NESTED), nil)
	buf := make([]byte, 2)
	binary.BigEndian.PutUint16(buf, port)
	data.AddChild(nl.NewRtAttr(nl.IPSET_ATTR_PORT|int(nl.NLA_F_NET_BYTEORDER), buf))
	data.AddChild(&nl.Uint32Attribute{Type: nl.IPSET_ATTR_LINENO | nl.NLA_F_NET_BYTEORDER, Value: 0})
	req.AddData(data)
	_, err := req.Execute(unix.NETLINK_NETFILTER, 0)
	return err
}

func (h *netlinkHandle) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.sock != nil {
		h.sock.Close()
		h.sock = nil
	}
	if h.h != nil {
		h.h.Close()
		h.h = nil
	}
}
