package ipvs

import (
	"cmp"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/kernel/ipvs"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy/tally"
)

// share is what one service port contributes to a Plan. Shares are
// counted into a composer, so that a sync that changes a few service
// ports re-renders and re-diffs only theirs.
type share struct {
	// services are its virtual servers, each key once (the first wins).
	services []*VirtualServer
	// entries are its set members, by upstream's (IPv4) set name.
	entries []setEntry
	// bind are the addresses it puts on kube-ipvs0.
	bind []netip.Addr
	// lbNoNodeAccess are the LB IP, protocol and port triples the node
	// itself may not reach (source ranges that leave the node out).
	lbNoNodeAccess []lbEntry
	// health is what it adds to the sync's report to the loop.
	health tally.Port
}

type setEntry struct{ set, member string }

func (sh *share) add(set string, members ...string) {
	for _, m := range members {
		sh.entries = append(sh.entries, setEntry{set, m})
	}
}

type lbEntry struct {
	ip    netip.Addr
	proto string
	port  int32
}

func protoNumber(p v1.Protocol) uint16 {
	switch p {
	case model.UDP:
		return unix.IPPROTO_UDP
	case model.SCTP:
		return unix.IPPROTO_SCTP
	default:
		return unix.IPPROTO_TCP
	}
}

// addrFamily is the kernel's address family of f (AF_INET, AF_INET6).
func addrFamily(f v1.IPFamily) uint16 {
	if f == model.IPv6 {
		return unix.AF_INET6
	}
	return unix.AF_INET
}

// ipPort is a hash:ip,port entry ("198.19.0.1,tcp:80").
func ipPort(ip netip.Addr, proto string, port int32) string {
	return ip.String() + "," + proto + ":" + strconv.Itoa(int(port))
}

// netText is a hash:ip,port,net member's net as ipset lists it: a host
// prefix is a bare address (upstream writes "/32" and so sees a member it
// wants missing at every sync).
func netText(p netip.Prefix) string {
	p = p.Masked()
	if p.IsSingleIP() {
		return p.Addr().String()
	}
	return p.String()
}

// servicePort renders one service port (nil: not of this family): its
// ipset entries and virtual servers, in upstream's order (cluster IP, external IPs, LB IPs, node
// ports, health check node port).
func (r *renderer) servicePort(state *model.State, sp *model.ServicePort) *share {
	if sp.Family != "" && sp.Family != r.cfg.Family {
		return nil
	}
	sh := &share{}
	proto := strings.ToLower(string(sp.Protocol))
	eps := state.Endpoints[sp.Name]
	sel := model.SelectEndpoints(sp, eps, r.cfg.NodeName, r.zone)
	sh.health = tally.Of(sp, sel)

	// Hairpin: a local endpoint reaching itself through the service is
	// masqueraded. Every local endpoint, as upstream (not only the
	// selected ones).
	for _, e := range eps {
		if e.Local && e.IP.IsValid() && e.Port != 0 {
			sh.add(SetLoopBack, ipPort(e.IP, proto, e.Port)+","+e.IP.String())
		}
	}

	// Real servers: upstream's syncEndpoint. Policy Local uses the local
	// endpoints, or, when there are none, the cluster's (traffic from
	// local pods keeps working; for an internal policy Local port the
	// cluster list is empty unless the port is reachable from outside).
	reals := func(onlyLocal bool) []*model.Endpoint {
		if onlyLocal && len(sel.Local) > 0 {
			return sel.Local
		}
		return sel.Cluster
	}

	sh.add(SetClusterIP, ipPort(sp.ClusterIP, proto, sp.Port))
	sh.virtualServer(r, sp, sp.ClusterIP, sp.Port, reals(sp.InternalPolicyLocal))
	sh.bind = append(sh.bind, sp.ClusterIP)

	external := reals(sp.ExternalPolicyLocal)
	for _, ip := range sp.ExternalIPs {
		if sp.ExternalPolicyLocal {
			sh.add(SetExternalIPLocal, ipPort(ip, proto, sp.Port))
		} else {
			sh.add(SetExternalIP, ipPort(ip, proto, sp.Port))
		}
		sh.virtualServer(r, sp, ip, sp.Port, external)
		if !r.local.Has(ip) {
			sh.bind = append(sh.bind, ip)
		}
	}

	for _, ip := range sp.LoadBalancerVIPs() {
		e := ipPort(ip, proto, sp.Port)
		sh.add(SetLoadBalancer, e)
		if sp.ExternalPolicyLocal {
			sh.add(SetLoadBalancerLocal, e)
		}
		if sp.UsesLoadBalancerFirewall() {
			sh.add(SetLoadBalancerFW, e)
			allowFromNode := false
			for _, p := range sp.LoadBalancerSourceRanges {
				sh.add(SetLoadBalancerSourceCIDR, e+","+netText(p))
				if r.nodeIP.IsValid() && p.Contains(r.nodeIP) {
					allowFromNode = true
				}
			}
			if allowFromNode {
				// A request from a backend host to the LB IP loops back
				// with the LB IP as its source: let it in.
				sh.add(SetLoadBalancerSourceIP, e+","+ip.String())
			} else {
				sh.lbNoNodeAccess = append(sh.lbNoNodeAccess, lbEntry{ip, proto, sp.Port})
			}
		}
		sh.virtualServer(r, sp, ip, sp.Port, external)
		if !r.local.Has(ip) {
			sh.bind = append(sh.bind, ip)
		}
	}

	if sp.NodePort != 0 && len(r.nodePortIPs) > 0 {
		var set, localSet string
		var entries []string
		switch sp.Protocol {
		case model.TCP:
			set, localSet = SetNodePortTCP, SetNodePortLocalTCP
			entries = []string{strconv.Itoa(int(sp.NodePort))}
		case model.UDP:
			set, localSet = SetNodePortUDP, SetNodePortLocalUDP
			entries = []string{strconv.Itoa(int(sp.NodePort))}
		case model.SCTP:
			// hash:ip,port: one entry per node port address.
			set, localSet = SetNodePortSCTP, SetNodePortLocalSCTP
			for _, ip := range r.nodePortIPs {
				entries = append(entries, ipPort(ip, proto, sp.NodePort))
			}
		}
		sh.add(set, entries...)
		if sp.ExternalPolicyLocal {
			sh.add(localSet, entries...)
		}
		for _, ip := range r.nodePortIPs {
			sh.virtualServer(r, sp, ip, sp.NodePort, external)
		}
	}

	if sp.HealthCheckNodePort != 0 {
		sh.add(SetHealthCheckNodePort, strconv.Itoa(int(sp.HealthCheckNodePort)))
	}
	return sh
}

// virtualServer adds one IPVS service with its real servers (weight 1).
// Two service ports claiming one address and port were resolved by the
// model; should one slip through, the first (in name order) keeps it
// (the composer's rule), and within a service port the first of its own.
func (sh *share) virtualServer(r *renderer, sp *model.ServicePort, ip netip.Addr, port int32, eps []*model.Endpoint) {
	key := ipvs.VirtualServer{Protocol: protoNumber(sp.Protocol), Addr: ip, Port: uint16(port), Family: addrFamily(r.cfg.Family)}
	for _, have := range sh.services {
		if have.VirtualServer == key {
			return
		}
	}
	vs := &VirtualServer{
		Service: ipvs.Service{VirtualServer: key, Scheduler: r.cfg.scheduler()},
		Name:    sp.Name,
	}
	if sp.SessionAffinity() {
		vs.Flags |= ipvs.FlagPersistent
		vs.Timeout = uint32(sp.StickyMaxAgeSeconds)
	}
	if vs.Scheduler == "mh" {
		vs.Flags |= FlagSourceHash
	}
	seen := make(map[netip.AddrPort]bool, len(eps))
	for _, e := range eps {
		ap := e.AddrPort()
		if seen[ap] {
			continue
		}
		seen[ap] = true
		vs.Reals = append(vs.Reals, ipvs.Destination{Addr: e.IP, Port: uint16(e.Port), Weight: 1})
	}
	slices.SortFunc(vs.Reals, func(a, b ipvs.Destination) int {
		return cmp.Or(a.Addr.Compare(b.Addr), cmp.Compare(a.Port, b.Port))
	})
	sh.services = append(sh.services, vs)
}
