package nftables

// Packet-flow tests: the example is rendered for a node, loaded into the
// tracer, and packets are followed through it. The address plan is at the
// top of fixtures_test.go.

import (
	"net/netip"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/example"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/trace"
)

// Sources.
const (
	localPod      = "198.18.129.5" // a pod on node-a (arrives on podIIF)
	remotePod     = "198.18.130.5" // a pod on node-b (arrives on lanIIF)
	otherNode     = "198.18.0.11"  // node-b itself (arrives on lanIIF)
	outside       = "203.0.113.9"  // off-cluster, inside lb-ranges' source ranges
	outsideDenied = "192.0.2.9"    // off-cluster, outside every source range
	thisNode      = "198.18.0.10"  // node-a, from a local process (IIF "")
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

func TestPacketFlowExample(t *testing.T) {
	c := loadExample(t, example.NodeA)
	rs := c.ruleset(t, exampleOptions)
	runPacketFlowTests(t, rs, hostA, []packetFlowTest{
		// ClusterIP: endpoints on both nodes; only traffic from outside
		// the cluster CIDRs is masqueraded.
		{name: "clusterIP from local pod", src: localPod, iif: podIIF, dst: "198.19.0.10:80", output: webEps},
		{name: "clusterIP from pod on other node", src: remotePod, iif: lanIIF, dst: "198.19.0.10:80", output: webEps},
		{name: "clusterIP from other node", src: otherNode, iif: lanIIF, dst: "198.19.0.10:80", output: webEps, masq: true},
		{name: "clusterIP from outside", src: outside, iif: lanIIF, dst: "198.19.0.10:80", output: webEps, masq: true},
		{name: "clusterIP from this node", src: thisNode, dst: "198.19.0.10:80", output: webEps, masq: true},

		// Undefined port of a ClusterIP: rejected, forwarded or local.
		{name: "clusterIP undefined port from pod", src: localPod, iif: podIIF, dst: "198.19.0.10:81", output: "REJECT"},
		{name: "clusterIP undefined port from this node", src: thisNode, dst: "198.19.0.10:81", output: "REJECT"},
		{name: "clusterIP undefined port from outside", src: outside, iif: lanIIF, dst: "198.19.0.10:81", output: "REJECT"},
		// Without ServiceCIDRs, an address nobody has is routed as usual.
		{name: "unallocated cluster IP is not ours", src: localPod, iif: podIIF, dst: "198.19.0.99:80", output: "ACCEPT"},

		// NodePort on the node's IP, policy Cluster: always masqueraded.
		{name: "nodePort from outside", src: outside, iif: lanIIF, dst: "198.18.0.10:30080", output: webEps, masq: true},
		{name: "nodePort from other node", src: otherNode, iif: lanIIF, dst: "198.18.0.10:30080", output: webEps, masq: true},
		{name: "nodePort from local pod", src: localPod, iif: podIIF, dst: "198.18.0.10:30080", output: webEps, masq: true},
		{name: "nodePort from this node", src: thisNode, dst: "198.18.0.10:30080", output: webEps, masq: true},
		{name: "nodePort via the clusterIP port is not a nodePort", src: localPod, iif: podIIF, dst: "198.19.0.11:30080", output: "REJECT"},
		{name: "clusterIP of the nodePort service", src: localPod, iif: podIIF, dst: "198.19.0.11:80", output: webEps},
		// NodePorts only on nodePortAddresses (default: the primary IPs).
		{name: "nodePort not on localhost", src: "127.0.0.1", dst: "127.0.0.1:30080", output: "ACCEPT"},
		{name: "nodePort not on another node's IP", src: outside, iif: lanIIF, dst: "198.18.0.11:30080", output: "ACCEPT"},
		{name: "nodePort not on an LB VIP", src: outside, iif: lanIIF, dst: "198.19.200.1:30080", output: "ACCEPT"},
		{name: "nodePort not on the clusterIP", src: outside, iif: lanIIF, dst: "198.19.0.10:30080", output: "REJECT"},

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
		{name: "LB ipMode Proxy IP from this node", src: thisNode, dst: "198.19.200.2:443", output: "ACCEPT"},

		// External IPs.
		{name: "externalIP from outside", src: outside, iif: lanIIF, dst: "198.19.200.10:8080", output: webEps, masq: true},
		{name: "externalIP from local pod", src: localPod, iif: podIIF, dst: "198.19.200.10:8080", output: webEps, masq: true},
		{name: "externalIP from this node", src: thisNode, dst: "198.19.200.10:8080", output: webEps, masq: true},
		{name: "externalIP other port", src: outside, iif: lanIIF, dst: "198.19.200.10:80", output: "ACCEPT"},
		{name: "externalIP IPv6 from outside", src: outside6, iif: lanIIF, dst: "[fd00:19::c8:a]:8080", output: webEps6, masq: true},
		{name: "clusterIP IPv6 of ext-ip from local pod", src: localPod6, iif: podIIF, dst: "[fd00:19::13]:8080", output: webEps6},

		// externalTrafficPolicy Local: external traffic only to local
		// endpoints, source kept; pods short-circuited to every endpoint;
		// the node itself masqueraded.
		{name: "ETP Local LB VIP from outside", src: outside, iif: lanIIF, dst: "198.19.200.3:80", output: etpLocalEp},
		{name: "ETP Local nodePort from outside", src: outside, iif: lanIIF, dst: "198.18.0.10:30081", output: etpLocalEp},
		{name: "ETP Local nodePort from other node", src: otherNode, iif: lanIIF, dst: "198.18.0.10:30081", output: etpLocalEp},
		{name: "ETP Local LB VIP from local pod", src: localPod, iif: podIIF, dst: "198.19.200.3:80", output: etpEps},
		{name: "ETP Local nodePort from local pod", src: localPod, iif: podIIF, dst: "198.18.0.10:30081", output: etpEps},
		// A pod of node-b is inside the cluster CIDR: short-circuited too.
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

		// Session affinity (no affinity recorded yet: every endpoint).
		{name: "affinity first packet", src: localPod, iif: podIIF, dst: "198.19.0.16:80", output: affinityEps},

		// Dual-stack.
		{name: "dual-stack IPv4", src: localPod, iif: podIIF, dst: "198.19.0.17:80", output: dualEps},
		{name: "dual-stack IPv6 from local pod", src: localPod6, iif: podIIF, dst: "[fd00:19::17]:80", output: dualEps6},
		{name: "dual-stack IPv6 from outside", src: outside6, iif: lanIIF, dst: "[fd00:19::17]:80", output: dualEps6, masq: true},
		{name: "dual-stack IPv6 from this node", src: thisNode6, dst: "[fd00:19::17]:80", output: dualEps6, masq: true},
		{name: "IPv6 undefined port", src: localPod6, iif: podIIF, dst: "[fd00:19::17]:81", output: "REJECT"},
		{name: "IPv6 single-stack service's IPv4 only", src: localPod6, iif: podIIF, dst: "[fd00:19::10]:80", output: "ACCEPT"},

		// UDP and SCTP.
		{name: "UDP DNS", proto: v1.ProtocolUDP, src: localPod, iif: podIIF, dst: "198.19.0.18:53", output: dnsEps},
		{name: "UDP DNS from outside", proto: v1.ProtocolUDP, src: outside, iif: lanIIF, dst: "198.19.0.18:53", output: dnsEps, masq: true},
		{name: "TCP DNS", src: localPod, iif: podIIF, dst: "198.19.0.18:53", output: dnsEps},
		{name: "UDP undefined port", proto: v1.ProtocolUDP, src: localPod, iif: podIIF, dst: "198.19.0.18:54", output: "REJECT"},
		{name: "SCTP", proto: v1.ProtocolSCTP, src: localPod, iif: podIIF, dst: "198.19.0.19:9999", output: sctpEp},
		{name: "SCTP from this node", proto: v1.ProtocolSCTP, src: thisNode, dst: "198.19.0.19:9999", output: sctpEp, masq: true},
		{name: "TCP to SCTP-only port", src: localPod, iif: podIIF, dst: "198.19.0.19:9999", output: "REJECT"},

		// No endpoints: rejected from everywhere.
		{name: "no endpoints from pod", src: localPod, iif: podIIF, dst: "198.19.0.20:80", output: "REJECT"},
		{name: "no endpoints from this node", src: thisNode, dst: "198.19.0.20:80", output: "REJECT"},
		{name: "no endpoints from outside", src: outside, iif: lanIIF, dst: "198.19.0.20:80", output: "REJECT"},

		// Only terminating (still serving) endpoints: used as a fallback.
		{name: "terminating fallback", src: localPod, iif: podIIF, dst: "198.19.0.21:80", output: drainingEps},

		// Zone hints: only zone-a's endpoints for node-a.
		{name: "topology hints", src: localPod, iif: podIIF, dst: "198.19.0.22:80", output: topoZoneAEps},

		// Services handled by another proxy are not ours at all.
		{name: "other proxy's service", src: localPod, iif: podIIF, dst: "198.19.0.23:80", output: "ACCEPT"},
	})
}

// TestPacketFlowOtherNode renders the same example for node-b: what is
// local changes, and internalTrafficPolicy Local has nothing to send to.
func TestPacketFlowOtherNode(t *testing.T) {
	c := loadExample(t, example.NodeB)
	rs := c.ruleset(t, exampleOptions)
	const podOfB = "198.18.130.5"
	runPacketFlowTests(t, rs, hostB, []packetFlowTest{
		{name: "ITP Local without local endpoints drops pod traffic", src: podOfB, iif: podIIF, dst: "198.19.0.15:80", output: "DROP"},
		{name: "ITP Local without local endpoints drops node traffic", src: "198.18.0.11", dst: "198.19.0.15:80", output: "DROP"},
		{name: "ITP Local without local endpoints drops outside traffic", src: outside, iif: lanIIF, dst: "198.19.0.15:80", output: "DROP"},
		{name: "ETP Local LB VIP from outside", src: outside, iif: lanIIF, dst: "198.19.200.3:80", output: "198.18.130.20:8080"},
		{name: "ETP Local nodePort on node-b", src: outside, iif: lanIIF, dst: "198.18.0.11:30081", output: "198.18.130.20:8080"},
		{name: "nodePort of node-a is not node-b's", src: outside, iif: lanIIF, dst: "198.18.0.10:30081", output: "ACCEPT"},
		{name: "topology hints of zone-b", src: podOfB, iif: podIIF, dst: "198.19.0.22:80", output: topoZoneBEps},
		{name: "SCTP endpoint is local here", proto: v1.ProtocolSCTP, src: podOfB, iif: podIIF, dst: "198.19.0.19:9999", output: sctpEp},
	})
}

// TestPacketFlowETPLocalNoLocalEndpoints: a Local external policy whose
// endpoints are all elsewhere drops external traffic but still serves pods
// and the node itself.
func TestPacketFlowETPLocalNoLocalEndpoints(t *testing.T) {
	c := loadExample(t, example.NodeA)
	n := model.ServicePortName{Port: "http", Protocol: model.TCP}
	n.Namespace, n.Name = example.Namespace, "etp-local"
	st := c.states[model.IPv4]
	var remote []*model.Endpoint
	for _, e := range st.Endpoints[n] {
		if !e.Local {
			remote = append(remote, e)
		}
	}
	if len(remote) != 1 {
		t.Fatalf("expected one remote endpoint of %s, got %d", n, len(remote))
	}
	st.Endpoints[n] = remote
	rs := c.ruleset(t, exampleOptions)
	const ep = "198.18.130.20:8080"
	runPacketFlowTests(t, rs, hostA, []packetFlowTest{
		{name: "LB VIP from outside", src: outside, iif: lanIIF, dst: "198.19.200.3:80", output: "DROP"},
		{name: "nodePort from outside", src: outside, iif: lanIIF, dst: "198.18.0.10:30081", output: "DROP"},
		{name: "LB VIP from local pod", src: localPod, iif: podIIF, dst: "198.19.200.3:80", output: ep},
		// Upstream (PR #132456, in 1.34 and 1.33.5) moved the
		// endpoint checks of filter-input/forward/output to priority 0,
		// after DNAT, so that locally generated traffic short-circuited
		// to the cluster endpoints is no longer dropped by the no-local-
		// endpoints entry of the VIP. kproxy still checks on the output
		// hook at dstnat-10, before nat-output has short-circuited it.
		{name: "LB VIP from this node", src: thisNode, dst: "198.19.200.3:80", output: ep, masq: true},
		{name: "nodePort from this node", src: thisNode, dst: "198.18.0.10:30081", output: ep, masq: true},
		{name: "clusterIP from outside", src: outside, iif: lanIIF, dst: "198.19.0.14:80", output: ep, masq: true},
	})
	// The sync reports the service as Local without local endpoints.
	a := NewApplied()
	c.renderFull(t, exampleOptions(model.IPv4)).Commit(a)
	if internal, external := a.NoLocal(); internal != 0 || external != 1 {
		t.Errorf("NoLocal() = %d internal, %d external; want 0, 1", internal, external)
	}
}

// TestPacketFlowHairpin: a pod reaching its own service is masqueraded
// exactly when it is sent to itself.
func TestPacketFlowHairpin(t *testing.T) {
	c := loadExample(t, example.NodeA)
	rs := c.ruleset(t, exampleOptions)
	for _, tc := range []struct {
		name string
		src  string
		dst  string
	}{
		{"web-clusterip", "198.18.129.10", "198.19.0.10:80"},
		{"web-nodeport clusterIP", "198.18.129.10", "198.19.0.11:80"},
		{"dual-stack IPv6", "fd00:18:1:a::50", "[fd00:19::17]:80"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := rs.Trace(packetFlowTest{src: tc.src, iif: podIIF, dst: tc.dst}.packet(t), hostA)
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Outcomes) != 2 {
				t.Fatalf("want one outcome per endpoint, got:\n%s", res)
			}
			self := 0
			for _, o := range res.Outcomes {
				if o.Verdict != trace.VerdictAccept || o.DNAT == nil {
					t.Fatalf("want DNAT, got %s", o.Summary())
				}
				toSelf := o.DNAT.Addr() == netip.MustParseAddr(tc.src)
				if toSelf {
					self++
				}
				if o.Masquerade != toSelf {
					t.Errorf("dnat to %s: masquerade=%v, want %v", o.DNAT, o.Masquerade, toSelf)
				}
			}
			if self != 1 {
				t.Errorf("%d outcomes go back to the source, want 1:\n%s", self, res)
			}
		})
	}
}

// TestPacketFlowAffinity: once the affinity set has remembered a client,
// its next connection goes to the same endpoint; other clients still get
// every endpoint.
func TestPacketFlowAffinity(t *testing.T) {
	c := loadExample(t, example.NodeA)
	rs := c.ruleset(t, exampleOptions)
	first := packetFlowTest{src: localPod, iif: podIIF, dst: "198.19.0.16:80"}
	for i := range 2 {
		// Each endpoint in turn is the one remembered.
		rs := parse(t, rs.String())
		res, err := rs.Trace(first.packet(t), hostA)
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Outcomes) != 2 {
			t.Fatalf("first connection: want 2 outcomes, got:\n%s", res)
		}
		chosen := res.Outcomes[i]
		if len(chosen.AffinityUpdates) != 1 {
			t.Fatalf("want one affinity update, got %v", chosen.AffinityUpdates)
		}
		if err := rs.Remember(chosen); err != nil {
			t.Fatal(err)
		}
		// Two more connections from the same client (other source
		// ports) both stick.
		for port := uint16(40001); port <= 40002; port++ {
			p := first.packet(t)
			p.SrcPort = port
			res, err := rs.Trace(p, hostA)
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Outcomes) != 1 || res.Outcomes[0].DNAT == nil || *res.Outcomes[0].DNAT != *chosen.DNAT {
				t.Errorf("next connection: want only %s, got:\n%s", chosen.DNAT, res)
			}
		}
		other := first
		other.src = "198.18.129.6"
		res, err = rs.Trace(other.packet(t), hostA)
		if err != nil {
			t.Fatal(err)
		}
		if out, _, _ := flowSummary(res); out != affinityEps {
			t.Errorf("another client: got %q, want %q", out, affinityEps)
		}
	}
}

// TestPacketFlowMasqueradeAll: every ClusterIP connection is masqueraded,
// pods included; external traffic with policy Local still keeps its source.
func TestPacketFlowMasqueradeAll(t *testing.T) {
	c := loadExample(t, example.NodeA)
	rs := c.ruleset(t, func(f v1.IPFamily) Options {
		o := exampleOptions(f)
		o.MasqueradeAll = true
		return o
	})
	runPacketFlowTests(t, rs, hostA, []packetFlowTest{
		{name: "clusterIP from local pod", src: localPod, iif: podIIF, dst: "198.19.0.10:80", output: webEps, masq: true},
		{name: "clusterIP from pod on other node", src: remotePod, iif: lanIIF, dst: "198.19.0.10:80", output: webEps, masq: true},
		{name: "clusterIP from outside", src: outside, iif: lanIIF, dst: "198.19.0.10:80", output: webEps, masq: true},
		{name: "ITP Local from local pod", src: localPod, iif: podIIF, dst: "198.19.0.15:80", output: itpLocalEp, masq: true},
		{name: "IPv6 clusterIP from local pod", src: localPod6, iif: podIIF, dst: "[fd00:19::17]:80", output: dualEps6, masq: true},
		{name: "ETP Local LB VIP from outside", src: outside, iif: lanIIF, dst: "198.19.200.3:80", output: etpLocalEp},
		{name: "ETP Local LB VIP from local pod", src: localPod, iif: podIIF, dst: "198.19.200.3:80", output: etpEps},
	})
}

// TestPacketFlowDetectLocal: each detectLocalMode decides which ClusterIP
// traffic counts as coming from a pod (not masqueraded) and which pod
// traffic to an externalTrafficPolicy Local service is short-circuited.
func TestPacketFlowDetectLocal(t *testing.T) {
	c := loadExample(t, example.NodeA)
	for _, tc := range []struct {
		name  string
		tweak func(*Options)
		tests []packetFlowTest
	}{{
		name:  "NodeCIDR",
		tweak: func(o *Options) { o.DetectLocalMode = DetectNodeCIDR },
		tests: []packetFlowTest{
			{name: "clusterIP from local pod", src: localPod, iif: podIIF, dst: "198.19.0.10:80", output: webEps},
			{name: "clusterIP from pod on other node", src: remotePod, iif: lanIIF, dst: "198.19.0.10:80", output: webEps, masq: true},
			{name: "clusterIP from outside", src: outside, iif: lanIIF, dst: "198.19.0.10:80", output: webEps, masq: true},
			{name: "IPv6 clusterIP from local pod", src: localPod6, iif: podIIF, dst: "[fd00:19::17]:80", output: dualEps6},
			{name: "IPv6 clusterIP from pod on other node", src: "fd00:18:1:b::5", iif: lanIIF, dst: "[fd00:19::17]:80", output: dualEps6, masq: true},
			{name: "ETP Local VIP from local pod", src: localPod, iif: podIIF, dst: "198.19.200.3:80", output: etpEps},
			{name: "ETP Local VIP from pod on other node", src: remotePod, iif: lanIIF, dst: "198.19.200.3:80", output: etpLocalEp},
		},
	}, {
		name: "BridgeInterface",
		tweak: func(o *Options) {
			o.DetectLocalMode = DetectBridgeInterface
			o.BridgeInterface = bridgeIIF
		},
		tests: []packetFlowTest{
			{name: "clusterIP from local pod on the bridge", src: localPod, iif: bridgeIIF, dst: "198.19.0.10:80", output: webEps},
			{name: "clusterIP from local pod on a veth", src: localPod, iif: podIIF, dst: "198.19.0.10:80", output: webEps, masq: true},
			{name: "clusterIP from pod on other node", src: remotePod, iif: lanIIF, dst: "198.19.0.10:80", output: webEps, masq: true},
			{name: "clusterIP from this node", src: thisNode, dst: "198.19.0.10:80", output: webEps, masq: true},
			{name: "IPv6 clusterIP from local pod", src: localPod6, iif: bridgeIIF, dst: "[fd00:19::17]:80", output: dualEps6},
			{name: "ETP Local VIP from local pod", src: localPod, iif: bridgeIIF, dst: "198.19.200.3:80", output: etpEps},
			{name: "ETP Local VIP from pod on other node", src: remotePod, iif: lanIIF, dst: "198.19.200.3:80", output: etpLocalEp},
		},
	}, {
		name: "InterfaceNamePrefix",
		tweak: func(o *Options) {
			o.DetectLocalMode = DetectInterfaceNamePrefix
			o.InterfaceNamePrefix = "veth"
		},
		tests: []packetFlowTest{
			{name: "clusterIP from local pod", src: localPod, iif: podIIF, dst: "198.19.0.10:80", output: webEps},
			{name: "clusterIP from pod on other node", src: remotePod, iif: lanIIF, dst: "198.19.0.10:80", output: webEps, masq: true},
			{name: "clusterIP from this node", src: thisNode, dst: "198.19.0.10:80", output: webEps, masq: true},
			{name: "clusterIP from outside", src: outside, iif: lanIIF, dst: "198.19.0.10:80", output: webEps, masq: true},
			{name: "ETP Local VIP from local pod", src: localPod, iif: podIIF, dst: "198.19.200.3:80", output: etpEps},
			{name: "ETP Local VIP from pod on other node", src: remotePod, iif: lanIIF, dst: "198.19.200.3:80", output: etpLocalEp},
		},
	}, {
		// ClusterCIDR mode without a cluster CIDR cannot tell pods
		// apart: no masquerade for ClusterIPs, no short-circuit, as
		// upstream's no-op detector.
		name:  "ClusterCIDR without CIDRs",
		tweak: func(o *Options) { o.ClusterCIDRs = nil },
		tests: []packetFlowTest{
			{name: "clusterIP from outside", src: outside, iif: lanIIF, dst: "198.19.0.10:80", output: webEps},
			{name: "nodePort still masqueraded", src: outside, iif: lanIIF, dst: "198.18.0.10:30080", output: webEps, masq: true},
			{name: "ETP Local VIP from local pod", src: localPod, iif: podIIF, dst: "198.19.200.3:80", output: etpLocalEp},
			{name: "ETP Local VIP from this node", src: thisNode, dst: "198.19.200.3:80", output: etpEps, masq: true},
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			rs := c.ruleset(t, func(f v1.IPFamily) Options {
				o := exampleOptions(f)
				tc.tweak(&o)
				return o
			})
			runPacketFlowTests(t, rs, hostA, tc.tests)
		})
	}
}

// TestPacketFlowServiceCIDRs: with the service CIDRs known, traffic to an
// unallocated cluster IP is dropped; undefined ports of allocated ones are
// still rejected.
func TestPacketFlowServiceCIDRs(t *testing.T) {
	c := loadExample(t, example.NodeA)
	rs := c.ruleset(t, func(f v1.IPFamily) Options {
		o := exampleOptions(f)
		for _, s := range example.ServiceCIDRs {
			if p := netip.MustParsePrefix(s); model.FamilyOf(p.Addr()) == f {
				o.ServiceCIDRs = append(o.ServiceCIDRs, p)
			}
		}
		return o
	})
	runPacketFlowTests(t, rs, hostA, []packetFlowTest{
		{name: "unallocated from pod", src: localPod, iif: podIIF, dst: "198.19.0.99:80", output: "DROP"},
		{name: "unallocated from this node", src: thisNode, dst: "198.19.0.99:80", output: "DROP"},
		{name: "unallocated IPv6", src: localPod6, iif: podIIF, dst: "[fd00:19::99]:80", output: "DROP"},
		{name: "undefined port still rejected", src: localPod, iif: podIIF, dst: "198.19.0.10:81", output: "REJECT"},
		{name: "allocated still served", src: localPod, iif: podIIF, dst: "198.19.0.10:80", output: webEps},
		{name: "outside the service CIDR", src: localPod, iif: podIIF, dst: "198.20.0.1:80", output: "ACCEPT"},
	})
}

// TestPacketFlowNodePortAddresses: which addresses accept NodePorts.
func TestPacketFlowNodePortAddresses(t *testing.T) {
	c := loadExample(t, example.NodeA)
	extra := netip.MustParseAddr("192.168.122.1") // a second local address (a bridge)
	host := trace.Host{LocalAddrs: append([]netip.Addr{extra}, hostA.LocalAddrs...)}
	local := []netip.Addr{nodeAIPv4, extra, nodeAIPv6, netip.MustParseAddr("127.0.0.1")}
	for _, tc := range []struct {
		name      string
		addresses []string
		tests     []packetFlowTest
	}{{
		name: "default: primary IPs",
		tests: []packetFlowTest{
			{name: "node IP", src: outside, iif: lanIIF, dst: "198.18.0.10:30080", output: webEps, masq: true},
			{name: "second local address", src: outside, iif: lanIIF, dst: "192.168.122.1:30080", output: "ACCEPT"},
		},
	}, {
		name:      "CIDR",
		addresses: []string{"192.168.122.0/24"},
		tests: []packetFlowTest{
			{name: "node IP not in the CIDR", src: outside, iif: lanIIF, dst: "198.18.0.10:30080", output: "ACCEPT"},
			{name: "local address in the CIDR", src: outside, iif: lanIIF, dst: "192.168.122.1:30080", output: webEps, masq: true},
		},
	}, {
		name:      "CIDR and primary",
		addresses: []string{"192.168.122.0/24", "primary"},
		tests: []packetFlowTest{
			{name: "node IP", src: outside, iif: lanIIF, dst: "198.18.0.10:30080", output: webEps, masq: true},
			{name: "local address in the CIDR", src: outside, iif: lanIIF, dst: "192.168.122.1:30080", output: webEps, masq: true},
		},
	}, {
		name:      "all local addresses",
		addresses: []string{"0.0.0.0/0", "::/0"},
		tests: []packetFlowTest{
			{name: "node IP", src: outside, iif: lanIIF, dst: "198.18.0.10:30080", output: webEps, masq: true},
			{name: "second local address", src: outside, iif: lanIIF, dst: "192.168.122.1:30080", output: webEps, masq: true},
			{name: "never localhost", src: "127.0.0.1", dst: "127.0.0.1:30080", output: "ACCEPT"},
			{name: "not a remote address", src: outside, iif: lanIIF, dst: "198.18.0.11:30080", output: "ACCEPT"},
			{name: "no endpoints on any local address", src: outside, iif: lanIIF, dst: "192.168.122.1:30099", output: "ACCEPT"},
		},
	}, {
		// The keyword (issue 13: it left nodeport-ips empty).
		name:      "all keyword",
		addresses: []string{"all"},
		tests: []packetFlowTest{
			{name: "node IP", src: outside, iif: lanIIF, dst: "198.18.0.10:30080", output: webEps, masq: true},
			{name: "second local address", src: outside, iif: lanIIF, dst: "192.168.122.1:30080", output: webEps, masq: true},
			{name: "never localhost", src: "127.0.0.1", dst: "127.0.0.1:30080", output: "ACCEPT"},
		},
	}, {
		// Loopback only, which nftables mode never serves: no NodePorts.
		name:      "localhost keyword",
		addresses: []string{"localhost"},
		tests: []packetFlowTest{
			{name: "node IP", src: outside, iif: lanIIF, dst: "198.18.0.10:30080", output: "ACCEPT"},
			{name: "localhost", src: "127.0.0.1", dst: "127.0.0.1:30080", output: "ACCEPT"},
		},
	}, {
		name:      "all keyword among CIDRs",
		addresses: []string{"198.18.0.0/24", "all"},
		tests: []packetFlowTest{
			{name: "second local address", src: outside, iif: lanIIF, dst: "192.168.122.1:30080", output: webEps, masq: true},
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			var text string
			for _, f := range []v1.IPFamily{model.IPv4, model.IPv6} {
				o := exampleOptions(f)
				o.NodePortAddresses = tc.addresses
				cfg := o.RenderConfig(c.node, local)
				text += Render(cfg, c.input(f), NewApplied()).Tx.String()
			}
			runPacketFlowTests(t, parse(t, text), host, tc.tests)
		})
	}
}

// TestPacketFlowNodePortsNeverOnLoopback: with nodePortAddresses matching
// every local address, the loopback address of either family still does
// not take NodePorts (upstream excludes 127.0.0.0/8 and ::1): a packet
// DNATed away from a loopback source could never be routed back.
func TestPacketFlowNodePortsNeverOnLoopback(t *testing.T) {
	node := &model.Node{Name: example.NodeA, Addresses: []netip.Addr{nodeAIPv4, nodeAIPv6}}
	var text string
	for _, tc := range []struct {
		family v1.IPFamily
		sp     *model.ServicePort
		ep     *model.Endpoint
	}{
		{model.IPv4, makeSP("np4", "198.19.1.1", 80, func(sp *model.ServicePort) { sp.Type, sp.NodePort = v1.ServiceTypeNodePort, 30090 }),
			makeEP("198.18.130.90", 8080, false, nil)},
		{model.IPv6, makeSP("np6", "fd00:19::1:1", 80, func(sp *model.ServicePort) { sp.Type, sp.NodePort = v1.ServiceTypeNodePort, 30090 }),
			makeEP("fd00:18:1:b::90", 8080, false, nil)},
	} {
		st := model.NewState(tc.family)
		st.Services[tc.sp.Name] = tc.sp
		st.Endpoints[tc.sp.Name] = []*model.Endpoint{tc.ep}
		o := exampleOptions(tc.family)
		o.NodePortAddresses = []string{"0.0.0.0/0", "::/0"}
		in := &Input{State: st, NodeName: example.NodeA, Full: true}
		text += Render(o.RenderConfig(node, node.Addresses), in, NewApplied()).Tx.String()
	}
	runPacketFlowTests(t, parse(t, text), hostA, []packetFlowTest{
		{name: "IPv4 node IP", src: outside, iif: lanIIF, dst: "198.18.0.10:30090", output: "198.18.130.90:8080", masq: true},
		{name: "IPv4 loopback", src: "127.0.0.1", dst: "127.0.0.1:30090", output: "ACCEPT"},
		{name: "IPv6 node IP", src: outside6, iif: lanIIF, dst: "[fd00:18::10]:30090", output: "[fd00:18:1:b::90]:8080", masq: true},
		{name: "IPv6 loopback", src: "::1", dst: "[::1]:30090", output: "ACCEPT"},
	})
}
