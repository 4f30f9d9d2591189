package ipvs

import (
	"cmp"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kproxy/kproxy/internal/kernel/ipset"
	"github.com/kproxy/kproxy/internal/kernel/ipvs"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy"
)

// Plan is a rendered full sync: everything one IP family of ipvs mode
// wants in the kernel. The proxier diffs it against what the kernel
// holds (applied) and changes only the difference.
type Plan struct {
	// Addresses go on kube-ipvs0: ClusterIPs, external IPs, load
	// balancer ingress IPs.
	Addresses []netip.Addr
	// Services are the IPVS virtual servers with their real servers.
	Services map[ipvs.VirtualServer]*VirtualServer
	// Sets are upstream's ipsets of this family with their members, by
	// name (KUBE-CLUSTER-IP, KUBE-6-CLUSTER-IP, ...).
	Sets map[string]*Set
	// IPTables is the iptables-restore input for the nat and filter
	// tables (upstream's ipvs mode chains), written with --noflush.
	IPTables []byte
	// Health is what a sync reports to the loop (package tally): the health
	// check node ports with their local endpoint counts, and the Local
	// policies without a local endpoint.
	Health proxy.Result
}

// PartialPlan is a rendered partial sync, what it changes: the touched virtual servers
// (nil: no longer wanted), the set members and kube-ipvs0 addresses
// that appear or go, and the iptables input when its inputs changed.
type PartialPlan struct {
	Services           map[ipvs.VirtualServer]*VirtualServer
	AddEntries         map[string][]string
	DelEntries         map[string][]string
	AddAddrs, DelAddrs []netip.Addr
	// IPTables is the whole restore input; nil: its inputs (which sets
	// are empty, the LB triples) did not change.
	IPTables []byte
	// Health is the sync's whole report, as Plan.Health.
	Health proxy.Result
}

// VirtualServer is one IPVS service with its real servers.
type VirtualServer struct {
	ipvs.Service
	// Name is the service port it belongs to (logs, metrics).
	Name  model.ServicePortName
	Reals []ipvs.Destination
}

// Set is one ipset with the members it should hold.
type Set struct {
	ipset.Set
	Entries []string
}

// applied is kproxy's part of the kernel as the proxier knows it: what
// the last successful sync left there.
type applied struct {
	addrs    map[netip.Addr]bool
	services map[ipvs.VirtualServer]*appliedService
	sets     map[string]map[string]bool
}

type appliedService struct {
	svc   ipvs.Service
	dests map[destKey]ipvs.Destination
}

type destKey struct {
	addr netip.Addr
	port uint16
}

// Sorted returns the virtual servers in a stable order (address, protocol,
// port), for listings and tests.
func (d *Plan) Sorted() []*VirtualServer {
	out := make([]*VirtualServer, 0, len(d.Services))
	for _, vs := range d.Services {
		out = append(out, vs)
	}
	slices.SortFunc(out, func(a, b *VirtualServer) int {
		return cmp.Or(a.Addr.Compare(b.Addr), cmp.Compare(a.Protocol, b.Protocol), cmp.Compare(a.Port, b.Port))
	})
	return out
}

// SortedSets returns the sets in upstream's order.
func (d *Plan) SortedSets() []*Set {
	out := make([]*Set, 0, len(d.Sets))
	for _, s := range d.Sets {
		out = append(out, s)
	}
	rank := func(name string) int {
		for i, s := range setInfo {
			if SetName(s.name, false) == name || SetName(s.name, true) == name {
				return i
			}
		}
		return len(setInfo)
	}
	slices.SortFunc(out, func(a, b *Set) int {
		return cmp.Or(cmp.Compare(rank(a.Name), rank(b.Name)), strings.Compare(a.Name, b.Name))
	})
	return out
}

// Text prints a Plan in the forms operators know: the virtual and
// real servers as `ipvsadm -S -n` writes them, the sets as `ipset save`
// does, then the iptables-restore input. kube-ipvs0's addresses come
// first, as comments.
func (d *Plan) Text() string {
	var b strings.Builder
	b.WriteString("# " + DummyDevice + ":")
	for _, a := range d.Addresses {
		b.WriteString(" " + a.String())
	}
	b.WriteString("\n# ipvsadm -S -n\n")
	for _, vs := range d.Sorted() {
		svc := serviceArg(vs.VirtualServer)
		b.WriteString("-A " + svc + " -s " + vs.Scheduler)
		if vs.Flags&FlagSourceHash != 0 {
			b.WriteString(" -b sh-port")
		}
		if vs.Flags&ipvs.FlagPersistent != 0 {
			b.WriteString(" -p " + strconv.FormatUint(uint64(vs.Timeout), 10))
		}
		b.WriteString("\n")
		for _, rs := range vs.Reals {
			b.WriteString("-a " + svc + " -r " + hostPort(rs.Addr.String(), rs.Port, rs.Addr.Is6()) + " -m -w " + strconv.Itoa(rs.Weight) + "\n")
		}
	}
	b.WriteString("# ipset save\n")
	for _, s := range d.SortedSets() {
		b.WriteString("create " + s.Name + " " + s.Type)
		switch {
		case s.Type == typeBitmapPort:
			b.WriteString(" range 0-65535")
		case s.IPv6:
			b.WriteString(" family inet6")
		default:
			b.WriteString(" family inet")
		}
		b.WriteString(` comment "` + s.Comment + `"` + "\n")
		for _, e := range s.Entries {
			b.WriteString("add " + s.Name + " " + e + "\n")
		}
	}
	b.WriteString("# iptables-restore --noflush\n")
	b.Write(d.IPTables)
	return b.String()
}

func hostPort(host string, port uint16, v6 bool) string {
	if v6 {
		host = "[" + host + "]"
	}
	return host + ":" + strconv.Itoa(int(port))
}

// serviceArg is ipvsadm's service argument ("-t 198.19.0.1:80").
func serviceArg(v ipvs.VirtualServer) string {
	opt := "-t"
	switch v.Protocol {
	case unix.IPPROTO_UDP:
		opt = "-u"
	case unix.IPPROTO_SCTP:
		opt = "--sctp-service"
	}
	return opt + " " + hostPort(v.Addr.String(), v.Port, v.Addr.Is6())
}
