package iptables

// Packet-flow tests: the example is rendered for a node, restored into the
// iptables tracer (which refuses what iptables-restore and the kernel
// would), and packets are followed through it. The address plan is at the
// top of fixtures_test.go. Where iptables mode differs from nftables mode
// upstream differs too: undefined ports of a cluster IP are not rejected,
// node ports answer on every local address including 127.0.0.1.

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/example"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/trace"
	iptrace "github.com/kproxy/kproxy/internal/trace/iptables"
)

const (
	podIIF = "veth7c1d" // node-a's pods send from here
	lanIIF = "eth0"     // other nodes, their pods and the outside world
)

// Sources.
const (
	localPod      = "198.18.129.5"
	remotePod     = "198.18.130.5"
	otherNode     = "198.18.0.11"
	outside       = "203.0.113.9" // inside lb-ranges' source ranges
	outsideDenied = "192.0.2.9"   // outside every source range
	thisNode      = "198.18.0.10"
	localPod6     = "fd00:18:1:a::5"
	outside6      = "2001:db8::9"
	thisNode6     = "fd00:18::10"
)

// Endpoint lists, as flowSummary prints them.
const (
	webEps       = "198.18.129.10:8080, 198.18.130.10:8080"
	webEps6      = "[fd00:18:1:a::10]:8080, [fd00:18:1:b::10]:8080"
	etpEps       = "198.18.129.20:8080, 198.18.130.20:8080"
	etpLocalEp   = "198.18.129.20:8080"
	itpLocalEp   = "198.18.129.30:8080"
	affinityEps  = "198.18.129.40:8080, 198.18.130.40:8080"
	dualEps      = "198.18.129.50:8080, 198.18.130.50:8080"
	dualEps6     = "[fd00:18:1:a::50]:8080, [fd00:18:1:b::50]:8080"
	dnsEps       = "198.18.129.53:53, 198.18.130.53:53"
	sctpEp       = "198.18.130.60:9999"
	drainingEps  = "198.18.129.70:8080, 198.18.130.70:8080"
	topoZoneAEps = "198.18.129.80:8080, 198.18.129.81:8080"
	topoZoneBEps = "198.18.130.80:8080, 198.18.130.81:8080"
)

var (
	hostA = trace.Host{LocalAddrs: []netip.Addr{netip.MustParseAddr("198.18.0.10"), netip.MustParseAddr("fd00:18::10")}}
	hostB = trace.Host{LocalAddrs: []netip.Addr{netip.MustParseAddr("198.18.0.11"), netip.MustParseAddr("fd00:18::11")}}
)

// rulesets are one tracer ruleset per family.
type rulesets map[v1.IPFamily]*iptrace.Ruleset

// load restores a full sync of both families into fresh tracer rulesets,
// with route_localnet as the proxier's caller sets it for localhost node
// ports.
func (c *exampleCluster) load(t testing.TB, opts func(v1.IPFamily) Options) rulesets {
	t.Helper()
	out := rulesets{}
	for _, f := range []v1.IPFamily{model.IPv4, model.IPv6} {
		o := opts(f)
		plan := c.renderFull(t, o)
		rs := &iptrace.Ruleset{RouteLocalnet: f == model.IPv4 && o.LocalhostNodePorts}
		for i, r := range plan.Restores {
			if err := rs.Apply(r, true); err != nil {
				t.Fatalf("%s restore %d does not load: %v\n%s", f, i+1, err, r)
			}
		}
		out[f] = rs
	}
	return out
}

// packetFlowTest is one packet and where it must end, in the style of
// upstream's runPacketFlowTests: output is the endpoints the packet may be
// DNATed to ("ip:port, ip:port", sorted), or "DROP", "REJECT", or "ACCEPT"
// (let through unchanged: not a service destination).
type packetFlowTest struct {
	name   string
	proto  v1.Protocol // TCP when empty
	src    string
	iif    string // "" for a packet from a process on the node
	dst    string // "ip:port"
	output string
	masq   bool
}

func (tc packetFlowTest) packet() trace.Packet {
	d := netip.MustParseAddrPort(tc.dst)
	proto := tc.proto
	if proto == "" {
		proto = v1.ProtocolTCP
	}
	return trace.Packet{Src: netip.MustParseAddr(tc.src), SrcPort: 40000, Dst: d.Addr(), DstPort: d.Port(), Proto: proto, IIF: tc.iif}
}

// flowSummary reduces a trace result to (output, masq). Every outcome must
// agree on the verdict kind and on masquerading.
func flowSummary(res *trace.Result) (output string, masq bool, problem string) {
	if len(res.Outcomes) == 0 {
		return "", false, "no outcome"
	}
	first := res.Outcomes[0]
	for _, o := range res.Outcomes[1:] {
		if o.Verdict != first.Verdict || (o.DNAT == nil) != (first.DNAT == nil) {
			return "", false, "outcomes disagree on the verdict"
		}
		if o.Masquerade != first.Masquerade {
			return "", false, "outcomes disagree on masquerading"
		}
	}
	switch {
	case first.Verdict == trace.VerdictDrop:
		return "DROP", false, ""
	case first.Verdict == trace.VerdictReject:
		return "REJECT", false, ""
	case first.DNAT == nil:
		return "ACCEPT", first.Masquerade, ""
	}
	var eps []string
	for _, e := range res.Endpoints() {
		eps = append(eps, e.String())
	}
	slices.Sort(eps)
	return strings.Join(eps, ", "), first.Masquerade, ""
}

func (rs rulesets) trace(t *testing.T, p trace.Packet, host trace.Host) *trace.Result {
	t.Helper()
	res, err := rs[model.FamilyOf(p.Dst)].Trace(p, host)
	if err != nil {
		t.Fatalf("trace %s: %v", p, err)
	}
	return res
}

func runPacketFlowTests(t *testing.T, rs rulesets, host trace.Host, tests []packetFlowTest) {
	t.Helper()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res := rs.trace(t, tc.packet(), host)
			out, masq, problem := flowSummary(res)
			if problem != "" {
				t.Fatalf("%s:\n%s", problem, res)
			}
			if out != tc.output || masq != tc.masq {
				t.Errorf("%s: got %q masquerade=%v, want %q masquerade=%v\n%s", res.Packet, out, masq, tc.output, tc.masq, res)
			}
		})
	}
}

// layouts runs a test with upstream's layout and the compact one: they
// must route every packet alike.
func layouts(t *testing.T, f func(t *testing.T, opts func(v1.IPFamily) Options)) {
	for _, compact := range []bool{false, true} {
		name := "upstream"
		if compact {
			name = "compact"
		}
		t.Run(name, func(t *testing.T) {
			f(t, func(fam v1.IPFamily) Options {
				o := exampleOptions(fam)
				o.CompactLayout = compact
				return o
			})
		})
	}
}

func TestPacketFlowExample(t *testing.T) {
	layouts(t, testPacketFlowExample)
}

func testPacketFlowExample(t *testing.T, opts func(v1.IPFamily) Options) {
	c := loadExample(t, example.NodeA)
	rs := c.load(t, opts)
	runPacketFlowTests(t, rs, hostA, []packetFlowTest{
		// ClusterIP: only traffic from outside the cluster CIDR is masqueraded.
		{name: "clusterIP from local pod", src: localPod, iif: podIIF, dst: "198.19.0.10:80", output: webEps},
		{name: "clusterIP from pod on other node", src: remotePod, iif: lanIIF, dst: "198.19.0.10:80", output: webEps},
		{name: "clusterIP from other node", src: otherNode, iif: lanIIF, dst: "198.19.0.10:80", output: webEps, masq: true},
		{name: "clusterIP from outside", src: outside, iif: lanIIF, dst: "198.19.0.10:80", output: webEps, masq: true},
		{name: "clusterIP from this node", src: thisNode, dst: "198.19.0.10:80", output: webEps, masq: true},
		// iptables mode does not reject undefined ports (nftables mode does).
		{name: "clusterIP undefined port", src: localPod, iif: podIIF, dst: "198.19.0.10:81", output: "ACCEPT"},

		// NodePort on every local address (iptables mode's default).
		{name: "nodePort from outside", src: outside, iif: lanIIF, dst: "198.18.0.10:30080", output: webEps, masq: true},
		{name: "nodePort from other node", src: otherNode, iif: lanIIF, dst: "198.18.0.10:30080", output: webEps, masq: true},
		{name: "nodePort from local pod", src: localPod, iif: podIIF, dst: "198.18.0.10:30080", output: webEps, masq: true},
		{name: "nodePort from this node", src: thisNode, dst: "198.18.0.10:30080", output: webEps, masq: true},
		{name: "nodePort via the clusterIP is not a nodePort", src: localPod, iif: podIIF, dst: "198.19.0.11:30080", output: "ACCEPT"},
		{name: "clusterIP of the nodePort service", src: localPod, iif: podIIF, dst: "198.19.0.11:80", output: webEps},
		{name: "nodePort not on another node's IP", src: outside, iif: lanIIF, dst: "198.18.0.11:30080", output: "ACCEPT"},
		{name: "nodePort not on an LB VIP", src: outside, iif: lanIIF, dst: "198.19.200.1:30080", output: "ACCEPT"},
		// Localhost node ports (IPv4, localhostNodePorts on).
		{name: "nodePort on localhost", src: "127.0.0.1", dst: "127.0.0.1:30080", output: webEps, masq: true},
		// route_localnet lets packets to 127.0.0.0/8 in from other hosts:
		// KUBE-FIREWALL drops those not DNATed (CVE-2020-8558).
		{name: "martian to a localhost service dropped", src: otherNode, iif: lanIIF, dst: "127.0.0.1:22", output: "DROP"},

		// LoadBalancer with source ranges 198.18.0.0/24 and 203.0.113.0/24.
		{name: "LB VIP from allowed outside source", src: outside, iif: lanIIF, dst: "198.19.200.1:443", output: webEps, masq: true},
		{name: "LB VIP from denied outside source", src: outsideDenied, iif: lanIIF, dst: "198.19.200.1:443", output: "DROP"},
		{name: "LB VIP from other node (in range)", src: otherNode, iif: lanIIF, dst: "198.19.200.1:443", output: webEps, masq: true},
		{name: "LB VIP from local pod (not in range)", src: localPod, iif: podIIF, dst: "198.19.200.1:443", output: "DROP"},
		{name: "LB VIP from this node (in range)", src: thisNode, dst: "198.19.200.1:443", output: webEps, masq: true},
		{name: "LB VIP looping back with the VIP as source", src: "198.19.200.1", dst: "198.19.200.1:443", output: webEps, masq: true},
		{name: "LB nodePort ignores source ranges", src: outsideDenied, iif: lanIIF, dst: "198.18.0.10:30443", output: webEps, masq: true},
		{name: "LB clusterIP ignores source ranges", src: localPod, iif: podIIF, dst: "198.19.0.12:443", output: webEps},
		{name: "LB VIP other port", src: outside, iif: lanIIF, dst: "198.19.200.1:80", output: "ACCEPT"},
		// ipMode Proxy: the node leaves the IP to the real load balancer.
		{name: "LB ipMode Proxy IP from pod", src: localPod, iif: podIIF, dst: "198.19.200.2:443", output: "ACCEPT"},
		{name: "LB ipMode Proxy IP from outside", src: outsideDenied, iif: lanIIF, dst: "198.19.200.2:443", output: "ACCEPT"},

		// External IPs.
		{name: "externalIP from outside", src: outside, iif: lanIIF, dst: "198.19.200.10:8080", output: webEps, masq: true},
		{name: "externalIP from local pod", src: localPod, iif: podIIF, dst: "198.19.200.10:8080", output: webEps, masq: true},
		{name: "externalIP from this node", src: thisNode, dst: "198.19.200.10:8080", output: webEps, masq: true},
		{name: "externalIP other port", src: outside, iif: lanIIF, dst: "198.19.200.10:80", output: "ACCEPT"},
		{name: "externalIP IPv6 from outside", src: outside6, iif: lanIIF, dst: "[fd00:19::c8:a]:8080", output: webEps6, masq: true},
		{name: "clusterIP IPv6 of ext-ip from local pod", src: localPod6, iif: podIIF, dst: "[fd00:19::13]:8080", output: webEps6},

		// externalTrafficPolicy Local: external traffic to local endpoints
		// with the source kept; pods short-circuited to every endpoint; the
		// node itself masqueraded.
		{name: "ETP Local LB VIP from outside", src: outside, iif: lanIIF, dst: "198.19.200.3:80", output: etpLocalEp},
		{name: "ETP Local nodePort from outside", src: outside, iif: lanIIF, dst: "198.18.0.10:30081", output: etpLocalEp},
		{name: "ETP Local nodePort from other node", src: otherNode, iif: lanIIF, dst: "198.18.0.10:30081", output: etpLocalEp},
		{name: "ETP Local LB VIP from local pod", src: localPod, iif: podIIF, dst: "198.19.200.3:80", output: etpEps},
		{name: "ETP Local nodePort from local pod", src: localPod, iif: podIIF, dst: "198.18.0.10:30081", output: etpEps},
		{name: "ETP Local LB VIP from pod on other node", src: remotePod, iif: lanIIF, dst: "198.19.200.3:80", output: etpEps},
		{name: "ETP Local LB VIP from this node", src: thisNode, dst: "198.19.200.3:80", output: etpEps, masq: true},
		{name: "ETP Local nodePort from this node", src: thisNode, dst: "198.18.0.10:30081", output: etpEps, masq: true},
		{name: "ETP Local clusterIP from local pod", src: localPod, iif: podIIF, dst: "198.19.0.14:80", output: etpEps},
		{name: "ETP Local clusterIP from outside", src: outside, iif: lanIIF, dst: "198.19.0.14:80", output: etpEps, masq: true},

		// internalTrafficPolicy Local: only node-a's endpoint.
		{name: "ITP Local from local pod", src: localPod, iif: podIIF, dst: "198.19.0.15:80", output: itpLocalEp},
		{name: "ITP Local from pod on other node", src: remotePod, iif: lanIIF, dst: "198.19.0.15:80", output: itpLocalEp},
		{name: "ITP Local from outside", src: outside, iif: lanIIF, dst: "198.19.0.15:80", output: itpLocalEp, masq: true},
		{name: "ITP Local from this node", src: thisNode, dst: "198.19.0.15:80", output: itpLocalEp, masq: true},

		// Hairpin: the only endpoint reaching its own service.
		{name: "hairpin", src: "198.18.129.30", iif: podIIF, dst: "198.19.0.15:80", output: itpLocalEp, masq: true},

		// Session affinity (nothing recorded yet: every endpoint).
		{name: "affinity first packet", src: localPod, iif: podIIF, dst: "198.19.0.16:80", output: affinityEps},

		// Dual-stack.
		{name: "dual-stack IPv4", src: localPod, iif: podIIF, dst: "198.19.0.17:80", output: dualEps},
		{name: "dual-stack IPv6 from local pod", src: localPod6, iif: podIIF, dst: "[fd00:19::17]:80", output: dualEps6},
		{name: "dual-stack IPv6 from outside", src: outside6, iif: lanIIF, dst: "[fd00:19::17]:80", output: dualEps6, masq: true},
		{name: "dual-stack IPv6 from this node", src: thisNode6, dst: "[fd00:19::17]:80", output: dualEps6, masq: true},
		{name: "IPv6 single-stack service's IPv4 only", src: localPod6, iif: podIIF, dst: "[fd00:19::10]:80", output: "ACCEPT"},
		// No localhost node ports on IPv6.
		{name: "IPv6 nodePort not on ::1", src: "::1", dst: "[::1]:30080", output: "ACCEPT"},

		// UDP and SCTP.
		{name: "UDP DNS", proto: v1.ProtocolUDP, src: localPod, iif: podIIF, dst: "198.19.0.18:53", output: dnsEps},
		{name: "UDP DNS from outside", proto: v1.ProtocolUDP, src: outside, iif: lanIIF, dst: "198.19.0.18:53", output: dnsEps, masq: true},
		{name: "TCP DNS", src: localPod, iif: podIIF, dst: "198.19.0.18:53", output: dnsEps},
		{name: "SCTP", proto: v1.ProtocolSCTP, src: localPod, iif: podIIF, dst: "198.19.0.19:9999", output: sctpEp},
		{name: "SCTP from this node", proto: v1.ProtocolSCTP, src: thisNode, dst: "198.19.0.19:9999", output: sctpEp, masq: true},
		{name: "TCP to SCTP-only port", src: localPod, iif: podIIF, dst: "198.19.0.19:9999", output: "ACCEPT"},

		// No endpoints: rejected from everywhere.
		{name: "no endpoints from pod", src: localPod, iif: podIIF, dst: "198.19.0.20:80", output: "REJECT"},
		{name: "no endpoints from this node", src: thisNode, dst: "198.19.0.20:80", output: "REJECT"},
		{name: "no endpoints from outside", src: outside, iif: lanIIF, dst: "198.19.0.20:80", output: "REJECT"},

		// Only terminating (still serving) endpoints: the fallback.
		{name: "terminating fallback", src: localPod, iif: podIIF, dst: "198.19.0.21:80", output: drainingEps},

		// Zone hints: only zone-a's endpoints for node-a.
		{name: "topology hints", src: localPod, iif: podIIF, dst: "198.19.0.22:80", output: topoZoneAEps},

		// Services handled by another proxy are not ours at all.
		{name: "other proxy's service", src: localPod, iif: podIIF, dst: "198.19.0.23:80", output: "ACCEPT"},
	})
}

// TestPacketFlowOtherNode renders the example for node-b: what is local
// changes, and internalTrafficPolicy Local has nothing to send to.
func TestPacketFlowOtherNode(t *testing.T) {
	layouts(t, testPacketFlowOtherNode)
}

func testPacketFlowOtherNode(t *testing.T, opts func(v1.IPFamily) Options) {
	c := loadExample(t, example.NodeB)
	rs := c.load(t, opts)
	const podOfB = "198.18.130.5"
	runPacketFlowTests(t, rs, hostB, []packetFlowTest{
		{name: "ITP Local without local endpoints drops pod traffic", src: podOfB, iif: podIIF, dst: "198.19.0.15:80", output: "DROP"},
		{name: "ITP Local without local endpoints drops node traffic", src: "198.18.0.11", dst: "198.19.0.15:80", output: "DROP"},
		{name: "ITP Local without local endpoints drops outside traffic", src: outside, iif: lanIIF, dst: "198.19.0.15:80", output: "DROP"},
		{name: "ETP Local LB VIP from outside", src: outside, iif: lanIIF, dst: "198.19.200.3:80", output: "198.18.130.20:8080"},
		{name: "ETP Local nodePort on node-b", src: outside, iif: lanIIF, dst: "198.18.0.11:30081", output: "198.18.130.20:8080"},
		{name: "nodePort of node-a is not node-b's", src: outside, iif: lanIIF, dst: "198.18.0.10:30081", output: "ACCEPT"},
		{name: "topology hints of zone-b", src: podOfB, iif: podIIF, dst: "198.19.0.22:80", output: topoZoneBEps},
	})
}

// TestPacketFlowETPLocalNoLocalEndpoints: a Local external policy whose
// endpoints are all elsewhere drops external traffic but still serves pods
// and the node itself.
func TestPacketFlowETPLocalNoLocalEndpoints(t *testing.T) {
	c := loadExample(t, example.NodeA)
	n := spName("etp-local", "http", model.TCP)
	st := c.states[model.IPv4]
	var remote []*model.Endpoint
	for _, e := range st.Endpoints[n] {
		if !e.Local {
			remote = append(remote, e)
		}
	}
	st.Endpoints[n] = remote
	rs := c.load(t, exampleOptions)
	const ep = "198.18.130.20:8080"
	runPacketFlowTests(t, rs, hostA, []packetFlowTest{
		{name: "LB VIP from outside dropped", src: outside, iif: lanIIF, dst: "198.19.200.3:80", output: "DROP"},
		{name: "nodePort from outside dropped", src: outside, iif: lanIIF, dst: "198.18.0.10:30081", output: "DROP"},
		{name: "LB VIP from local pod served", src: localPod, iif: podIIF, dst: "198.19.200.3:80", output: ep},
		{name: "LB VIP from this node served", src: thisNode, dst: "198.19.200.3:80", output: ep, masq: true},
		{name: "clusterIP served", src: localPod, iif: podIIF, dst: "198.19.0.14:80", output: ep},
	})
}

// TestPacketFlowMasquerade covers masqueradeAll and the detect-local modes.
func TestPacketFlowMasquerade(t *testing.T) {
	c := loadExample(t, example.NodeA)
	for _, tc := range []struct {
		name  string
		tweak func(*Options)
		tests []packetFlowTest
	}{
		{
			name:  "masqueradeAll",
			tweak: func(o *Options) { o.MasqueradeAll = true },
			tests: []packetFlowTest{
				{name: "clusterIP from local pod", src: localPod, iif: podIIF, dst: "198.19.0.10:80", output: webEps, masq: true},
				{name: "no endpoints still rejected", src: localPod, iif: podIIF, dst: "198.19.0.20:80", output: "REJECT"},
			},
		},
		{
			name:  "NodeCIDR",
			tweak: func(o *Options) { o.DetectLocalMode = DetectNodeCIDR },
			tests: []packetFlowTest{
				{name: "clusterIP from local pod", src: localPod, iif: podIIF, dst: "198.19.0.10:80", output: webEps},
				// A pod of node-b is outside node-a's pod CIDR.
				{name: "clusterIP from remote pod", src: remotePod, iif: lanIIF, dst: "198.19.0.10:80", output: webEps, masq: true},
			},
		},
		{
			name:  "InterfaceNamePrefix",
			tweak: func(o *Options) { o.DetectLocalMode, o.InterfaceNamePrefix = DetectInterfaceNamePrefix, "veth" },
			tests: []packetFlowTest{
				{name: "clusterIP from local pod", src: localPod, iif: podIIF, dst: "198.19.0.10:80", output: webEps},
				{name: "clusterIP from remote pod", src: remotePod, iif: lanIIF, dst: "198.19.0.10:80", output: webEps, masq: true},
				{name: "ETP Local LB VIP from local pod short-circuited", src: localPod, iif: podIIF, dst: "198.19.200.3:80", output: etpEps},
			},
		},
		{
			name:  "BridgeInterface",
			tweak: func(o *Options) { o.DetectLocalMode, o.BridgeInterface = DetectBridgeInterface, "cbr0" },
			tests: []packetFlowTest{
				{name: "clusterIP from the bridge", src: localPod, iif: "cbr0", dst: "198.19.0.10:80", output: webEps},
				{name: "clusterIP from a veth", src: localPod, iif: podIIF, dst: "198.19.0.10:80", output: webEps, masq: true},
			},
		},
		{
			name:  "localhost node ports off",
			tweak: func(o *Options) { o.LocalhostNodePorts = false },
			tests: []packetFlowTest{
				{name: "nodePort not on localhost", src: "127.0.0.1", dst: "127.0.0.1:30080", output: "ACCEPT"},
				{name: "nodePort on the node IP", src: outside, iif: lanIIF, dst: "198.18.0.10:30080", output: webEps, masq: true},
			},
		},
		{
			name:  "nodePortAddresses primary",
			tweak: func(o *Options) { o.NodePortAddresses = []string{"primary"} },
			tests: []packetFlowTest{
				{name: "nodePort on the primary IP", src: outside, iif: lanIIF, dst: "198.18.0.10:30080", output: webEps, masq: true},
				{name: "nodePort not on localhost", src: "127.0.0.1", dst: "127.0.0.1:30080", output: "ACCEPT"},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs := c.load(t, func(f v1.IPFamily) Options {
				o := exampleOptions(f)
				tc.tweak(&o)
				return o
			})
			runPacketFlowTests(t, rs, hostA, tc.tests)
		})
	}
}

// TestPacketFlowAffinity: once a client was sent to an endpoint, its next
// connections go there too; other clients are still spread.
func TestPacketFlowAffinity(t *testing.T) {
	layouts(t, testPacketFlowAffinity)
}

func testPacketFlowAffinity(t *testing.T, opts func(v1.IPFamily) Options) {
	c := loadExample(t, example.NodeA)
	rs := c.load(t, opts)
	p := packetFlowTest{src: localPod, iif: podIIF, dst: "198.19.0.16:80"}.packet()
	res := rs.trace(t, p, hostA)
	if len(res.Outcomes) != 2 {
		t.Fatalf("first connection: want 2 outcomes, got\n%s", res)
	}
	chosen := res.Outcomes[1]
	if len(chosen.AffinityUpdates) != 1 {
		t.Fatalf("the DNAT should record the client for affinity: %v", chosen.AffinityUpdates)
	}
	if err := rs[model.IPv4].Remember(chosen); err != nil {
		t.Fatal(err)
	}
	res = rs.trace(t, p, hostA)
	if got := res.Endpoints(); len(got) != 1 || got[0] != *chosen.DNAT {
		t.Errorf("second connection: endpoints %v, want only %v\n%s", got, chosen.DNAT, res)
	}
	other := packetFlowTest{src: remotePod, iif: lanIIF, dst: "198.19.0.16:80"}.packet()
	if got := rs.trace(t, other, hostA).Endpoints(); len(got) != 2 {
		t.Errorf("another client: endpoints %v, want both", got)
	}
}

// TestPacketFlowEqualShares: the statistic rules give each endpoint an
// equal share, as the kernel evaluates them (a 31-bit fraction).
func TestPacketFlowEqualShares(t *testing.T) {
	layouts(t, testPacketFlowEqualShares)
}

func testPacketFlowEqualShares(t *testing.T, opts func(v1.IPFamily) Options) {
	c := loadExample(t, example.NodeA)
	n := spName("web-clusterip", "http", model.TCP)
	st := c.states[model.IPv4]
	var eps []*model.Endpoint
	for i := range 7 {
		eps = append(eps, makeEP(netip.AddrFrom4([4]byte{198, 18, 130, byte(100 + i)}).String(), 8080, false, nil))
	}
	st.Endpoints[n] = eps
	rs := c.load(t, opts)
	res := rs.trace(t, packetFlowTest{src: localPod, iif: podIIF, dst: "198.19.0.10:80"}.packet(), hostA)
	if len(res.Outcomes) != 7 {
		t.Fatalf("want 7 outcomes, got\n%s", res)
	}
	for _, o := range res.Outcomes {
		if d := o.Probability - 1.0/7; d > 1e-6 || d < -1e-6 {
			t.Errorf("%v gets %.9f, want 1/7", o.DNAT, o.Probability)
		}
	}
}
