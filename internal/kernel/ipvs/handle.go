package ipvs

import "net/netip"

// This file is the contract between ipvs mode's proxier
// (internal/proxy/ipvs) and the kernel: the proxier diffs what it wants
// against what a Handle lists and changes only the difference. The real
// Handle talks generic netlink; ipvstest holds a stateful fake.

// Service flags as the kernel holds them (IP_VS_SVC_F_*).
const (
	FlagPersistent uint32 = 0x1 // ClientIP session affinity
	FlagHashed     uint32 = 0x2 // set by the kernel on every service
)

// Service is one IPVS virtual server as ipvs mode programs it. Its
// VirtualServer (protocol, address, port; FWMark 0) is its key.
type Service struct {
	VirtualServer
	Scheduler string // "rr", "wrr", ...
	Flags     uint32 // FlagPersistent; FlagHashed is ignored when compared
	Timeout   uint32 // persistence timeout in seconds (with FlagPersistent)
}

// Destination is one real server of a Service.
type Destination struct {
	Addr   netip.Addr
	Port   uint16
	Weight int
	// Read only, as the kernel reports them (graceful termination).
	ActiveConns   int
	InactiveConns int
}

// Handle reads and changes IPVS in one network namespace.
type Handle interface {
	// Services lists every virtual server of the namespace, also those
	// kproxy did not create (the proxier leaves those alone).
	Services() ([]Service, error)
	AddService(Service) error
	UpdateService(Service) error
	DeleteService(VirtualServer) error
	Destinations(VirtualServer) ([]Destination, error)
	AddDestination(VirtualServer, Destination) error
	UpdateDestination(VirtualServer, Destination) error
	DeleteDestination(VirtualServer, Destination) error
	// SetTimeouts sets IPVS's connection timeouts (ipvsadm --set); a zero
	// value leaves that timeout unchanged.
	SetTimeouts(Timeouts) error
	Close()
}

// Timeouts are IPVS's connection timeouts in seconds.
type Timeouts struct {
	TCP, TCPFin, UDP uint32
}
