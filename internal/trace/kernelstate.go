package trace

import (
	"fmt"
	"net/netip"
	"strings"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/kernel/ipvs"
)

// IPSet is one of the kernel's ipsets, as `ipset save` lists it. The
// iptables tracer matches "-m set" against it; ipsets live outside
// iptables-save, so a trace of ipvs mode is given them beside the rules.
type IPSet struct {
	Name string
	// Type is the ipset type ("hash:ip,port", "bitmap:port", ...).
	Type string
	// IPv6 is family inet6 (hash types).
	IPv6 bool
	// Entries in ipset's text form ("198.19.0.10,tcp:80").
	Entries []string
}

// IPVSService is one IPVS virtual server with its real servers, as
// `ipvsadm -S -n` lists it.
type IPVSService struct {
	Proto v1.Protocol
	Addr  netip.AddrPort
	// Scheduler is the scheduler's name ("rr", "wlc", ...).
	Scheduler string
	// Persistent is ClientIP affinity: a client's later connections go
	// to the real server its first went to, for Timeout seconds.
	Persistent bool
	Timeout    uint32
	// Flags are further scheduler flags as ipvsadm names them
	// ("sh-port"), for the report.
	Flags []string
	Reals []IPVSReal
}

// IPVSReal is one real server of a virtual server.
type IPVSReal struct {
	Addr netip.AddrPort
	// Weight 0 takes no new connections (a terminating endpoint whose
	// open connections drain).
	Weight int
	// Method is the forwarding method: "masq" (NAT: the destination is
	// rewritten, what kube-proxy uses), "route" (direct routing) or
	// "tunnel".
	Method string
}

// String is the virtual server as ipvsadm -Ln heads it: "TCP
// 198.19.0.10:80 rr persistent 600".
func (s IPVSService) String() string {
	out := fmt.Sprintf("%s %s %s", s.Proto, s.Addr, s.Scheduler)
	if len(s.Flags) > 0 {
		out += " (" + strings.Join(s.Flags, ",") + ")"
	}
	if s.Persistent {
		out += fmt.Sprintf(" persistent %d", s.Timeout)
	}
	return out
}

// FindIPVS returns the virtual server a new connection to (proto, dst)
// hits, or nil. Virtual servers by firewall mark are not modelled.
func (h Host) FindIPVS(proto v1.Protocol, dst netip.AddrPort) *IPVSService {
	dst = netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port())
	for i := range h.IPVS {
		if s := &h.IPVS[i]; s.Proto == proto && s.Addr == dst {
			return s
		}
	}
	return nil
}

// ProtocolOf is the protocol of an IP protocol number (IPVS's, the
// packet's): TCP, UDP or SCTP; "" for any other.
func ProtocolOf(n uint16) v1.Protocol {
	switch n {
	case 6:
		return v1.ProtocolTCP
	case 17:
		return v1.ProtocolUDP
	case 132:
		return v1.ProtocolSCTP
	}
	return ""
}

// ipvsFlagSHPort is IP_VS_SVC_F_SCHED_SH_PORT, ipvsadm's "sh-port", which
// ipvs mode sets (as upstream) on every virtual server with the mh
// scheduler.
const ipvsFlagSHPort = 0x10

// IPVSServiceOf converts one virtual server with its real servers, as
// ipvs mode renders it or as read from the kernel.
func IPVSServiceOf(s ipvs.Service, reals []ipvs.Destination) IPVSService {
	ts := IPVSService{
		Proto:      protocolName(s.Protocol),
		Addr:       netip.AddrPortFrom(s.Addr.Unmap(), s.Port),
		Scheduler:  s.Scheduler,
		Persistent: s.Flags&ipvs.FlagPersistent != 0,
		Timeout:    s.Timeout,
	}
	if s.Flags&ipvsFlagSHPort != 0 {
		ts.Flags = append(ts.Flags, "sh-port")
	}
	for _, r := range reals {
		ts.Reals = append(ts.Reals, IPVSReal{Addr: netip.AddrPortFrom(r.Addr.Unmap(), r.Port), Weight: r.Weight, Method: "masq"})
	}
	return ts
}

// protocolName is the virtual server's protocol, its number when not one
// of Kubernetes' (a foreign virtual server's).
func protocolName(p uint16) v1.Protocol {
	if name := ProtocolOf(p); name != "" {
		return name
	}
	return v1.Protocol(fmt.Sprint(p))
}
