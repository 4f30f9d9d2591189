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
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/kproxy/kproxy/internal/config"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy"
	"github.com/kproxy/kproxy/internal/proxy/flowtest"
	"github.com/kproxy/kproxy/internal/proxy/localdetect"
	"github.com/kproxy/kproxy/internal/testutil/fixtures"
	"github.com/kproxy/kproxy/internal/trace"
	nfttrace "github.com/kproxy/kproxy/internal/trace/nftables"
)

// The address plan of the shared packet-flow table (package flowtest),
// under the names this package's tests use.
const (
	podIIF = flowtest.PodIIF
	lanIIF = flowtest.LanIIF

	localPod      = flowtest.LocalPod
	outside       = flowtest.Outside
	outsideDenied = flowtest.OutsideDenied
	thisNode      = flowtest.ThisNode
	localPod6     = flowtest.LocalPod6
	outside6      = flowtest.Outside6
	thisNode6     = flowtest.ThisNode6

	webEps       = flowtest.WebEps
	affinityEps  = flowtest.AffinityEps
	dnsEps       = flowtest.DNSEps
	topoZoneAEps = flowtest.TopoZoneAEps

	masqueradeBit = 14
)

var (
	nodeAIPv4 = flowtest.NodeAIPv4
	nodeAIPv6 = flowtest.NodeAIPv6

	// hostA is node-a as the tracer sees it: only its own addresses are
	// local; the load balancer VIPs are not.
	hostA = flowtest.HostA
)

// exampleOptions are the options of the golden files: cluster CIDRs from
// the example, masquerade bit 14, nodePortAddresses left at the default
// (the node's primary IPs), and shards of 4 service ports, so that the
// example's 14 IPv4 service ports spread over 4 shard tables (its 2 IPv6
// ones fit in one).
func exampleOptions(f v1.IPFamily) Options {
	o := Options{Family: f, ModeOptions: config.ModeOptions{MasqueradeBit: masqueradeBit, LocalDetect: localdetect.Config{Mode: localdetect.ClusterCIDR}}, ServicesPerShard: 4}
	o.LocalDetect.ClusterCIDRs = fixtures.ClusterCIDRs(f)
	return o
}

// exampleInput is a full sync of family f of the example on a fresh node.
func exampleInput(c *flowtest.Snapshot, f v1.IPFamily) *Input {
	return &Input{
		RenderInput: proxy.RenderInput{State: c.States[f], NodeName: c.Node.Name, Zone: c.Node.Zone(), Changed: sets.New[model.ServicePortName]()},
		Full:        true,
	}
}

// renderFull renders a full sync of one family on a fresh node.
func renderFull(t testing.TB, c *flowtest.Snapshot, o Options) *Plan {
	t.Helper()
	cfg := o.RenderConfig(c.Node, c.Node.Addresses)
	return Render(cfg, exampleInput(c, o.Family), NewApplied())
}

// parse parses rendered text, failing the test when the tracer (which
// checks what the kernel checks) refuses it.
func parse(t testing.TB, text string) *nfttrace.Ruleset {
	t.Helper()
	rs, err := nfttrace.ParseNFT(text)
	if err != nil {
		t.Fatalf("rendered rules do not load: %v\n%s", err, text)
	}
	return rs
}

// packetFlowTest is one packet and where it must end, as a
// flowtest.Case states it (see there): the tests of single syncs use this
// short form, the shared table (flow_test.go) the Case itself.
type packetFlowTest struct {
	name   string
	proto  v1.Protocol // TCP when empty
	src    string
	iif    string // "" for a packet from a process on the node
	dst    string // "ip:port"
	output string
	masq   bool
	// knownDiff: see flowtest.Case.KnownDiff.
	knownDiff string
}

func runPacketFlowTests(t *testing.T, rs *nfttrace.Ruleset, host trace.Host, tests []packetFlowTest) {
	t.Helper()
	cases := make([]flowtest.Case, 0, len(tests))
	for _, tc := range tests {
		cases = append(cases, flowtest.Case{Name: tc.name, Proto: tc.proto, Src: tc.src, IIF: tc.iif, Dst: tc.dst, Output: tc.output, Masq: tc.masq, KnownDiff: tc.knownDiff})
	}
	flowtest.Check(t, flowtest.NFTables, rs, host, cases)
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
