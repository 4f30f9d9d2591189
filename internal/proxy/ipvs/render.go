package ipvs

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy/localdetect"
	"github.com/kproxy/kproxy/internal/proxy/nodeports"
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

// setName is a set's name in this family.
func (r *renderer) setName(name string) string { return SetName(name, r.ipv6) }
