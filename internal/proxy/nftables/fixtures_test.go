package nftables

// Addresses in these tests (the built-in example's plan, see
// internal/example/example.yaml):
//
//	198.18.0.10, fd00:18::10        node-a, the node the rules are rendered for (zone-a)
//	198.18.0.11, fd00:18::11        node-b, another node (zone-b)
//	198.18.129.0/24, fd00:18:1:a::/64  node-a's pods; they arrive on a pod interface (podIIF)
//	198.18.130.0/24, fd00:18:1:b::/64  node-b's pods; they arrive on the LAN interface (lanIIF)
//	198.18.128.0/17, fd00:18:1::/48    the cluster CIDRs (detectLocalMode ClusterCIDR)
//	198.19.0.0/16, fd00:19::/112       service cluster IPs
//	198.19.200.0/24, fd00:19::c8:0/112 external and load balancer IPs (not local to the node)
//	203.0.113.0/24, 2001:db8::/32      clients outside the cluster; 203.0.113.0/24 is
//	                                   also in lb-ranges' loadBalancerSourceRanges
//	192.0.2.0/24                       clients outside the cluster and outside every
//	                                   source range
//	198.19.1.0/24, 198.19.201.0/24     services the partial-sync tests add

import (
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/kproxy/kproxy/internal/example"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/trace"
)

const (
	// podIIF is the interface node-a's own pods send from (a veth, so
	// that detectLocalMode InterfaceNamePrefix "veth" recognises it).
	podIIF = "veth7c1d"
	// bridgeIIF is the bridge node-a's pods send from in the
	// BridgeInterface tests.
	bridgeIIF = "cbr0"
	// lanIIF is the node's uplink: other nodes, their pods and the
	// outside world arrive here.
	lanIIF = "eth0"

	masqueradeBit = 14
)

var (
	nodeAIPv4 = netip.MustParseAddr("198.18.0.10")
	nodeAIPv6 = netip.MustParseAddr("fd00:18::10")

	// hostA is node-a as the tracer sees it: only its own addresses are
	// local; the load balancer VIPs are not.
	hostA = trace.Host{LocalAddrs: []netip.Addr{nodeAIPv4, nodeAIPv6}}
	hostB = trace.Host{LocalAddrs: []netip.Addr{netip.MustParseAddr("198.18.0.11"), netip.MustParseAddr("fd00:18::11")}}
)

// exampleCluster is the built-in example as seen from one node: one State
// per family and that node.
type exampleCluster struct {
	nodeName string
	node     *model.Node
	states   map[v1.IPFamily]*model.State
	invalid  []*model.InvalidError
}

// loadExample runs the example through the tracker exactly as `kproxy
// render` does.
func loadExample(t testing.TB, nodeName string) *exampleCluster {
	t.Helper()
	fams := []v1.IPFamily{model.IPv4, model.IPv6}
	c := &exampleCluster{nodeName: nodeName, states: map[v1.IPFamily]*model.State{}}
	tracker := model.NewTracker(model.TrackerOptions{
		Hostname:  nodeName,
		Families:  fams,
		OnInvalid: func(e *model.InvalidError) { c.invalid = append(c.invalid, e) },
	})
	example.Objects().Feed(tracker)
	u := tracker.Take()
	for _, f := range fams {
		st := model.NewState(f)
		st.Apply(u.Families[f])
		c.states[f] = st
	}
	c.node = tracker.Node()
	if c.node == nil {
		t.Fatalf("node %s is not in the example", nodeName)
	}
	if len(c.invalid) > 0 {
		t.Fatalf("the example has invalid objects: %v", c.invalid)
	}
	return c
}

// exampleOptions are the options of the golden files: cluster CIDRs from
// the example, masquerade bit 14, nodePortAddresses left at the default
// (the node's primary IPs), and shards of 4 service ports, so that the
// example's 14 IPv4 service ports spread over 4 shard tables (its 2 IPv6
// ones fit in one).
func exampleOptions(f v1.IPFamily) Options {
	o := Options{Family: f, MasqueradeBit: masqueradeBit, DetectLocalMode: DetectClusterCIDR, ServicesPerShard: 4}
	for _, s := range example.ClusterCIDRs {
		p := netip.MustParsePrefix(s)
		if model.FamilyOf(p.Addr()) == f {
			o.ClusterCIDRs = append(o.ClusterCIDRs, p)
		}
	}
	return o
}

func (c *exampleCluster) input(f v1.IPFamily) *Input {
	return &Input{
		State:    c.states[f],
		NodeName: c.nodeName,
		Zone:     c.node.Zone(),
		Full:     true,
		Changed:  sets.New[model.ServicePortName](),
	}
}

// renderFull renders a full sync of one family on a fresh node.
func (c *exampleCluster) renderFull(t testing.TB, o Options) *Plan {
	t.Helper()
	cfg := o.RenderConfig(c.node, c.node.Addresses)
	return Render(cfg, c.input(o.Family), NewApplied())
}

// parse parses rendered text, failing the test when the tracer (which
// checks what the kernel checks) refuses it.
func parse(t testing.TB, text string) *trace.Ruleset {
	t.Helper()
	rs, err := trace.ParseNFT(text)
	if err != nil {
		t.Fatalf("rendered rules do not load: %v\n%s", err, text)
	}
	return rs
}

// ruleset renders both families of the example for options made by opts
// and loads them into one tracer ruleset.
func (c *exampleCluster) ruleset(t testing.TB, opts func(f v1.IPFamily) Options) *trace.Ruleset {
	t.Helper()
	var text strings.Builder
	for _, f := range []v1.IPFamily{model.IPv4, model.IPv6} {
		p := c.renderFull(t, opts(f))
		if len(p.Conflicts) > 0 {
			t.Fatalf("unexpected conflicts in the example: %v", p.Conflicts)
		}
		text.WriteString(p.Tx.String())
	}
	return parse(t, text.String())
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
	// knownDiff, when set, names a known difference from upstream: the
	// case states upstream's outcome and is skipped (not failed) while
	// kproxy still differs, and fails once it no longer does, so that
	// the note gets removed.
	knownDiff string
}

func (tc packetFlowTest) packet(t testing.TB) trace.Packet {
	t.Helper()
	d := netip.MustParseAddrPort(tc.dst)
	proto := tc.proto
	if proto == "" {
		proto = v1.ProtocolTCP
	}
	return trace.Packet{Src: netip.MustParseAddr(tc.src), SrcPort: 40000, Dst: d.Addr(), DstPort: d.Port(), Proto: proto, IIF: tc.iif}
}

// flowSummary reduces a trace result to (output, masq) as packetFlowTest
// states them. Every outcome must agree on the verdict kind and on
// masquerading, otherwise it is reported as an error: the tests that want
// per-endpoint differences (hairpin) look at the outcomes themselves.
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
	return strings.Join(eps, ", "), first.Masquerade, ""
}

func runPacketFlowTests(t *testing.T, rs *trace.Ruleset, host trace.Host, tests []packetFlowTest) {
	t.Helper()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res, err := rs.Trace(tc.packet(t), host)
			if err != nil {
				t.Fatalf("trace: %v", err)
			}
			out, masq, problem := flowSummary(res)
			if problem != "" {
				t.Fatalf("%s:\n%s", problem, res)
			}
			if tc.knownDiff != "" {
				if out == tc.output && masq == tc.masq {
					t.Errorf("%s now behaves as upstream; remove the knownDiff note %q", res.Packet, tc.knownDiff)
				} else {
					t.Skipf("known difference from upstream: %s (kproxy: %q masquerade=%v; upstream: %q masquerade=%v)", tc.knownDiff, out, masq, tc.output, tc.masq)
				}
				return
			}
			if out != tc.output || masq != tc.masq {
				t.Errorf("%s: got %q masquerade=%v, want %q masquerade=%v\n%s", res.Packet, out, masq, tc.output, tc.masq, res)
			}
		})
	}
}

// outcomeKey is an outcome without its path: what a packet experiences.
type outcomeKey struct {
	Verdict    string
	DNAT       string
	Masquerade bool
	Prob       float64
	// Affinity are the affinity sets the connection is recorded in.
	Affinity string
}

// shardNameRE matches the shard table in an affinity update: which shard
// holds a service depends on the shard count, not on what packets do.
var shardNameRE = regexp.MustCompile(`( ip6? \S+-s)[0-9]+ `)

func outcomeKeys(res *trace.Result) []outcomeKey {
	var out []outcomeKey
	for _, o := range res.Outcomes {
		aff := shardNameRE.ReplaceAllString(strings.Join(o.AffinityUpdates, "; "), "${1}N ")
		k := outcomeKey{Verdict: o.Verdict, Masquerade: o.Masquerade, Prob: o.Probability, Affinity: aff}
		if o.DNAT != nil {
			k.DNAT = o.DNAT.String()
		}
		out = append(out, k)
	}
	slices.SortFunc(out, func(a, b outcomeKey) int { return strings.Compare(a.DNAT+a.Verdict, b.DNAT+b.Verdict) })
	return out
}

var epoch = time.Date(2026, 1, 15, 10, 0, 0, 0, time.UTC)

// spName is the name of port "http" (or the given port name) of demo/name.
func spName(name, port string, proto v1.Protocol) model.ServicePortName {
	n := model.ServicePortName{Port: port, Protocol: proto}
	n.Namespace, n.Name = example.Namespace, name
	return n
}

// makeSP returns a ClusterIP service port demo/name:http, edited by tweak.
func makeSP(name, clusterIP string, port int32, tweak func(*model.ServicePort)) *model.ServicePort {
	ip := netip.MustParseAddr(clusterIP)
	sp := &model.ServicePort{
		Name:      spName(name, "http", model.TCP),
		Family:    model.FamilyOf(ip),
		Type:      v1.ServiceTypeClusterIP,
		ClusterIP: ip,
		Port:      port,
		Protocol:  model.TCP,
	}
	if tweak != nil {
		tweak(sp)
	}
	sp.Name.Protocol = sp.Protocol
	return sp
}

// makeEP returns a ready endpoint on node-a (local) or node-b.
func makeEP(addr string, port int32, local bool, tweak func(*model.Endpoint)) *model.Endpoint {
	e := &model.Endpoint{IP: netip.MustParseAddr(addr), Port: port, Ready: true, Serving: true, NodeName: example.NodeB, Zone: "zone-b"}
	if local {
		e.Local, e.NodeName, e.Zone = true, example.NodeA, "zone-a"
	}
	if tweak != nil {
		tweak(e)
	}
	return e
}
