package flowtest

// Addresses in the table (the built-in example's plan, see
// internal/example/example.yaml):
//
//	198.18.0.10, fd00:18::10        node-a, the node the rules are rendered for (zone-a)
//	198.18.0.11, fd00:18::11        node-b, another node (zone-b)
//	198.18.129.0/24, fd00:18:1:a::/64  node-a's pods; they arrive on a pod interface (PodIIF)
//	198.18.130.0/24, fd00:18:1:b::/64  node-b's pods; they arrive on the LAN interface (LanIIF)
//	198.18.128.0/17, fd00:18:1::/48    the cluster CIDRs (detectLocalMode ClusterCIDR)
//	198.19.0.0/16, fd00:19::/112       service cluster IPs
//	198.19.200.0/24, fd00:19::c8:0/112 external and load balancer IPs (not local to the node)
//	203.0.113.0/24, 2001:db8::/32      clients outside the cluster; 203.0.113.0/24 is
//	                                   also in lb-ranges' loadBalancerSourceRanges
//	192.0.2.0/24                       clients outside the cluster and outside every
//	                                   source range
//	192.168.122.1                      a second local address of node-a (a bridge), in
//	                                   the nodePortAddresses scenarios
//	198.19.1.0/24, fd00:19::1:0/112    services a scenario builds by hand

import (
	"net/netip"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/example"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy/localdetect"
	"github.com/kproxy/kproxy/internal/trace"
)

// Interfaces packets arrive on.
const (
	// PodIIF is the interface node-a's own pods send from (a veth, so
	// that detectLocalMode InterfaceNamePrefix "veth" recognises it).
	PodIIF = "veth7c1d"
	// BridgeIIF is the bridge node-a's pods send from in the
	// BridgeInterface scenarios.
	BridgeIIF = "cbr0"
	// LanIIF is the node's uplink: other nodes, their pods and the
	// outside world arrive here.
	LanIIF = "eth0"
)

// Sources.
const (
	LocalPod      = "198.18.129.5" // a pod on node-a (arrives on PodIIF)
	RemotePod     = "198.18.130.5" // a pod on node-b (arrives on LanIIF)
	OtherNode     = "198.18.0.11"  // node-b itself (arrives on LanIIF)
	Outside       = "203.0.113.9"  // off-cluster, inside lb-ranges' source ranges
	OutsideDenied = "192.0.2.9"    // off-cluster, outside every source range
	ThisNode      = "198.18.0.10"  // node-a, from a local process (IIF "")
	LocalPod6     = "fd00:18:1:a::5"
	RemotePod6    = "fd00:18:1:b::5"
	Outside6      = "2001:db8::9"
	ThisNode6     = "fd00:18::10"
)

// Endpoint lists of the example's services, as Summary prints them.
const (
	WebEps       = "198.18.129.10:8080, 198.18.130.10:8080"
	WebEps6      = "[fd00:18:1:a::10]:8080, [fd00:18:1:b::10]:8080"
	EtpEps       = "198.18.129.20:8080, 198.18.130.20:8080"
	EtpLocalEp   = "198.18.129.20:8080"
	EtpRemoteEp  = "198.18.130.20:8080"
	ItpLocalEp   = "198.18.129.30:8080"
	AffinityEps  = "198.18.129.40:8080, 198.18.130.40:8080"
	DualEps      = "198.18.129.50:8080, 198.18.130.50:8080"
	DualEps6     = "[fd00:18:1:a::50]:8080, [fd00:18:1:b::50]:8080"
	DNSEps       = "198.18.129.53:53, 198.18.130.53:53"
	SCTPEp       = "198.18.130.60:9999"
	DrainingEps  = "198.18.129.70:8080, 198.18.130.70:8080"
	TopoZoneAEps = "198.18.129.80:8080, 198.18.129.81:8080"
	TopoZoneBEps = "198.18.130.80:8080, 198.18.130.81:8080"
)

// Node addresses.
var (
	NodeAIPv4 = netip.MustParseAddr("198.18.0.10")
	NodeAIPv6 = netip.MustParseAddr("fd00:18::10")

	// HostA is node-a as the tracers see it: only its own addresses are
	// local; the load balancer VIPs are not.
	HostA = trace.Host{LocalAddrs: []netip.Addr{NodeAIPv4, NodeAIPv6}}
	HostB = trace.Host{LocalAddrs: []netip.Addr{netip.MustParseAddr("198.18.0.11"), netip.MustParseAddr("fd00:18::11")}}
)

// Detect-local modes (KubeProxyConfiguration.detectLocalMode); every
// mode's options take the same strings (package localdetect).
const (
	DetectClusterCIDR         = localdetect.ClusterCIDR
	DetectNodeCIDR            = localdetect.NodeCIDR
	DetectBridgeInterface     = localdetect.BridgeInterface
	DetectInterfaceNamePrefix = localdetect.InterfaceNamePrefix
)

// Config is the part of the KubeProxyConfiguration a scenario sets, in
// no mode's own types. What is not here (masquerade bit, shard sizes,
// layouts) is each adapter's own choice and must not change where a
// packet goes.
type Config struct {
	MasqueradeAll       bool
	DetectLocalMode     string         // one of the Detect* constants
	ClusterCIDRs        []netip.Prefix // of both families
	BridgeInterface     string
	InterfaceNamePrefix string
	// NodePortAddresses as configured (keywords and CIDRs, see package
	// nodeports); nil is the mode's default.
	NodePortAddresses []string
	// ServiceCIDRs are the cluster's ServiceCIDRs, both families
	// (nftables mode only: it drops traffic to unallocated cluster IPs).
	ServiceCIDRs []netip.Prefix
	// NoLocalhostNodePorts turns iptables.localhostNodePorts off
	// (iptables mode only; upstream's default is on).
	NoLocalhostNodePorts bool
}

// LocalDetect is the configuration's detectLocalMode with its inputs of
// family f, as every mode's options take it.
func (c Config) LocalDetect(f v1.IPFamily) localdetect.Config {
	return localdetect.Config{Mode: c.DetectLocalMode, BridgeInterface: c.BridgeInterface,
		InterfaceNamePrefix: c.InterfaceNamePrefix, ClusterCIDRs: model.PrefixesOf(c.ClusterCIDRs, f)}
}

// Snapshot is what an adapter renders: the cluster as the node sees it,
// and the configuration.
type Snapshot struct {
	// Node is the node the rules are rendered for.
	Node *model.Node
	// States holds both families.
	States map[v1.IPFamily]*model.State
	// LocalAddrs are the host's addresses as the renderer is told them
	// (node-port addresses are chosen among them); loopback may be among
	// them.
	LocalAddrs []netip.Addr
	Config     Config
}

// Host is the node as the tracer sees it: its non-loopback local
// addresses (loopback is always local to the tracers).
func (s *Snapshot) Host() trace.Host {
	var h trace.Host
	for _, a := range s.LocalAddrs {
		if !a.IsLoopback() {
			h.LocalAddrs = append(h.LocalAddrs, a)
		}
	}
	return h
}

// Families are the families of every snapshot, in render order.
var Families = []v1.IPFamily{model.IPv4, model.IPv6}

// DefaultConfig is the example's configuration: detectLocalMode
// ClusterCIDR with the example's cluster CIDRs, everything else at the
// mode's default.
func DefaultConfig() Config {
	c := Config{DetectLocalMode: DetectClusterCIDR}
	for _, s := range example.ClusterCIDRs {
		c.ClusterCIDRs = append(c.ClusterCIDRs, netip.MustParsePrefix(s))
	}
	return c
}

// Example runs the built-in example through the tracker exactly as
// `kproxy render` does, as seen from nodeName.
func Example(t testing.TB, nodeName string) *Snapshot {
	t.Helper()
	var invalid []*model.InvalidError
	tracker := model.NewTracker(model.TrackerOptions{
		Hostname:  nodeName,
		Families:  Families,
		OnInvalid: func(e *model.InvalidError) { invalid = append(invalid, e) },
	})
	example.Objects().Feed(tracker)
	u := tracker.Take()
	s := &Snapshot{States: map[v1.IPFamily]*model.State{}, Config: DefaultConfig()}
	for _, f := range Families {
		st := model.NewState(f)
		st.Apply(u.Families[f])
		s.States[f] = st
	}
	s.Node = tracker.Node()
	if s.Node == nil {
		t.Fatalf("node %s is not in the example", nodeName)
	}
	if len(invalid) > 0 {
		t.Fatalf("the example has invalid objects: %v", invalid)
	}
	s.LocalAddrs = s.Node.Addresses
	return s
}

// SetSourceRanges converts the example's lb-ranges again, as the tracker
// would, with other loadBalancerSourceRanges, into the states.
func SetSourceRanges(t testing.TB, states map[v1.IPFamily]*model.State, ranges []string) {
	t.Helper()
	var svc *v1.Service
	for _, s := range example.Objects().Services {
		if s.Name == "lb-ranges" {
			svc = s
		}
	}
	if svc == nil {
		t.Fatal("lb-ranges is not in the example")
	}
	svc.Spec.LoadBalancerSourceRanges = ranges
	ports, errs := model.ConvertService(svc, Families)
	if len(errs) > 0 {
		t.Fatalf("lb-ranges: %v", errs)
	}
	for f, st := range states {
		for n := range st.Services {
			if n.Name == "lb-ranges" {
				delete(st.Services, n)
			}
		}
		for n, sp := range ports[f] {
			st.Services[n] = sp
		}
	}
}

// OnlyRemoteEndpoints removes the endpoints local to the node from one
// IPv4 service port, and fails unless want remote ones are left.
func OnlyRemoteEndpoints(t testing.TB, s *Snapshot, n model.ServicePortName, want int) {
	t.Helper()
	st := s.States[model.IPv4]
	var remote []*model.Endpoint
	for _, e := range st.Endpoints[n] {
		if !e.Local {
			remote = append(remote, e)
		}
	}
	if len(remote) != want {
		t.Fatalf("expected %d remote endpoints of %s, got %d", want, n, len(remote))
	}
	st.Endpoints[n] = remote
}
