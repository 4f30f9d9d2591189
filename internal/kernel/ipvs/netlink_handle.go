package ipvs

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"time"

	mobyipvs "github.com/moby/ipvs"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// netlinkHandle is the real Handle: IPVS's generic netlink family through
// github.com/moby/ipvs (the library upstream kube-proxy uses). Its errors
// wrap the kernel's syscall.Errno: EEXIST (a service or real server that
// exists), ESRCH (no such service), ENOENT (no such real server, or a
// scheduler whose module cannot be loaded), ERANGE (a bad weight).
type netlinkHandle struct {
	mu sync.Mutex // moby/ipvs's Handle is not safe for concurrent use
	h  *mobyipvs.Handle
}

// NewHandle opens IPVS in the network namespace at netnsPath ("" is the
// current one). A kernel without IPVS is an error here: moby/ipvs would
// answer every request with success then (moby/ipvs#27; its own check
// only logs). moby/ipvs also runs `modprobe ip_vs` once per process.
func NewHandle(netnsPath string) (Handle, error) {
	// Generic netlink families are global, not per namespace; asking for
	// one the kernel lacks makes it try to load the module first.
	if _, err := netlink.GenlFamilyGet(ipvsGenlName); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil, fmt.Errorf("ipvs: the kernel has no IPVS (no %s generic netlink family; CONFIG_IP_VS off or the ip_vs module cannot be loaded): %w", ipvsGenlName, err)
		}
		return nil, fmt.Errorf("ipvs: looking up the %s generic netlink family: %w", ipvsGenlName, err)
	}
	h, err := mobyipvs.New(netnsPath)
	if err != nil {
		return nil, fmt.Errorf("ipvs: opening generic netlink in %q: %w", netnsPath, err)
	}
	return &netlinkHandle{h: h}, nil
}

func family(a netip.Addr) uint16 {
	if a.Is6() {
		return syscall.AF_INET6
	}
	return syscall.AF_INET
}

func toMobyService(s Service) *mobyipvs.Service {
	addr := s.Addr.Unmap()
	ms := &mobyipvs.Service{
		Protocol:      s.Protocol,
		Port:          s.Port,
		FWMark:        s.FWMark,
		SchedName:     s.Scheduler,
		Flags:         s.Flags &^ FlagHashed,
		Timeout:       s.Timeout,
		AddressFamily: s.Family,
	}
	if addr.IsValid() {
		ms.Address = net.IP(addr.AsSlice())
	}
	if ms.AddressFamily == 0 {
		// A firewall mark service without a family is IPv4.
		ms.AddressFamily = family(addr)
	}
	// The netmask is the persistence granularity: one client address,
	// as upstream sets it.
	ms.Netmask = 0xffffffff
	if ms.AddressFamily == syscall.AF_INET6 {
		ms.Netmask = 128
	}
	return ms
}

func fromMobyService(ms *mobyipvs.Service) Service {
	s := Service{
		VirtualServer: VirtualServer{Protocol: ms.Protocol, Port: ms.Port, FWMark: ms.FWMark, Family: ms.AddressFamily},
		Scheduler:     ms.SchedName,
		Flags:         ms.Flags,
		Timeout:       ms.Timeout,
	}
	if a, ok := netip.AddrFromSlice(ms.Address); ok && ms.FWMark == 0 {
		s.Addr = a.Unmap()
	}
	return s
}

func toMobyDest(d Destination) *mobyipvs.Destination {
	a := d.Addr.Unmap()
	md := &mobyipvs.Destination{Port: d.Port, Weight: d.Weight}
	if a.IsValid() {
		md.Address = net.IP(a.AsSlice())
		md.AddressFamily = family(a)
	}
	// ConnectionFlags 0 is masquerading (NAT), as kube-proxy's.
	return md
}

func (h *netlinkHandle) Services() ([]Service, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	ms, err := h.h.GetServices()
	if err != nil {
		return nil, fmt.Errorf("listing IPVS virtual servers: %w", err)
	}
	out := make([]Service, 0, len(ms))
	for _, m := range ms {
		out = append(out, fromMobyService(m))
	}
	return out, nil
}

func (h *netlinkHandle) AddService(s Service) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.h.NewService(toMobyService(s)); err != nil {
		return fmt.Errorf("adding IPVS virtual server %v (scheduler %q): %w", s.VirtualServer, s.Scheduler, err)
	}
	return nil
}

func (h *netlinkHandle) UpdateService(s Service) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.h.UpdateService(toMobyService(s)); err != nil {
		return fmt.Errorf("updating IPVS virtual server %v (scheduler %q): %w", s.VirtualServer, s.Scheduler, err)
	}
	return nil
}

func (h *netlinkHandle) DeleteService(vs VirtualServer) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.h.DelService(toMobyService(Service{VirtualServer: vs})); err != nil {
		return fmt.Errorf("deleting IPVS virtual server %v: %w", vs, err)
	}
	return nil
}

func (h *netlinkHandle) Destinations(vs VirtualServer) ([]Destination, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	md, err := h.h.GetDestinations(toMobyService(Service{VirtualServer: vs}))
	if err != nil {
		return nil, fmt.Errorf("listing the real servers of %v: %w", vs, err)
	}
	out := make([]Destination, 0, len(md))
	for _, m := range md {
		d := Destination{Port: m.Port, Weight: m.Weight, ActiveConns: m.ActiveConnections, InactiveConns: m.InactiveConnections}
		if a, ok := netip.AddrFromSlice(m.Address); ok {
			d.Addr = a.Unmap()
		}
		out = append(out, d)
	}
	return out, nil
}

// checkDestFamily refuses a real server of another family than its
// virtual server's: the kernel takes one only for tunnelling, and
// moby/ipvs does not send the real server's family, so the kernel would
// read an IPv4 address as the start of an IPv6 one.
func checkDestFamily(vs VirtualServer, d Destination) error {
	if vs.FWMark == 0 && d.Addr.Unmap().Is4() != vs.Addr.Unmap().Is4() {
		return fmt.Errorf("real server %v of %v: another address family: %w", d.Addr, vs, syscall.EINVAL)
	}
	return nil
}

func (h *netlinkHandle) AddDestination(vs VirtualServer, d Destination) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := checkDestFamily(vs, d); err != nil {
		return err
	}
	if err := h.h.NewDestination(toMobyService(Service{VirtualServer: vs}), toMobyDest(d)); err != nil {
		return fmt.Errorf("adding real server %s to %v: %w", net.JoinHostPort(d.Addr.String(), fmt.Sprint(d.Port)), vs, err)
	}
	return nil
}

func (h *netlinkHandle) UpdateDestination(vs VirtualServer, d Destination) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := checkDestFamily(vs, d); err != nil {
		return err
	}
	if err := h.h.UpdateDestination(toMobyService(Service{VirtualServer: vs}), toMobyDest(d)); err != nil {
		return fmt.Errorf("updating real server %s of %v: %w", net.JoinHostPort(d.Addr.String(), fmt.Sprint(d.Port)), vs, err)
	}
	return nil
}

func (h *netlinkHandle) DeleteDestination(vs VirtualServer, d Destination) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.h.DelDestination(toMobyService(Service{VirtualServer: vs}), toMobyDest(d)); err != nil {
		return fmt.Errorf("deleting real server %s of %v: %w", net.JoinHostPort(d.Addr.String(), fmt.Sprint(d.Port)), vs, err)
	}
	return nil
}

func (h *netlinkHandle) SetTimeouts(t Timeouts) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	err := h.h.SetConfig(&mobyipvs.Config{
		TimeoutTCP:    time.Duration(t.TCP) * time.Second,
		TimeoutTCPFin: time.Duration(t.TCPFin) * time.Second,
		TimeoutUDP:    time.Duration(t.UDP) * time.Second,
	})
	if err != nil {
		return fmt.Errorf("setting IPVS timeouts (tcp %ds, tcpfin %ds, udp %ds): %w", t.TCP, t.TCPFin, t.UDP, err)
	}
	return nil
}

// GetTimeouts reads IPVS's connection timeouts (ipvsadm -L --timeout);
// not part of Handle, for tests and doctor.
func GetTimeouts(h Handle) (Timeouts, error) {
	nh, ok := h.(*netlinkHandle)
	if !ok {
		return Timeouts{}, fmt.Errorf("ipvs: GetTimeouts needs the netlink Handle, not %T", h)
	}
	nh.mu.Lock()
	defer nh.mu.Unlock()
	c, err := nh.h.GetConfig()
	if err != nil {
		return Timeouts{}, fmt.Errorf("reading IPVS timeouts: %w", err)
	}
	return Timeouts{TCP: uint32(c.TimeoutTCP / time.Second), TCPFin: uint32(c.TimeoutTCPFin / time.Second), UDP: uint32(c.TimeoutUDP / time.Second)}, nil
}

func (h *netlinkHandle) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.h != nil {
		h.h.Close()
		h.h = nil
	}
}
