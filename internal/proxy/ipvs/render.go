package ipvs

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/kproxy/kproxy/internal/kernel/ipvs"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy/localdetect"
	"github.com/kproxy/kproxy/internal/proxy/nodeports"
)

// DummyDevice is the interface that holds the service addresses.
const DummyDevice = "kube-ipvs0"

// DefaultScheduler is upstream's scheduler when ipvs.scheduler is empty.
const DefaultScheduler = "rr"

// FlagSourceHash is IP_VS_SVC_F_SCHED_SH_PORT, which upstream sets on
// every virtual server with the "mh" scheduler (hash on source address
// and port).
const FlagSourceHash uint32 = 0x10

// Schedulers are the IPVS schedulers ipvs.scheduler may name (the
// kernel's ip_vs_<name> modules), the list upstream's configuration
// validation accepts (internal/config/validation.go holds the same).
var Schedulers = []string{"rr", "wrr", "lc", "wlc", "fo", "ovf", "lblc", "lblcr", "dh", "sh", "mh", "sed", "nq", "twos"}

// RenderConfig is what shapes ipvs mode's state besides the services: the
// KubeProxyConfiguration's settings for one family, taken once at start.
type RenderConfig struct {
	Family v1.IPFamily
	// NodeName is this node's name (endpoint locality and topology).
	NodeName string
	// Scheduler is ipvs.scheduler; empty means DefaultScheduler.
	Scheduler     string
	MasqueradeBit int
	MasqueradeAll bool
	// LocalDetect is detectLocalMode with its inputs (Family is filled
	// in from Family).
	LocalDetect localdetect.Config
	// NodeIPs are the node's primary IPs of this family; when empty they
	// are taken from the Node object. A node inside a service's
	// loadBalancerSourceRanges may reach its LB IP.
	NodeIPs []netip.Addr
	// NodePortAddresses as configured (keywords and CIDRs, see package
	// nodeports); empty means every local address, as upstream's ipvs
	// mode.
	NodePortAddresses []string
}

// Host is what Render needs to know of the node's kernel.
type Host struct {
	// Addrs are the node's local addresses on every interface but
	// kube-ipvs0 (node ports listen on them; an external or LB IP that is
	// one of them is not put on kube-ipvs0). Loopback and IPv6 link-local
	// addresses are ignored, as upstream.
	Addrs []netip.Addr
	// Rules are the rules of the built-in chains by table ("nat",
	// "filter") as iptables-save prints them ("-A INPUT ..."): the jump
	// rules already there are not inserted again. Nil means a fresh node.
	Rules map[string]sets.Set[string]
}

// MasqueradeMark is the mark value as upstream writes it ("%#08x" of
// 1<<bit, "0x00004000" for bit 14).
func (c *RenderConfig) MasqueradeMark() string {
	return fmt.Sprintf("%#08x", 1<<uint(c.MasqueradeBit))
}

// Validate refuses settings Render cannot work with.
func (c *RenderConfig) Validate() error {
	if c.Family != model.IPv4 && c.Family != model.IPv6 {
		return fmt.Errorf("ipvs: unknown IP family %q", c.Family)
	}
	if c.Scheduler != "" && !slices.Contains(Schedulers, c.Scheduler) {
		return fmt.Errorf("ipvs: unknown scheduler %q (known: %s)", c.Scheduler, strings.Join(Schedulers, ", "))
	}
	if c.MasqueradeBit < 0 || c.MasqueradeBit > 31 {
		return fmt.Errorf("ipvs: masqueradeBit %d is not within 0..31", c.MasqueradeBit)
	}
	return nil
}

func (c *RenderConfig) scheduler() string {
	if c.Scheduler == "" {
		return DefaultScheduler
	}
	return c.Scheduler
}

// renderer holds one Render call's work.
type renderer struct {
	cfg   *RenderConfig
	ipv6  bool
	state *model.State
	zone  string
	d     *Desired
	// entries of each set, by upstream's (IPv4) name.
	entries map[string]sets.Set[string]
	// bind are the addresses kube-ipvs0 holds; local the host's.
	bind  sets.Set[netip.Addr]
	local sets.Set[netip.Addr]
	// nodeIP is the node's primary IP (LB source ranges).
	nodeIP   netip.Addr
	detector localdetect.IPTables
	// nodePortIPs are the addresses node ports listen on.
	nodePortIPs []netip.Addr
	// lbNoNodeAccess are the LB IP, protocol and port triples the node
	// itself may not reach (source ranges that leave the node out).
	lbNoNodeAccess []lbEntry
}

type lbEntry struct {
	ip    netip.Addr
	proto string
	port  int32
}

// Render turns one family's model state into what ipvs mode wants in the
// kernel, as upstream v1.37's syncProxyRules programs it on that node. It
// is pure: it reads no clock, runs nothing and changes no argument.
//
// Where it differs from upstream, on purpose:
//   - a port whose loadBalancerSourceRanges are all of the other family is
//     closed in this one (model.ServicePort.LoadBalancerClosed): its LB IP
//     is in KUBE-LOAD-BALANCER-FW with no allowed source;
//   - a single-address source range is written as ipset lists it
//     ("1.2.3.4", not "1.2.3.4/32"), so the proxier's diff against
//     Entries is stable;
//   - the health check node port is in its set even when no address
//     carries node ports (upstream's loop skips it then);
//   - nothing of the object names reaches the rules (set comments are
//     upstream's fixed texts), so no name needs escaping.
//
// Endpoint selection is the model's (ready, else serving and terminating;
// topology hints), applied as upstream's syncEndpoint does: a virtual
// server of traffic policy Local gets the local endpoints, or, when there
// are none, the cluster's (for internal policy Local the cluster list is
// empty unless the port is reachable from outside).
func Render(cfg *RenderConfig, state *model.State, node *model.Node, host Host) (*Desired, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if state.Family != "" && state.Family != cfg.Family {
		return nil, fmt.Errorf("ipvs: state of family %s rendered for %s", state.Family, cfg.Family)
	}
	r := &renderer{
		cfg:     cfg,
		ipv6:    cfg.Family == model.IPv6,
		state:   state,
		zone:    node.Zone(),
		d:       &Desired{Services: map[ipvs.VirtualServer]*VirtualServer{}, Sets: map[string]*Set{}, Health: newHealth()},
		entries: map[string]sets.Set[string]{},
		bind:    sets.New[netip.Addr](),
		local:   sets.New[netip.Addr](),
	}
	for _, s := range setInfo {
		r.entries[s.name] = sets.New[string]()
	}
	for _, a := range host.Addrs {
		a = a.Unmap()
		if model.FamilyOf(a) != cfg.Family || a.IsLoopback() || (r.ipv6 && a.IsLinkLocalUnicast()) {
			continue
		}
		r.local.Insert(a)
	}
	if ips := nodeports.NodeIPs(cfg.Family, cfg.NodeIPs, node); len(ips) > 0 {
		r.nodeIP = ips[0]
	}
	ld := cfg.LocalDetect
	ld.Family = cfg.Family
	r.detector = localdetect.NewIPTables(ld, node)
	npa := nodeports.New(cfg.Family, cfg.NodePortAddresses, r.nodeIP)
	if npa.MatchAll {
		r.nodePortIPs = r.local.UnsortedList()
		slices.SortFunc(r.nodePortIPs, netip.Addr.Compare)
	} else {
		for _, a := range npa.Match(host.Addrs) {
			// Node ports never listen on loopback in ipvs mode.
			if !a.IsLoopback() {
				r.nodePortIPs = append(r.nodePortIPs, a)
			}
		}
	}

	for _, n := range state.SortedNames() {
		r.servicePort(state.Services[n])
	}

	r.entries[SetIPVSIPs] = sets.New[string]()
	for a := range r.bind {
		r.entries[SetIPVSIPs].Insert(a.String())
	}
	r.d.Addresses = r.bind.UnsortedList()
	slices.SortFunc(r.d.Addresses, netip.Addr.Compare)
	for _, def := range SetDefinitions(r.ipv6) {
		r.d.Sets[def.Name] = &Set{Set: def}
	}
	for _, s := range setInfo {
		e := sets.List(r.entries[s.name])
		r.d.Sets[SetName(s.name, r.ipv6)].Entries = e
	}
	r.d.IPTables = r.iptables(host.Rules)
	return r.d, nil
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

// servicePort renders one service port: its ipset entries and virtual
// servers, in upstream's order (cluster IP, external IPs, LB IPs, node
// ports, health check node port).
func (r *renderer) servicePort(sp *model.ServicePort) {
	if sp.Family != "" && sp.Family != r.cfg.Family {
		return
	}
	proto := strings.ToLower(string(sp.Protocol))
	eps := r.state.Endpoints[sp.Name]
	sel := model.SelectEndpoints(sp, eps, r.cfg.NodeName, r.zone)
	r.health(sp, sel)

	// Hairpin: a local endpoint reaching itself through the service is
	// masqueraded. Every local endpoint, as upstream (not only the
	// selected ones).
	for _, e := range eps {
		if e.Local && e.IP.IsValid() && e.Port != 0 {
			r.entries[SetLoopBack].Insert(ipPort(e.IP, proto, e.Port) + "," + e.IP.String())
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

	r.entries[SetClusterIP].Insert(ipPort(sp.ClusterIP, proto, sp.Port))
	r.virtualServer(sp, sp.ClusterIP, sp.Port, reals(sp.InternalPolicyLocal))
	r.bind.Insert(sp.ClusterIP)

	external := reals(sp.ExternalPolicyLocal)
	for _, ip := range sp.ExternalIPs {
		if sp.ExternalPolicyLocal {
			r.entries[SetExternalIPLocal].Insert(ipPort(ip, proto, sp.Port))
		} else {
			r.entries[SetExternalIP].Insert(ipPort(ip, proto, sp.Port))
		}
		r.virtualServer(sp, ip, sp.Port, external)
		if !r.local.Has(ip) {
			r.bind.Insert(ip)
		}
	}

	for _, ip := range sp.LoadBalancerVIPs() {
		e := ipPort(ip, proto, sp.Port)
		r.entries[SetLoadBalancer].Insert(e)
		if sp.ExternalPolicyLocal {
			r.entries[SetLoadBalancerLocal].Insert(e)
		}
		if sp.UsesLoadBalancerFirewall() {
			r.entries[SetLoadBalancerFW].Insert(e)
			allowFromNode := false
			for _, p := range sp.LoadBalancerSourceRanges {
				r.entries[SetLoadBalancerSourceCIDR].Insert(e + "," + netText(p))
				if r.nodeIP.IsValid() && p.Contains(r.nodeIP) {
					allowFromNode = true
				}
			}
			if allowFromNode {
				// A request from a backend host to the LB IP loops back
				// with the LB IP as its source: let it in.
				r.entries[SetLoadBalancerSourceIP].Insert(e + "," + ip.String())
			} else {
				r.lbNoNodeAccess = append(r.lbNoNodeAccess, lbEntry{ip, proto, sp.Port})
			}
		}
		r.virtualServer(sp, ip, sp.Port, external)
		if !r.local.Has(ip) {
			r.bind.Insert(ip)
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
		r.entries[set].Insert(entries...)
		if sp.ExternalPolicyLocal {
			r.entries[localSet].Insert(entries...)
		}
		for _, ip := range r.nodePortIPs {
			r.virtualServer(sp, ip, sp.NodePort, external)
		}
	}

	if sp.HealthCheckNodePort != 0 {
		r.entries[SetHealthCheckNodePort].Insert(strconv.Itoa(int(sp.HealthCheckNodePort)))
	}
}

// virtualServer adds one IPVS service with its real servers (weight 1).
// Two service ports claiming one address and port were resolved by the
// model; should one slip through, the first (in name order) keeps it.
func (r *renderer) virtualServer(sp *model.ServicePort, ip netip.Addr, port int32, eps []*model.Endpoint) {
	key := ipvs.VirtualServer{Protocol: protoNumber(sp.Protocol), Addr: ip, Port: uint16(port), Family: addrFamily(r.cfg.Family)}
	if _, ok := r.d.Services[key]; ok {
		return
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
	r.d.Services[key] = vs
}

// setName is a set's name in this family.
func (r *renderer) setName(name string) string { return SetName(name, r.ipv6) }

// Sorted returns the virtual servers in a stable order (address, protocol,
// port), for listings and tests.
func (d *Desired) Sorted() []*VirtualServer {
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
func (d *Desired) SortedSets() []*Set {
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
