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

// TestLocalhostNodePortFromAnotherHost (CVE-2020-8558, every mode): the
// client plays a remote attacker on node-a's link and sends TCP to
// 127.0.0.1:30080 (web-nodeport) through node-a: it routes 127.0.0.1/32 to
// node-a after removing 127.0.0.1 from its own lo, and accepts loopback
// addresses on the wire. node-a's kernel
// drops such packets as martians unless route_localnet is set; the test
// sets it where kproxy does not, so that the attack path is open and only
// the rules stand in the way. What must hold, as upstream v1.37:
//
//   - nftables mode never serves a NodePort on a loopback address (its
//     NodePort match excludes 127.0.0.0/8 and ::1) and does not set
//     route_localnet. With route_localnet set by someone else, the packet is
//     delivered to node-a's own 127.0.0.1:30080, where nothing listens: a
//     reset. A daemon on node-a's loopback is reachable then (upstream's
//     nftables mode has no guard either: it relies on route_localnet=0),
//     which shows the path is real. A foreign table DNATing
//     127.0.0.1:30080 to web-a, the vulnerable behaviour, makes the probe
//     see web-a: the test can fail.
//   - iptables mode with localhostNodePorts on (the default) sets
//     route_localnet and serves 127.0.0.1:30080 to the remote host: the
//     packet is DNATed, so the guard (KUBE-FIREWALL: drop to 127.0.0.0/8
//     from outside unless DNATed) lets it pass, as upstream's does. This is
//     the NodePort the host reaches on node-a's own address anyway. Nothing
//     else on loopback is reachable (TestLocalhostGuard).
//   - iptables mode with localhostNodePorts off leaves route_localnet alone
//     and, set by someone else, still does not serve 127.0.0.0/8 (the jump
//     to KUBE-NODEPORTS excludes it): a reset.
func TestLocalhostNodePortFromAnotherHost(t *testing.T) {
	t.Parallel()
	type variant struct {
		name      string
		mode      proxyMode
		args      []string
		localhost bool // kproxy serves node ports on 127.0.0.1
	}
	variants := []variant{{name: "nftables", mode: nftablesMode}}
	for _, b := range []xtables.Backend{xtables.Legacy, xtables.NFT} {
		m := iptablesMode(b)
		variants = append(variants,
			variant{name: m.name, mode: m, localhost: true},
			variant{name: m.name + "-no-localhost-nodeports", mode: m, args: []string{"--iptables-localhost-nodeports=false"}})
	}
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			t.Parallel()
			for _, bin := range v.mode.needs {
				netns.Require(t, bin)
			}
			testLocalhostNodePortFromAnotherHost(t, v.mode, v.args, v.localhost)
		})
	}
}

const localhostNodePort = "127.0.0.1:30080"

func testLocalhostNodePortFromAnotherHost(t *testing.T, m proxyMode, args []string, localhost bool) {
	c := newCluster(t, clusterOptions{mode: m, kproxyOn: []string{nodeA}, args: args})
	node := c.Nodes[nodeA]
	netns.ServeEcho(t, node.NS, "loopback-daemon", "tcp", 9999)

	routeLocalnet := func() string {
		t.Helper()
		v, err := node.Exec(5*time.Second, "sysctl", "-n", "net.ipv4.conf.all.route_localnet")
		if err != nil {
			t.Fatalf("route_localnet on node-a: %v", err)
		}
		return strings.TrimSpace(v)
	}
	want := "0"
	if localhost {
		want = "1"
	}
	if got := routeLocalnet(); got != want {
		t.Fatalf("kproxy left net.ipv4.conf.all.route_localnet = %s on node-a, want %s", got, want)
	}

	nodeIP := node.Addr(clientIP).String()
	for _, argv := range [][]string{
		{"sh", "-c", "for f in /proc/sys/net/ipv4/conf/*/route_localnet; do echo 1 > $f; done"},
		// Removing the local routes alone is not enough for 127.0.0.1:
		// with the address still on lo, the client's kernel does not
		// complete the connection (127.0.0.2 works that way, see
		// TestLocalhostGuard). The address goes, and its routes with it.
		{"ip", "addr", "del", "127.0.0.1/8", "dev", "lo"},
		{"ip", "route", "add", "127.0.0.1/32", "via", nodeIP},
	} {
		if out, err := c.Client.Exec(5*time.Second, argv...); err != nil {
			t.Fatalf("client: %v: %v\n%s", argv, err, out)
		}
	}

	if !localhost {
		// route_localnet=0: node-a drops the packets as martians, whatever
		// the rules say.
		runProbes(t, c, []probe{
			{from: client, network: "tcp", dst: localhostNodePort, outcome: netns.Timeout},
			{from: client, network: "tcp", dst: "127.0.0.1:9999", outcome: netns.Timeout},
		})
		// Someone else opens the path.
		if out, err := node.Exec(5*time.Second, "sysctl", "-w", "net.ipv4.conf.all.route_localnet=1"); err != nil {
			t.Fatalf("node-a: route_localnet=1: %v\n%s", err, out)
		}
	}

	if localhost {
		runProbes(t, c, []probe{
			// Upstream allows it: DNATed, the guard lets it pass.
			{from: client, network: "tcp", dst: localhostNodePort, n: 6, servers: web},
			// Not DNATed: dropped by the guard.
			{from: client, network: "tcp", dst: "127.0.0.1:9999", outcome: netns.Timeout},
		})
		return
	}
	runProbes(t, c, []probe{
		// The path is open: node-a's loopback daemon answers the client.
		{from: client, network: "tcp", dst: "127.0.0.1:9999", n: 3, servers: []string{"loopback-daemon"}},
		// The NodePort is not served on loopback: node-a's own stack
		// resets the connection, from the client and from node-a itself.
		{from: client, network: "tcp", dst: localhostNodePort, outcome: netns.Refused, within: quick},
		{from: nodeA, network: "tcp", dst: localhostNodePort, outcome: netns.Refused, within: quick},
		// And on the node's address it is.
		{from: client, network: "tcp", dst: "198.18.0.10:30080", n: 6, servers: web},
	})

	if m.iptables {
		return
	}
	// The vulnerable behaviour, emulated by hand in a table of its own
	// (kproxy would repair a change to its own tables at once): DNAT
	// 127.0.0.1:30080 to web-a before kproxy's rules. The client now sees
	// web-a, so the probe above can tell a served NodePort from a refusal.
	webAddr := c.Pod(t, webA).IP(clientIP).String()
	rules := "add table ip cve-2020-8558; " +
		"add chain ip cve-2020-8558 prerouting { type nat hook prerouting priority dstnat - 10; }; " +
		"add rule ip cve-2020-8558 prerouting ip daddr 127.0.0.1 tcp dport 30080 dnat to " + webAddr + ":8080"
	if out, err := node.Exec(10*time.Second, "nft", rules); err != nil {
		t.Fatalf("node-a: adding the vulnerable rule: %v\n%s", err, out)
	}
	t.Cleanup(func() { _, _ = node.Exec(10*time.Second, "nft", "delete", "table", "ip", "cve-2020-8558") })
	runProbes(t, c, []probe{
		{from: client, network: "tcp", dst: localhostNodePort, n: 3, servers: []string{webA}},
	})
}
