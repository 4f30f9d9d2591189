package netdev

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// netlinkHandle is the real Handle, rtnetlink through
// github.com/vishvananda/netlink. Addresses are bound as upstream binds
// them: /32 or /128, scope global, on a dummy left down.
type netlinkHandle struct {
	mu sync.Mutex
	h  *netlink.Handle
}

// NewHandle opens rtnetlink in the network namespace at netnsPath (""
// is the current one).
func NewHandle(netnsPath string) (Handle, error) {
	var (
		h   *netlink.Handle
		err error
	)
	if netnsPath == "" {
		h, err = netlink.NewHandle(unix.NETLINK_ROUTE)
	} else {
		ns, nerr := netns.GetFromPath(netnsPath)
		if nerr != nil {
			return nil, fmt.Errorf("netdev: opening network namespace %s: %w", netnsPath, nerr)
		}
		defer ns.Close()
		h, err = netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	}
	if err != nil {
		return nil, fmt.Errorf("netdev: opening netlink: %w", err)
	}
	return &netlinkHandle{h: h}, nil
}

func (h *netlinkHandle) link(name string) (netlink.Link, error) {
	l, err := h.h.LinkByName(name)
	var nf netlink.LinkNotFoundError
	if errors.As(err, &nf) || errors.Is(err, unix.ENODEV) {
		return nil, fmt.Errorf("interface %s: %w", name, ErrNoLink)
	}
	if err != nil {
		return nil, fmt.Errorf("reading interface %s: %w", name, err)
	}
	return l, nil
}

func (h *netlinkHandle) EnsureDummy(name string) (bool, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := CheckName(name); err != nil {
		return false, err
	}
	l, err := h.link(name)
	if err == nil {
		if l.Type() != "dummy" {
			return false, fmt.Errorf("interface %s: %w (it is a %s)", name, ErrNotDummy, l.Type())
		}
		return false, nil
	}
	if !errors.Is(err, ErrNoLink) {
		return false, err
	}
	if err := h.h.LinkAdd(&netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: name}}); err != nil {
		return false, fmt.Errorf("creating dummy interface %s: %w", name, err)
	}
	return true, nil
}

func (h *netlinkHandle) DeleteLink(name string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	l, err := h.link(name)
	if err != nil {
		return err
	}
	if err := h.h.LinkDel(l); err != nil {
		return fmt.Errorf("deleting interface %s: %w", name, err)
	}
	return nil
}

func (h *netlinkHandle) Addresses(name string) ([]netip.Addr, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	l, err := h.link(name)
	if err != nil {
		return nil, err
	}
	addrs, err := h.h.AddrList(l, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("listing the addresses of %s: %w", name, err)
	}
	out := make([]netip.Addr, 0, len(addrs))
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			out = append(out, ip.Unmap())
		}
	}
	SortAddrs(out)
	return out, nil
}

func hostAddr(a netip.Addr) *netlink.Addr {
	return &netlink.Addr{IPNet: netlink.NewIPNet(a.AsSlice())}
}

func (h *netlinkHandle) AddAddress(name string, a netip.Addr) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	l, err := h.link(name)
	if err != nil {
		return err
	}
	if err := CheckAddr(a); err != nil {
		return err
	}
	if err := h.h.AddrAdd(l, hostAddr(a)); err != nil {
		if errors.Is(err, syscall.EEXIST) {
			return fmt.Errorf("adding %s to %s: %w (%w)", a, name, ErrAddrExists, err)
		}
		return fmt.Errorf("adding %s to %s: %w", a, name, err)
	}
	return nil
}

func (h *netlinkHandle) DelAddress(name string, a netip.Addr) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	l, err := h.link(name)
	if err != nil {
		return err
	}
	if err := CheckAddr(a); err != nil {
		return err
	}
	if err := h.h.AddrDel(l, hostAddr(a)); err != nil {
		// IPv4 answers EADDRNOTAVAIL, IPv6 ENODEV or ENXIO.
		if errors.Is(err, syscall.EADDRNOTAVAIL) || errors.Is(err, syscall.ENXIO) || errors.Is(err, syscall.ENODEV) {
			return fmt.Errorf("deleting %s from %s: %w (%w)", a, name, ErrNoAddr, err)
		}
		return fmt.Errorf("deleting %s from %s: %w", a, name, err)
	}
	return nil
}

func (h *netlinkHandle) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.h != nil {
		h.h.Close()
		h.h = nil
	}
}
