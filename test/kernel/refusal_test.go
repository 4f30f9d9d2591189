package kernel

// Address plan (see cluster_test.go): 198.18.0.0/16 nodes and pods,
// 198.19.0.0/16 service IPs, fd00::/8 IPv6; web-new is 198.19.0.30.

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/kproxy/kproxy/internal/testutil/netns"
)

// refusedMarker is what the injected fault looks for: kproxy's rules for
// the Service demo/web-new mention it (comments, chain names), so the
// kernel (nftables) or iptables-restore refuses every operation of it.
const refusedMarker = "demo/web-new"

// TestKernelRefusesOneService: the kernel refuses the rules of one
// Service (fault injection in a kproxy built with the faultinject tag). On
// a fresh node and on a running one, every other service carries traffic,
// the refused one is named in the log and counted, and /healthz says the
// node is in order; a kernel that refuses everything turns /healthz 503
// while the rules already in place keep working.
func TestKernelRefusesOneService(t *testing.T) { forEachMode(t, testKernelRefusesOneService) }

func testKernelRefusesOneService(t *testing.T, m proxyMode) {
	if kproxyFaultBin == "" {
		t.Skip("kproxy with fault injection was not built (KPROXY_KERNEL_TEST_BIN is set)")
	}
	m.env = append(append([]string{}, m.env...), "KPROXY_FAULT_REFUSE="+refusedMarker)
	for _, tc := range nodeStates {
		t.Run(tc.name, func(t *testing.T) {
			snap := exampleSnapshot(t)
			if tc.atStart {
				snap.add(t, newWebService)
				snap.addList(t, newWebSlices)
			}
			c := newCluster(t, clusterOptions{mode: m, snapshot: snap, kproxyOn: []string{nodeA}, bin: kproxyFaultBin})
			if !tc.atStart {
				// The refused service comes with a healthy change in the
				// same sync.
				snap.add(t, newWebService)
				snap.addList(t, newWebSlices)
				snap.removeEndpoint(t, "web-nodeport", webB)
				c.apply(snap)
				webBIP := c.Pod(t, webB).IP(clientIP)
				c.waitRules(nodeA, "web-nodeport without web-b", func(d string) bool {
					return !c.mode.routesTo(d, "demo/web-nodeport/tcp/http", webBIP)
				})
			}
			node := c.Nodes[nodeA]
			netns.Eventually(t, syncTimeout, "the refused service port reported", func() (bool, string) {
				code, body, err := node.HTTPGet("http://127.0.0.1:10249/metrics", 2*time.Second)
				if err != nil || code != 200 {
					return false, "metrics unreachable"
				}
				return metricPositive(body, `kproxy_refused_service_ports{ip_family="IPv4"}`), "kproxy_refused_service_ports not set"
			})
			log := c.kproxy[nodeA].Log()
			if !strings.Contains(log, "The kernel refused this service port's rules") || !strings.Contains(log, "demo/web-new:http") {
				t.Fatalf("the refused service port is not named in the log:\n%s", c.kproxy[nodeA].Tail(40))
			}
			probes := []probe{
				{from: testerA, network: "tcp", dst: "198.19.0.10:80", servers: web, every: true, peer: peerOwn},
				{from: testerA, network: "udp", dst: "198.19.0.18:53", servers: dns, every: true, peer: peerOwn},
				{from: client, network: "tcp", dst: "[fd00:19::17]:80", servers: dual, every: true, peer: peerMasq, masqBy: nodeA},
			}
			if tc.atStart {
				probes = append(probes, probe{from: testerA, network: "tcp", dst: "198.19.0.11:80", servers: web, every: true, peer: peerOwn})
			} else {
				probes = append(probes, probe{from: testerA, network: "tcp", dst: "198.19.0.11:80", n: 5, servers: []string{webA}, peer: peerOwn})
			}
			runProbes(t, c, probes)
			// The refused service reaches no endpoint.
			if r := c.ns(testerA).Request("tcp", ap("198.19.0.30:80"), netns.DialOptions{Timeout: time.Second}); r.Outcome == netns.Answered {
				t.Fatalf("the refused service was served by %s", r.Server)
			}
			healthz := "http://" + netip.AddrPortFrom(node.Addr(clientIP), 10256).String() + "/healthz"
			if code, body, err := c.Client.HTTPGet(healthz, 2*time.Second); err != nil || code != 200 {
				t.Fatalf("/healthz with one service refused: %d %v %s; want 200 (every other rule is in place)", code, err, body)
			}

			// A kernel that refuses everything: the restarted kproxy
			// cannot sync; the rules in place keep serving, /healthz is
			// 503.
			m := c.mode
			m.env = append(append([]string{}, m.env[:len(m.env)-1]...), "KPROXY_FAULT_REFUSE=*")
			c.mode = m
			if err := c.kproxy[nodeA].Stop(); err != nil {
				t.Fatal(err)
			}
			if err := c.kproxy[nodeA].Restart(node.NS, c.kproxyArgs(nodeA)...); err != nil {
				t.Fatal(err)
			}
			netns.Eventually(t, syncTimeout, "/healthz 503 while no sync succeeds", func() (bool, string) {
				code, body, err := c.Client.HTTPGet(healthz, 2*time.Second)
				return err == nil && code == 503, body
			})
			runProbes(t, c, probes[:1])
		})
	}
}
