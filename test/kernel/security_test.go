package kernel

// Security, with real traffic. Addresses are the
// example's (cluster_test.go): node-a 198.18.0.10 / fd00:18::10, the
// client 198.18.0.100 and 203.0.113.100 (clientAlt), tester-a
// 198.18.129.200, lb-ranges' load balancer IP 198.19.200.1:443 (endpoints
// web-a, web-b), etp-local's health check node port 32081.
//
// Covered elsewhere: TestLocalhostGuard (CVE-2020-8558, iptables mode's
// guard rule, proven by removing it), TestNodePortAddresses (node ports
// only on nodePortAddresses), TestHostileNames (object fields never reach
// a rule, comment or command line unescaped).

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/testutil/netns"
)

// TestServerListeners: with upstream's defaults (metrics on
// 127.0.0.1:10249, healthz on 0.0.0.0:10256) and profiling on, metrics,
// /configz and pprof answer on the node's loopback only and are refused
// from another host; healthz answers from outside. Health check node ports
// listen on nodePortAddresses only: nftables mode's default (the primary
// IPs), so not on the node's loopback; iptables mode's default is every
// address. The listening sockets are read in the node's namespace (ss).
func TestServerListeners(t *testing.T) { forEachMode(t, testServerListeners) }

func testServerListeners(t *testing.T, m proxyMode) {
	c := newCluster(t, clusterOptions{mode: m, kproxyOn: []string{nodeA},
		args: []string{"--healthz-bind-address", "0.0.0.0:10256", "--metrics-bind-address", "127.0.0.1:10249", "--profiling"}})
	node := c.Nodes[nodeA]
	nodeIP := node.Addr(clientIP)
	// The health check port opens after the first sync.
	netns.Eventually(t, syncTimeout, "etp-local's health check listening", func() (bool, string) {
		out, _ := node.Exec(5*time.Second, "ss", "-Hltn")
		return strings.Contains(out, ":32081"), out
	})
	out, err := node.Exec(5*time.Second, "ss", "-Hltn")
	if err != nil {
		t.Fatal(err)
	}
	listen := map[string][]string{} // port -> local addresses
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) < 4 {
			continue
		}
		i := strings.LastIndex(f[3], ":")
		listen[f[3][i+1:]] = append(listen[f[3][i+1:]], f[3][:i])
	}
	want := map[string][]string{
		"10249": {"127.0.0.1"},
		"10256": {"0.0.0.0", "*"},
		"32081": {nodeIP.String(), "[fd00:18::10]"},
	}
	if m.iptables {
		want["32081"] = []string{"*", "[::]", "0.0.0.0"}
	}
	for port, addrs := range listen {
		w, ok := want[port]
		if !ok {
			t.Errorf("kproxy's node listens on unexpected port %s (%v):\n%s", port, addrs, out)
			continue
		}
		for _, a := range addrs {
			if !contains(w, a) {
				t.Errorf("port %s listens on %s; want only %v", port, a, w)
			}
		}
	}
	t.Logf("listening sockets in node-a:\n%s", out)

	type check struct {
		from *netns.NS
		url  string
		code int // 0: the connection must be refused
	}
	nodeURL := func(port int, path string) string {
		return "http://" + netip.AddrPortFrom(nodeIP, uint16(port)).String() + path
	}
	checks := []check{
		{node.NS, "http://127.0.0.1:10249/metrics", 200},
		{node.NS, "http://127.0.0.1:10249/configz", 200},
		{node.NS, "http://127.0.0.1:10249/debug/pprof/", 200},
		{c.Client, nodeURL(10249, "/metrics"), 0},
		{c.Client, nodeURL(10249, "/configz"), 0},
		{c.Client, nodeURL(10249, "/debug/pprof/"), 0},
		{c.Pod(t, testerA).NS, "http://198.18.129.1:10249/configz", 0},
		{c.Client, nodeURL(10256, "/healthz"), 200},
		{c.Client, nodeURL(32081, "/"), 200},
	}
	if m.iptables {
		checks = append(checks, check{node.NS, "http://127.0.0.1:32081/", 200})
	} else {
		checks = append(checks, check{node.NS, "http://127.0.0.1:32081/", 0})
	}
	for _, ck := range checks {
		code, body, err := ck.from.HTTPGet(ck.url, 2*time.Second)
		switch {
		case ck.code == 0 && (err == nil || netns.Classify(err) != netns.Refused):
			t.Errorf("%s from %s: %d %v; want the connection refused", ck.url, ck.from.Role, code, err)
		case ck.code != 0 && (err != nil || code != ck.code):
			t.Errorf("%s from %s: %d %v %.200s; want %d", ck.url, ck.from.Role, code, err, body, ck.code)
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// TestLoadBalancerSourceRangesEveryPath: lb-ranges' loadBalancerSourceRanges
// apply to every path into its load balancer IP, not only to traffic from
// outside (TestLoadBalancerSourceRanges): a pod on the node, the node
// itself and an endpoint of the service (hairpin) are dropped unless their
// source is in a range, as upstream does.
func TestLoadBalancerSourceRangesEveryPath(t *testing.T) {
	forEachMode(t, testLoadBalancerSourceRangesEveryPath)
}

func testLoadBalancerSourceRangesEveryPath(t *testing.T, m proxyMode) {
	snap := exampleSnapshot(t)
	c := newCluster(t, clusterOptions{mode: m, snapshot: snap, kproxyOn: []string{nodeA}})
	const vip = "198.19.200.1:443"
	type path struct {
		name   string
		from   string
		source netip.Addr
	}
	paths := []path{
		{"outside, allowed address", client, clientAlt},
		{"outside, node LAN address", client, netip.Addr{}},
		{"pod on the node", testerA, netip.Addr{}},
		{"the node itself", nodeA, netip.Addr{}},
		{"hairpin from an endpoint", webA, netip.Addr{}},
	}
	for _, tc := range []struct {
		ranges []string
		open   map[string]bool
	}{
		{[]string{"203.0.113.0/24"}, map[string]bool{"outside, allowed address": true}},
		{[]string{"198.18.128.0/17"}, map[string]bool{"pod on the node": true, "hairpin from an endpoint": true}},
	} {
		snap.editService(t, "lb-ranges", func(s *v1.Service) { s.Spec.LoadBalancerSourceRanges = tc.ranges })
		c.apply(snap)
		// Applied once the first path this case closes is dropped.
		closed := paths[1]
		if tc.ranges[0] != "203.0.113.0/24" {
			closed = paths[0]
		}
		netns.Eventually(t, syncTimeout, "lb-ranges with "+tc.ranges[0], func() (bool, string) {
			r := c.ns(closed.from).Request("tcp", ap(vip), netns.DialOptions{Source: closed.source, Timeout: 300 * time.Millisecond})
			return r.Outcome == netns.Timeout, r.String()
		})
		for _, p := range paths {
			t.Run(fmt.Sprintf("%s from %s", tc.ranges[0], p.name), func(t *testing.T) {
				pr := probe{from: p.from, source: p.source, network: "tcp", dst: vip}
				if tc.open[p.name] {
					pr.servers, pr.n = web, 3
				} else {
					pr.outcome = netns.Timeout
				}
				c.run(t, pr)
			})
		}
	}
}
