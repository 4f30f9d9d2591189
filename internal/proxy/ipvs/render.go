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
	"github.com/kproxy/kproxy/internal/proxy/tally"
)

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

// Config is what shapes ipvs mode's state besides the services: the
// KubeProxyConfiguration's settings for one family, taken once at start.
type Config struct {
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

// Validate refuses settings Render cannot work with.
func (c *Config) Validate() error {
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

func (c *Config) scheduler() string {
	if c.Scheduler == "" {
		return DefaultScheduler
	}
	return c.Scheduler
}

// renderer renders one family's service ports for a node: the
// configuration and what it needs of the node, worked out once per full
// sync.
type renderer struct {
	cfg  *Config
	ipv6 bool
	zone string
	// local are the host's addresses (an external or LB IP that is one
	// of them is not bound to kube-ipvs0).
	local sets.Set[netip.Addr]
	// nodeIP is the node's primary IP (LB source ranges).
	nodeIP   netip.Addr
	detector localdetect.IPTables
	// nodePortIPs are the addresses node ports listen on.
	nodePortIPs []netip.Addr
}

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
func Render(cfg *Config, state *model.State, node *model.Node, host Host) (*Plan, error) {
	c, err := newComposer(cfg, state, node, host)
	if err != nil {
		return nil, err
	}
	return c.plan(host.Rules), nil
}

// newRenderer works out what rendering needs of the configuration and
// the node.
func newRenderer(cfg *Config, node *model.Node, host Host) (*renderer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	r := &renderer{
		cfg:   cfg,
		ipv6:  cfg.Family == model.IPv6,
		zone:  node.Zone(),
		local: sets.New[netip.Addr](),
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
	return r, nil
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

// setName is a set's name in this family.
func (r *renderer) setName(name string) string { return SetName(name, r.ipv6) }
