package netns

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"testing"
)

// The cluster topology:
//
//	                      lan (netns with bridge br-lan)
//	        ┌──────────────────┼──────────────────┐
//	     client              node-a             node-b         (eth0 each)
//	                           │ cbr0 (bridge, pod gateway)
//	                     pod  pod  pod …       (eth0 each, default route via cbr0)
//
// The client is outside the cluster and also plays the LAN's router: the
// nodes' default routes point at it (it forwards nothing, so unknown
// destinations die there), and it routes the service ranges via one node
// (ClientSpec.Via) and each node's pod CIDRs via that node. The nodes route
// each other's pod CIDRs via each other's LAN address and forward. Pod
// bridges pass bridged traffic through the IP hooks (bridge-nf-call-iptables
// and -ip6tables = 1, as kubenet sets them), so replies between two pods of
// one node are un-NATed too.

// NodeSpec describes a node.
type NodeSpec struct {
	Name string
	// Addrs are the node's LAN addresses with the LAN prefix length
	// (198.18.0.10/24, fd00:18::10/64).
	Addrs []netip.Prefix
	// PodCIDRs are the node's pod ranges; its bridge cbr0 gets the first
	// host address of each (198.18.129.1/24) and is the pods' gateway.
	PodCIDRs []netip.Prefix
}

// ClientSpec describes the outside client.
type ClientSpec struct {
	// Addrs are the client's addresses on the LAN (with prefix length). The
	// first one of each family is the nodes' default gateway; further ones
	// are extra source addresses (for source range tests).
	Addrs []netip.Prefix
	// ServiceRoutes are routed via the node named Via (service IPs,
	// external and load balancer IPs).
	ServiceRoutes []netip.Prefix
	Via           string
}

// PodSpec describes a pod: a namespace attached to its node's cbr0.
type PodSpec struct {
	Name string
	Node string
	// IPs are the pod's addresses, each inside one of the node's PodCIDRs.
	IPs []netip.Addr
}

// ClusterSpec is a whole topology.
type ClusterSpec struct {
	Nodes  []NodeSpec
	Client ClientSpec
	Pods   []PodSpec
}

// Cluster is a built topology. Everything in it is deleted at the end of the
// test that built it.
type Cluster struct {
	// ID is the random part of every namespace name of this cluster.
	ID     string
	LAN    *NS
	Client *NS
	Nodes  map[string]*Node
	Pods   map[string]*Pod
	Spec   ClusterSpec
}

// Node is a node's namespace.
type Node struct {
	*NS
	Spec NodeSpec
	// Gateways are cbr0's addresses, one per pod CIDR.
	Gateways []netip.Addr
	pods     int
}

// Pod is a pod's namespace.
type Pod struct {
	*NS
	Spec PodSpec
	Node *Node
}

// Addr returns the node's LAN address of the family of like.
func (n *Node) Addr(like netip.Addr) netip.Addr {
	for _, p := range n.Spec.Addrs {
		if p.Addr().Is4() == like.Is4() {
			return p.Addr()
		}
	}
	return netip.Addr{}
}

// IP returns the pod's address of the family of like.
func (p *Pod) IP(like netip.Addr) netip.Addr {
	for _, a := range p.Spec.IPs {
		if a.Is4() == like.Is4() {
			return a
		}
	}
	return netip.Addr{}
}

// firstOfFamily returns the first prefix of the family of like.
func firstOfFamily(ps []netip.Prefix, like netip.Addr) (netip.Prefix, bool) {
	for _, p := range ps {
		if p.Addr().Is4() == like.Is4() {
			return p, true
		}
	}
	return netip.Prefix{}, false
}

// hostSysctls prepare any namespace: IPv6 addresses usable at once, and no
// ICMP redirects taken. A node that forwards a packet back out the LAN
// interface it came in on (client -> service -> pod on the other node)
// would otherwise teach the client a route for the service IP via the
// other node, and later requests would silently take another path.
var hostSysctls = []string{
	"net.ipv6.conf.all.accept_dad", "0",
	"net.ipv6.conf.default.accept_dad", "0",
	"net.ipv4.conf.all.accept_redirects", "0",
	"net.ipv4.conf.default.accept_redirects", "0",
	"net.ipv6.conf.all.accept_redirects", "0",
	"net.ipv6.conf.default.accept_redirects", "0",
}

// nodeSysctls make a namespace a router that sends no redirects, with pod
// bridges whose bridged traffic passes the IP hooks (as kubenet sets it).
var nodeSysctls = []string{
	"net.ipv4.ip_forward", "1",
	"net.ipv6.conf.all.forwarding", "1",
	"net.ipv4.conf.all.send_redirects", "0",
	"net.ipv4.conf.default.send_redirects", "0",
	"net.bridge.bridge-nf-call-iptables", "1",
	"net.bridge.bridge-nf-call-ip6tables", "1",
}

// NewCluster builds the topology in fresh namespaces.
func NewCluster(t testing.TB, spec ClusterSpec) *Cluster {
	t.Helper()
	c := &Cluster{ID: RandomID(4), Nodes: map[string]*Node{}, Pods: map[string]*Pod{}, Spec: spec}
	if err := c.build(t); err != nil {
		t.Fatalf("building the cluster topology: %v", err)
	}
	return c
}

func (c *Cluster) build(t testing.TB) error {
	spec := c.Spec
	c.LAN = New(t, c.ID, "lan")
	// The LAN is a plain switch: no IP hooks for bridged frames there.
	if err := c.LAN.Sysctls(
		"net.bridge.bridge-nf-call-iptables", "0",
		"net.bridge.bridge-nf-call-ip6tables", "0",
		"net.bridge.bridge-nf-call-arptables", "0",
	); err != nil {
		return err
	}
	if err := c.LAN.AddBridge("br-lan"); err != nil {
		return err
	}
	port := 0
	attach := func(n *NS, addrs []netip.Prefix) error {
		port++
		lanSide := "p" + strconv.Itoa(port)
		if err := Veth(c.LAN, lanSide, n, "eth0"); err != nil {
			return err
		}
		if err := c.LAN.SetMaster(lanSide, "br-lan"); err != nil {
			return err
		}
		for _, a := range addrs {
			if err := n.AddAddr("eth0", a); err != nil {
				return err
			}
		}
		return nil
	}

	c.Client = New(t, c.ID, "client")
	if err := c.Client.Sysctls(hostSysctls...); err != nil {
		return err
	}
	if err := attach(c.Client, spec.Client.Addrs); err != nil {
		return err
	}

	for _, ns := range spec.Nodes {
		n := &Node{NS: New(t, c.ID, ns.Name), Spec: ns}
		c.Nodes[ns.Name] = n
		if err := n.Sysctls(append(slices.Clone(hostSysctls), nodeSysctls...)...); err != nil {
			return err
		}
		if err := attach(n.NS, ns.Addrs); err != nil {
			return err
		}
		if err := n.AddBridge("cbr0"); err != nil {
			return err
		}
		for _, pc := range ns.PodCIDRs {
			gw := pc.Masked().Addr().Next()
			n.Gateways = append(n.Gateways, gw)
			if err := n.AddAddr("cbr0", netip.PrefixFrom(gw, pc.Bits())); err != nil {
				return err
			}
		}
		// Default routes via the client, the LAN's router.
		for _, fam := range []netip.Addr{netip.IPv4Unspecified(), netip.IPv6Unspecified()} {
			gw, ok := firstOfFamily(spec.Client.Addrs, fam)
			if _, mine := firstOfFamily(ns.Addrs, fam); !ok || !mine {
				continue
			}
			if err := n.AddRoute(netip.PrefixFrom(fam, 0), gw.Addr()); err != nil {
				return err
			}
		}
	}

	// Pod CIDR routes: every node and the client reach a node's pods via
	// that node's LAN address.
	for _, owner := range spec.Nodes {
		for _, pc := range owner.PodCIDRs {
			gw, ok := firstOfFamily(owner.Addrs, pc.Addr())
			if !ok {
				return fmt.Errorf("node %s has pod CIDR %s but no LAN address of that family", owner.Name, pc)
			}
			for _, other := range spec.Nodes {
				if other.Name == owner.Name {
					continue
				}
				if err := c.Nodes[other.Name].AddRoute(pc, gw.Addr()); err != nil {
					return err
				}
			}
			if err := c.Client.AddRoute(pc, gw.Addr()); err != nil {
				return err
			}
		}
	}
	if len(spec.Client.ServiceRoutes) > 0 {
		via, ok := c.Nodes[spec.Client.Via]
		if !ok {
			return fmt.Errorf("client routes services via unknown node %q", spec.Client.Via)
		}
		for _, r := range spec.Client.ServiceRoutes {
			gw := via.Addr(r.Addr())
			if !gw.IsValid() {
				return fmt.Errorf("node %s has no address of the family of %s", via.Spec.Name, r)
			}
			if err := c.Client.AddRoute(r, gw); err != nil {
				return err
			}
		}
	}

	for _, ps := range spec.Pods {
		if err := c.addPod(t, ps); err != nil {
			return err
		}
	}
	return nil
}

// AddPod adds a pod to a built cluster.
func (c *Cluster) AddPod(t testing.TB, ps PodSpec) *Pod {
	t.Helper()
	if err := c.addPod(t, ps); err != nil {
		t.Fatal(err)
	}
	return c.Pods[ps.Name]
}

func (c *Cluster) addPod(t testing.TB, ps PodSpec) error {
	node, ok := c.Nodes[ps.Node]
	if !ok {
		return fmt.Errorf("pod %s: unknown node %q", ps.Name, ps.Node)
	}
	if _, dup := c.Pods[ps.Name]; dup {
		return fmt.Errorf("pod %s defined twice", ps.Name)
	}
	p := &Pod{NS: New(t, c.ID, ps.Name), Spec: ps, Node: node}
	c.Pods[ps.Name] = p
	if err := p.Sysctls(hostSysctls...); err != nil {
		return err
	}
	node.pods++
	nodeSide := "vp" + strconv.Itoa(node.pods)
	if err := Veth(node.NS, nodeSide, p.NS, "eth0"); err != nil {
		return err
	}
	if err := node.SetMaster(nodeSide, "cbr0"); err != nil {
		return err
	}
	if err := node.SetHairpin(nodeSide, true); err != nil {
		return err
	}
	for _, ip := range ps.IPs {
		pc, ok := firstOfFamily(node.Spec.PodCIDRs, ip)
		if !ok || !pc.Contains(ip) {
			return fmt.Errorf("pod %s: %s is not in a pod CIDR of node %s (%v)", ps.Name, ip, node.Spec.Name, node.Spec.PodCIDRs)
		}
		if err := p.AddAddr("eth0", netip.PrefixFrom(ip, pc.Bits())); err != nil {
			return err
		}
		def := netip.PrefixFrom(netip.IPv4Unspecified(), 0)
		if ip.Is6() {
			def = netip.PrefixFrom(netip.IPv6Unspecified(), 0)
		}
		if err := p.AddRoute(def, pc.Masked().Addr().Next()); err != nil {
			return err
		}
	}
	return nil
}

// Node returns the named node or fails the test.
func (c *Cluster) Node(t testing.TB, name string) *Node {
	t.Helper()
	n, ok := c.Nodes[name]
	if !ok {
		t.Fatalf("no node %q in the cluster", name)
	}
	return n
}

// Pod returns the named pod or fails the test.
func (c *Cluster) Pod(t testing.TB, name string) *Pod {
	t.Helper()
	p, ok := c.Pods[name]
	if !ok {
		t.Fatalf("no pod %q in the cluster", name)
	}
	return p
}
