// Package ipvs finds and removes what kube-proxy's IPVS mode left in the
// kernel apart from iptables rules (those are the xtables package's): the
// kube-ipvs0 interface holding the service addresses, kube-proxy's ipsets,
// and its IPVS virtual servers.
//
// Upstream's cleanup flushes every IPVS virtual server of the node, also
// those of keepalived or another load balancer (a known bug). Here only
// kube-proxy's go:
//   - virtual servers on an address of kube-ipvs0 (ClusterIPs, external
//     and load balancer IPs: kube-proxy binds each to that interface) or in
//     its KUBE-IPVS-IPS / KUBE-6-IPVS-IPS set, which mirrors those
//     addresses and still tells them if the interface is already gone;
//   - NodePort virtual servers: on an address of this host, with a
//     protocol and port that kube-proxy's KUBE-NODE-PORT-* sets list.
//
// Virtual servers with a firewall mark are never touched: kube-proxy does
// not make them.
//
// Call it after the xtables cleanup: an ipset that an iptables rule still
// matches cannot be destroyed.
package ipvs

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"k8s.io/klog/v2"
)

// DummyDevice is the interface kube-proxy's IPVS mode binds service
// addresses to. kube-proxy creates it as a dummy; the cleanup deletes the
// interface of that name whatever its type.
const DummyDevice = "kube-ipvs0"

// ipsetSuffixes name kube-proxy's IPVS mode sets after "KUBE-" (IPv4) or
// "KUBE-6-" (IPv6), from upstream pkg/proxy/ipvs/ipset.go. Only these are
// removed, not every KUBE-* set: kube-router's network policies, for one,
// live in sets named KUBE-SRC-* and KUBE-DST-*.
var ipsetSuffixes = []string{
	"LOOP-BACK",
	"CLUSTER-IP",
	"EXTERNAL-IP",
	"EXTERNAL-IP-LOCAL",
	"LOAD-BALANCER",
	"LOAD-BALANCER-FW",
	"LOAD-BALANCER-LOCAL",
	"LOAD-BALANCER-SOURCE-IP",
	"LOAD-BALANCER-SOURCE-CIDR",
	"NODE-PORT-TCP",
	"NODE-PORT-LOCAL-TCP",
	"NODE-PORT-UDP",
	"NODE-PORT-LOCAL-UDP",
	"NODE-PORT-SCTP-HASH",
	"NODE-PORT-LOCAL-SCTP-HASH",
	"NODE-PORT-SCTP",       // before the SCTP sets became hash:ip,port
	"NODE-PORT-LOCAL-SCTP", // idem
	"HEALTH-CHECK-NODE-PORT",
	"IPVS-IPS",
}

// maxSetName is the longest ipset name the kernel takes (32 bytes with the
// NUL). kube-proxy cuts longer IPv6 names (KUBE-6-LOAD-BALANCER-SOURCE-CID).
const maxSetName = 31

// setNames are kube-proxy's set names in lookup order, IPv4 then IPv6, and
// setSuffixes maps each to its suffix.
var setNames, setSuffixes = func() ([]string, map[string]string) {
	var names []string
	suffixes := map[string]string{}
	for _, p := range []string{"KUBE-", "KUBE-6-"} {
		for _, s := range ipsetSuffixes {
			n := p + s
			if len(n) > maxSetName {
				n = n[:maxSetName]
			}
			names = append(names, n)
			suffixes[n] = s
		}
	}
	return names, suffixes
}()

// kubeProxySetNames lists every name kube-proxy's sets may have.
func kubeProxySetNames() []string { return slices.Clone(setNames) }

// setSuffix returns the part after KUBE- or KUBE-6- of one of kube-proxy's
// set names (uncut), or "".
func setSuffix(name string) string { return setSuffixes[name] }

// IP protocol numbers, as IPVS and ipset carry them.
const (
	protoTCP  = 6
	protoUDP  = 17
	protoSCTP = 132
)

// VirtualServer identifies one IPVS virtual service.
type VirtualServer struct {
	Protocol uint16 // IP protocol number; 0 with FWMark
	Addr     netip.Addr
	Port     uint16
	FWMark   uint32
	// Family is AF_INET or AF_INET6 as the kernel reported it.
	Family uint16
}

func (v VirtualServer) String() string {
	if v.FWMark != 0 {
		return fmt.Sprintf("fwmark %d", v.FWMark)
	}
	p := fmt.Sprint(v.Protocol)
	switch v.Protocol {
	case protoTCP:
		p = "TCP"
	case protoUDP:
		p = "UDP"
	case protoSCTP:
		p = "SCTP"
	}
	return p + " " + netip.AddrPortFrom(v.Addr, v.Port).String()
}

// ipset is one set as the kernel lists it, with the members the cleanup
// needs: addresses (KUBE-IPVS-IPS) and ports (the node port sets).
type ipset struct {
	Name  string
	Addrs []netip.Addr
	Ports []portEntry
}

type portEntry struct {
	Protocol uint8 // 0 when the set type has none (bitmap:port)
	Port     uint16
}

// state is what the kernel holds, read before anything is removed.
type state struct {
	link       bool
	linkAddrs  []netip.Addr
	localAddrs []netip.Addr // of every interface
	sets       []ipset
	ipvs       bool // the kernel has IPVS (the generic netlink family exists)
	servers    []VirtualServer
}

// Leftovers is what kube-proxy's IPVS mode left.
type Leftovers struct {
	// Link is DummyDevice if it exists, else "".
	Link string
	// IPSets are kube-proxy's sets that exist.
	IPSets []string
	// VirtualServers are kube-proxy's virtual servers (see the package doc).
	VirtualServers []VirtualServer
	// IPVSChecked is false when the kernel has no IPVS: there cannot be
	// virtual servers then.
	IPVSChecked bool
}

// Empty says whether nothing is left.
func (l Leftovers) Empty() bool {
	return l.Link == "" && len(l.IPSets) == 0 && len(l.VirtualServers) == 0
}

// plan picks kube-proxy's objects out of the kernel state.
func plan(s state) Leftovers {
	var l Leftovers
	if s.link {
		l.Link = DummyDevice
	}
	l.IPVSChecked = s.ipvs
	bound := map[netip.Addr]bool{}
	for _, a := range s.linkAddrs {
		bound[a.Unmap()] = true
	}
	nodePorts := map[portEntry]bool{}
	for _, set := range s.sets {
		suffix := setSuffix(set.Name)
		if suffix == "" {
			continue
		}
		l.IPSets = append(l.IPSets, set.Name)
		switch suffix {
		case "IPVS-IPS":
			for _, a := range set.Addrs {
				bound[a.Unmap()] = true
			}
		case "NODE-PORT-TCP", "NODE-PORT-LOCAL-TCP":
			for _, p := range set.Ports {
				nodePorts[portEntry{protoTCP, p.Port}] = true
			}
		case "NODE-PORT-UDP", "NODE-PORT-LOCAL-UDP":
			for _, p := range set.Ports {
				nodePorts[portEntry{protoUDP, p.Port}] = true
			}
		case "NODE-PORT-SCTP-HASH", "NODE-PORT-LOCAL-SCTP-HASH", "NODE-PORT-SCTP", "NODE-PORT-LOCAL-SCTP":
			for _, p := range set.Ports {
				nodePorts[portEntry{protoSCTP, p.Port}] = true
			}
		}
	}
	local := map[netip.Addr]bool{}
	for _, a := range s.localAddrs {
		local[a.Unmap()] = true
	}
	for _, vs := range s.servers {
		if vs.FWMark != 0 || !vs.Addr.IsValid() {
			continue
		}
		a := vs.Addr.Unmap()
		nodePort := local[a] && nodePorts[portEntry{uint8(vs.Protocol), vs.Port}]
		if bound[a] || nodePort {
			l.VirtualServers = append(l.VirtualServers, vs)
		}
	}
	return l
}

// Option configures FindLeftovers and CleanupLeftovers.
type Option func(*options)

type options struct {
	netnsPath string
	kernel    kernel // tests
}

// WithNetNSPath acts in the network namespace at path (for example
// /run/netns/NAME) instead of the current one.
func WithNetNSPath(path string) Option { return func(o *options) { o.netnsPath = path } }

func withKernel(k kernel) Option { return func(o *options) { o.kernel = k } }

func open(opts []Option) (kernel, error) {
	o := &options{}
	for _, f := range opts {
		f(o)
	}
	if o.kernel != nil {
		return o.kernel, nil
	}
	return newNetlinkKernel(o.netnsPath)
}

// read collects the kernel state. ipsets and IPVS are optional kernel
// features: without them there is nothing of theirs to find.
func read(k kernel) (state, error) {
	var s state
	var err error
	if s.link, s.linkAddrs, err = k.link(DummyDevice); err != nil {
		return s, err
	}
	if s.sets, err = k.ipsets(); errors.Is(err, errUnsupported) {
		klog.V(2).InfoS("The kernel has no ipset support; no ipsets to clean up")
	} else if err != nil {
		return s, err
	}
	if s.ipvs, err = k.ipvsAvailable(); err != nil {
		return s, err
	}
	if !s.ipvs {
		klog.V(2).InfoS("The kernel has no IPVS (no IPVS generic netlink family); no virtual servers to clean up")
		return s, nil
	}
	if s.servers, err = k.virtualServers(); err != nil {
		return s, err
	}
	if s.localAddrs, err = k.localAddrs(); err != nil {
		return s, err
	}
	return s, nil
}

// FindLeftovers lists what kube-proxy's IPVS mode left.
func FindLeftovers(ctx context.Context, opts ...Option) (Leftovers, error) {
	k, err := open(opts)
	if err != nil {
		return Leftovers{}, err
	}
	defer k.close()
	s, err := read(k)
	if err != nil {
		return Leftovers{}, fmt.Errorf("ipvs: looking for leftovers: %w", err)
	}
	return plan(s), nil
}

// CleanupLeftovers deletes kube-proxy's virtual servers, then kube-ipvs0
// (whatever its type), then kube-proxy's ipsets. It goes on after an
// error and returns them all.
func CleanupLeftovers(ctx context.Context, opts ...Option) error {
	k, err := open(opts)
	if err != nil {
		return err
	}
	defer k.close()
	s, err := read(k)
	if err != nil {
		return fmt.Errorf("ipvs: looking for leftovers: %w", err)
	}
	l := plan(s)
	var errs []error
	// Virtual servers first: they are found by kube-ipvs0's addresses and
	// the sets, which go next.
	for _, vs := range l.VirtualServers {
		if err := ctx.Err(); err != nil {
			return errors.Join(append(errs, err)...)
		}
		if err := k.deleteVirtualServer(vs); err != nil {
			errs = append(errs, fmt.Errorf("ipvs: deleting virtual server %s: %w", vs, err))
			continue
		}
		klog.V(2).InfoS("Deleted IPVS virtual server of kube-proxy", "virtualServer", vs)
	}
	if l.Link != "" {
		if err := k.deleteLink(l.Link); err != nil {
			errs = append(errs, fmt.Errorf("ipvs: deleting interface %s: %w", l.Link, err))
		} else {
			klog.V(2).InfoS("Deleted kube-proxy's IPVS interface", "interface", l.Link)
		}
	}
	for _, name := range l.IPSets {
		if err := k.destroyIPSet(name); err != nil {
			errs = append(errs, fmt.Errorf("ipvs: destroying ipset %s (an iptables rule may still use it): %w", name, err))
			continue
		}
		klog.V(2).InfoS("Destroyed ipset of kube-proxy", "ipset", name)
	}
	return errors.Join(errs...)
}
