package kernel

// Traffic to the example's services, read-only: each test builds its own
// cluster with kproxy on both nodes and checks a table of probes. Services
// and pods are the example's (see cluster_test.go for the address plan).

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kproxy/kproxy/internal/testutil/netns"
)

// runProbes runs each probe as a subtest. A probe of what iptables mode
// does not do (nftOnly: upstream's iptables mode does not reject undefined
// ports of a ClusterIP) is no subtest at all in the iptables modes, so that
// a full run skips nothing by design.
func runProbes(t *testing.T, c *kcluster, probes []probe) {
	t.Helper()
	for _, p := range probes {
		if p.nftOnly && c.mode.iptables && !c.mode.ipvs {
			continue
		}
		p = p.forMode(c.mode)
		t.Run(p.String(), func(t *testing.T) { c.run(t, p) })
	}
}

var (
	web  = []string{webA, webB}
	dns  = []string{dnsA, dnsB}
	dual = []string{dualA, dualB}
)

// quick bounds a reject: an ICMP error or RST comes back at once, well
// before TCP would retransmit a SYN (1 s).
const quick = 900 * time.Millisecond

// quickTCP6 bounds a reject of a TCP connection over IPv6. The ICMPv6 port
// unreachable comes back at once (tcpdump in the client's namespace shows
// it microseconds after the SYN), but between namespaces the whole round
// trip happens inside the connect() call, while it holds the socket, and
// tcp_v6_err keeps an error for a SYN_SENT socket owned by the user as a
// soft one: connect() fails only when the retransmitted SYN, 1 s later, is
// rejected again. IPv4 and UDP
// see the refusal at once. A drop would still time out (3 s).
const quickTCP6 = 1500 * time.Millisecond

func TestClusterIP(t *testing.T) { forEachMode(t, testClusterIP) }

func testClusterIP(t *testing.T, m proxyMode) {
	c := newCluster(t, clusterOptions{mode: m})
	runProbes(t, c, []probe{
		// web-clusterip 198.19.0.10:80 -> web pods :8080 on both nodes.
		// From pods the source is kept; from the node itself and from
		// outside the cluster CIDR it is masqueraded.
		{from: testerA, network: "tcp", dst: "198.19.0.10:80", servers: web, every: true, peer: peerOwn},
		{from: testerB, network: "tcp", dst: "198.19.0.10:80", servers: web, every: true, peer: peerOwn},
		{from: nodeA, network: "tcp", dst: "198.19.0.10:80", servers: web, every: true, peer: peerMasq, masqBy: nodeA},
		{from: nodeB, network: "tcp", dst: "198.19.0.10:80", servers: web, every: true, peer: peerMasq, masqBy: nodeB},
		{from: client, network: "tcp", dst: "198.19.0.10:80", servers: web, every: true, peer: peerMasq, masqBy: nodeA},

		// dns-udp 198.19.0.18: 53/UDP and 53/TCP.
		{from: testerA, network: "udp", dst: "198.19.0.18:53", servers: dns, every: true, peer: peerOwn},
		{from: testerB, network: "udp", dst: "198.19.0.18:53", servers: dns, every: true, peer: peerOwn},
		{from: nodeA, network: "udp", dst: "198.19.0.18:53", servers: dns, every: true, peer: peerMasq, masqBy: nodeA},
		{from: client, network: "udp", dst: "198.19.0.18:53", servers: dns, every: true, peer: peerMasq, masqBy: nodeA},
		{from: testerA, network: "tcp", dst: "198.19.0.18:53", servers: dns, every: true, peer: peerOwn},
		{from: client, network: "tcp", dst: "198.19.0.18:53", servers: dns, every: true, peer: peerMasq, masqBy: nodeA},

		// dual-stack: 198.19.0.17 and fd00:19::17, port 80.
		{from: testerA, network: "tcp", dst: "198.19.0.17:80", servers: dual, every: true, peer: peerOwn},
		{from: testerA, network: "tcp", dst: "[fd00:19::17]:80", servers: dual, every: true, peer: peerOwn},
		{from: testerB, network: "tcp", dst: "[fd00:19::17]:80", servers: dual, every: true, peer: peerOwn},
		{from: nodeA, network: "tcp", dst: "[fd00:19::17]:80", servers: dual, every: true, peer: peerMasq, masqBy: nodeA},
		{from: client, network: "tcp", dst: "[fd00:19::17]:80", servers: dual, every: true, peer: peerMasq, masqBy: nodeA},
		// ext-ip's cluster IPs, both families.
		{from: testerB, network: "tcp", dst: "198.19.0.13:8080", servers: web, every: true, peer: peerOwn},
		{from: testerB, network: "tcp", dst: "[fd00:19::13]:8080", servers: web, every: true, peer: peerOwn},

		// A port the ClusterIP does not define is rejected, from a pod
		// (forward), from the node (output) and from outside.
		{from: testerA, network: "tcp", dst: "198.19.0.10:81", outcome: netns.Refused, within: quick, nftOnly: true},
		{from: nodeA, network: "tcp", dst: "198.19.0.10:81", outcome: netns.Refused, within: quick, nftOnly: true},
		{from: client, network: "tcp", dst: "198.19.0.10:81", outcome: netns.Refused, within: quick, nftOnly: true},
		{from: testerA, network: "udp", dst: "198.19.0.10:81", outcome: netns.Refused, within: quick, nftOnly: true},
		{from: testerA, network: "tcp", dst: "[fd00:19::17]:81", outcome: netns.Refused, within: quickTCP6, nftOnly: true},
		{from: testerA, network: "udp", dst: "[fd00:19::17]:81", outcome: netns.Refused, within: quick, nftOnly: true},
		{from: client, network: "udp", dst: "[fd00:19::13]:81", outcome: netns.Refused, within: quick, nftOnly: true},

		// no-endpoints 198.19.0.20:80: rejected at once, not dropped.
		{from: testerA, network: "tcp", dst: "198.19.0.20:80", outcome: netns.Refused, within: quick},
		{from: testerB, network: "tcp", dst: "198.19.0.20:80", outcome: netns.Refused, within: quick},
		{from: nodeA, network: "tcp", dst: "198.19.0.20:80", outcome: netns.Refused, within: quick},
		{from: client, network: "tcp", dst: "198.19.0.20:80", outcome: netns.Refused, within: quick},

		// terminating-only 198.19.0.21: no ready endpoint, so the serving
		// terminating ones take the traffic.
		{from: testerA, network: "tcp", dst: "198.19.0.21:80", servers: []string{drainingA, drainingB}, every: true, peer: peerOwn},

		// topology 198.19.0.22: zone hints; each node only uses the
		// endpoints hinted for its zone.
		{from: testerA, network: "tcp", dst: "198.19.0.22:80", servers: []string{topoA1, topoA2}, every: true, peer: peerOwn},
		{from: testerB, network: "tcp", dst: "198.19.0.22:80", servers: []string{topoB1, topoB2}, every: true, peer: peerOwn},

		// itp-local 198.19.0.15: internalTrafficPolicy Local, its only
		// endpoint is on node-a. node-b has no local endpoint: dropped.
		// ipvs mode: refused (upstream's virtual server there has no
		// real server, and IPVS answers that with ICMP port unreachable).
		{from: testerA, network: "tcp", dst: "198.19.0.15:80", n: 5, servers: []string{logger}, peer: peerOwn},
		{from: nodeA, network: "tcp", dst: "198.19.0.15:80", n: 5, servers: []string{logger}, peer: peerMasq, masqBy: nodeA},
		{from: testerB, network: "tcp", dst: "198.19.0.15:80", outcome: netns.Timeout,
			ipvs: &probe{outcome: netns.Refused, within: quick}},

		// affinity 198.19.0.16: sessionAffinity ClientIP, so all
		// connections of one client reach one pod.
		{from: client, network: "tcp", dst: "198.19.0.16:80", n: 10, servers: []string{sessionA, sessionB}, same: true, peer: peerMasq, masqBy: nodeA},
		{from: testerA, network: "tcp", dst: "198.19.0.16:80", n: 10, servers: []string{sessionA, sessionB}, same: true, peer: peerOwn},
		{from: testerB, network: "tcp", dst: "198.19.0.16:80", n: 10, servers: []string{sessionA, sessionB}, same: true, peer: peerOwn},

		// other-proxy 198.19.0.23 is left to another proxy and headless
		// has no IP: nothing captures 198.19.0.23, so it leaves the node
		// by its default route and dies (the client forwards nothing).
		{from: testerA, network: "tcp", dst: "198.19.0.23:80", outcome: netns.Timeout},
	})
}

// TestHairpin: a pod that reaches its own service and lands on itself must
// see a masqueraded source, not its own address (it would answer itself
// directly, bypassing the reverse NAT).
func TestHairpin(t *testing.T) { forEachMode(t, testHairpin) }

func testHairpin(t *testing.T, m proxyMode) {
	c := newCluster(t, clusterOptions{mode: m})
	for _, tc := range []struct {
		pod, dst, network string
		// gateway is the pod's node's cbr0 address of the family of dst:
		// where the node masquerades hairpin traffic to.
		gateway string
	}{
		{webA, "198.19.0.10:80", "tcp", "198.18.129.1"},
		{webB, "198.19.0.10:80", "tcp", "198.18.130.1"},
		{dualA, "[fd00:19::17]:80", "tcp", "fd00:18:1:a::1"},
		{dnsB, "198.19.0.18:53", "udp", "198.18.130.1"},
	} {
		t.Run(tc.pod+" "+tc.network+" "+tc.dst, func(t *testing.T) {
			p := c.Pod(t, tc.pod)
			hit := false
			// Two endpoints, random choice: 40 tries miss the pod itself
			// with probability 2^-40.
			for i := 0; i < 40 && !hit; i++ {
				r := p.Request(tc.network, ap(tc.dst), netns.DialOptions{})
				if r.Outcome != netns.Answered {
					t.Fatalf("request %d: %v", i+1, r)
				}
				if r.Server != tc.pod {
					if r.Peer.Addr() != r.Local.Addr() {
						t.Errorf("to another pod: %v; want the source kept (%s)", r, r.Local.Addr())
					}
					continue
				}
				hit = true
				if r.Peer.Addr() == r.Local.Addr() {
					t.Errorf("hairpin: %v; the pod saw its own address, want it masqueraded", r)
				}
				if r.Peer.Addr() != ip(tc.gateway) {
					t.Errorf("hairpin: %v; want it masqueraded to the node's bridge address %s", r, tc.gateway)
				}
			}
			if !hit {
				t.Fatalf("40 requests never reached %s itself", tc.pod)
			}
		})
	}
}

// TestTraceLive: `kproxy trace --live` on a node reads the rules kproxy
// programmed there and tells where a packet goes, as real traffic does.
func TestTraceLive(t *testing.T) { forEachMode(t, testTraceLive) }

// testTraceLive: kproxy trace --live reads the node's rules; without
// --proxy-mode it finds out which mode's rules are there (with
// IPTABLES_MODE for the backend, as kproxy itself). It names the Service
// port a packet is for: iptables mode in its rules' comments
// ("demo/web-clusterip:http cluster IP"), nftables mode after each step
// taken for it, from the comment of the element that dispatched it
// ("(service demo/web-clusterip:http/TCP)"), even in the chain plain
// ClusterIPs share.
func testTraceLive(t *testing.T, m proxyMode) {
	c := newCluster(t, clusterOptions{mode: m})
	node := c.Node(t, nodeA)
	trace := append(append([]string{"env"}, m.env...), kproxyBin, "trace", "--live")
	name := func(svc string) string {
		if m.iptables {
			return svc
		}
		return "(service " + svc + "/TCP)"
	}
	out, err := node.Exec(30*time.Second, append(trace,
		"--src", "198.18.0.100", "--iif", "eth0", "--dst", "198.19.0.10:80")...)
	if err != nil {
		t.Fatalf("kproxy trace --live: %v\n%s", err, out)
	}
	for _, want := range []string{"dnat to 198.18.129.10:8080", "dnat to 198.18.130.10:8080", "masquerade", name("demo/web-clusterip:http")} {
		if !strings.Contains(out, want) {
			t.Errorf("trace lacks %q:\n%s", want, out)
		}
	}
	if !m.iptables && !regexp.MustCompile(`(?m)^ +cluster/tcp/2: .*dnat to 198\.18\.1(29|30)\.10:8080, accept \(service demo/web-clusterip:http/TCP\)$`).MatchString(out) {
		t.Errorf("trace: the DNAT in the shared chain does not name the service:\n%s", out)
	}
	out, err = node.Exec(30*time.Second, append(trace, "--src", "198.18.0.100", "--iif", "eth0", "--dst", "198.19.0.20:80")...)
	if err != nil || !strings.Contains(out, "reject") {
		t.Errorf("no-endpoints service: want a reject: %v\n%s", err, out)
	}
	if want := name("demo/no-endpoints:http"); !strings.Contains(out, want) {
		t.Errorf("no-endpoints service: trace lacks %q:\n%s", want, out)
	}
}
