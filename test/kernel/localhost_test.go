package kernel

import (
	"strings"
	"testing"
	"time"

	"github.com/kproxy/kproxy/internal/kernel/xtables"
	"github.com/kproxy/kproxy/internal/testutil/netns"
)

// TestLocalhostGuard (iptables mode, CVE-2020-8558): localhost node ports
// need net.ipv4.conf.all.route_localnet=1, which would also let another
// host reach anything listening on the node's 127.0.0.0/8. kproxy's guard
// rule drops packets to 127.0.0.0/8 that come from outside and were not
// DNATed. The client plays the attacker: it routes 127.0.0.2 to node-a
// (after removing its own local 127.0.0.0/8 route, keeping 127.0.0.1, and allowing loopback
// addresses on the wire). A daemon listening on node-a's loopback must not
// answer it; with the guard rule removed by hand it does, which shows the
// probe can tell the difference.
func TestLocalhostGuard(t *testing.T) {
	t.Parallel()
	for _, b := range []xtables.Backend{xtables.Legacy, xtables.NFT} {
		m := iptablesMode(b)
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			for _, bin := range m.needs {
				netns.Require(t, bin)
			}
			testLocalhostGuard(t, m, b)
		})
	}
}

func testLocalhostGuard(t *testing.T, m proxyMode, b xtables.Backend) {
	c := newCluster(t, clusterOptions{mode: m, kproxyOn: []string{nodeA}})
	node := c.Nodes[nodeA]
	netns.ServeEcho(t, node.NS, "loopback-daemon", "tcp", 9999)

	if v, err := node.Exec(5*time.Second, "sysctl", "-n", "net.ipv4.conf.all.route_localnet"); err != nil || strings.TrimSpace(v) != "1" {
		t.Fatalf("route_localnet on node-a = %q (%v), want 1 (localhost node ports)", v, err)
	}
	nodeIP := node.Addr(clientIP).String()
	for _, argv := range [][]string{
		{"sysctl", "-w", "net.ipv4.conf.all.route_localnet=1"},
		{"sh", "-c", "for f in /proc/sys/net/ipv4/conf/*/route_localnet; do echo 1 > $f; done"},
		{"ip", "route", "del", "local", "127.0.0.0/8", "dev", "lo", "table", "local"},
		{"ip", "route", "add", "127.0.0.2/32", "via", nodeIP},
	} {
		if out, err := c.Client.Exec(5*time.Second, argv...); err != nil {
			t.Fatalf("client: %v: %v\n%s", argv, err, out)
		}
	}

	runProbes(t, c, []probe{
		// The node itself reaches its loopback daemon and its localhost
		// node port.
		{from: nodeA, network: "tcp", dst: "127.0.0.1:9999", n: 3, servers: []string{"loopback-daemon"}},
		{from: nodeA, network: "tcp", dst: "127.0.0.1:30080", servers: web, every: true, peer: peerMasq, masqBy: nodeA},
		// Another host does not reach the loopback daemon.
		{from: client, network: "tcp", dst: "127.0.0.2:9999", outcome: netns.Timeout},
	})
	// The localhost node port packets were counted in upstream's nfacct
	// counter, which /metrics reads; the INVALID drop's counter exists.
	code, body, err := node.HTTPGet("http://127.0.0.1:10249/metrics", 2*time.Second)
	if err != nil || code != 200 {
		t.Fatalf("metrics: %d %v", code, err)
	}
	if !metricPositive(body, "kubeproxy_iptables_localhost_nodeports_accepted_packets_total") {
		t.Errorf("kubeproxy_iptables_localhost_nodeports_accepted_packets_total is not positive after localhost node port traffic:\n%s", grepLines(body, "kubeproxy_iptables_"))
	}
	if !strings.Contains(body, "\nkubeproxy_iptables_ct_state_invalid_dropped_packets_total ") {
		t.Errorf("kubeproxy_iptables_ct_state_invalid_dropped_packets_total is not exported:\n%s", grepLines(body, "kubeproxy_iptables_"))
	}

	// Remove the guard by hand: now the client gets through.
	dump, err := node.Exec(10*time.Second, "iptables-"+string(b)+"-save", "-t", "filter")
	if err != nil {
		t.Fatal(err)
	}
	var guard []string
	for _, line := range strings.Split(dump, "\n") {
		f, err := xtables.Fields(line)
		if err == nil && len(f) > 2 && f[0] == "-A" && opt(f, "-d") == "127.0.0.0/8" && opt(f, "-j") == "DROP" {
			guard = f
		}
	}
	if guard == nil {
		t.Fatalf("no rule dropping traffic to 127.0.0.0/8 in the filter table:\n%s", dump)
	}
	del := append([]string{"iptables-" + string(b), "-t", "filter", "-D"}, guard[1:]...)
	if out, err := node.Exec(10*time.Second, del...); err != nil {
		t.Fatalf("%v: %v\n%s", del, err, out)
	}
	runProbes(t, c, []probe{
		{from: client, network: "tcp", dst: "127.0.0.2:9999", n: 3, servers: []string{"loopback-daemon"}},
	})
}
