package kernel

// nodePortAddresses (--nodeport-addresses) with each keyword, CIDRs of one
// or both families and mixes, in nftables mode and iptables mode (legacy
// and nft backends), checked with real connections to a dual-stack
// NodePort. Addresses as in cluster_test.go: node-a's primary IPs
// 198.18.0.10 and fd00:18::10 (its Node's InternalIPs), its pod gateway
// 198.18.129.1 and fd00:18:1:a::1 (local, not primary), and loopback.

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/kernel/xtables"
	"github.com/kproxy/kproxy/internal/testutil/netns"
)

// The NodePort destinations, each probed from where it is reachable.
const (
	npPrimary4 = "198.18.0.10:30088"
	npPrimary6 = "[fd00:18::10]:30088"
	npGateway4 = "198.18.129.1:30088"
	npGateway6 = "[fd00:18:1:a::1]:30088"
	npLoop4    = "127.0.0.1:30088"
	npLoop6    = "[::1]:30088"
)

var npFrom = map[string]string{
	npPrimary4: client, npPrimary6: client,
	npGateway4: testerA, npGateway6: testerA,
	npLoop4: nodeA, npLoop6: nodeA,
}

// TestNodePortAddresses restarts kproxy on node-a with one nodePortAddresses
// value after the other and checks which addresses answer the NodePort
// (any web endpoint) and which refuse it (nothing listens there). Upstream's
// rules: keywords expand to both families' CIDRs; a family left without a
// CIDR takes NodePorts on all its addresses; unset is "primary" in
// nftables mode and all in iptables mode; loopback is never served in
// nftables mode nor for IPv6, and in iptables mode only when the list
// covers 127.0.0.0/8.
func TestNodePortAddresses(t *testing.T) {
	t.Parallel()
	for _, m := range []proxyMode{nftablesMode, iptablesMode(xtables.Legacy), iptablesMode(xtables.NFT)} {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			for _, bin := range m.needs {
				netns.Require(t, bin)
			}
			testNodePortAddresses(t, m)
		})
	}
}

func testNodePortAddresses(t *testing.T, m proxyMode) {
	c := nodePortAddressesCluster(t, m)
	all := []string{npPrimary4, npPrimary6, npGateway4, npGateway6}
	primary := []string{npPrimary4, npPrimary6}
	for _, tc := range []struct {
		// value of --nodeport-addresses; "" leaves it unset.
		value string
		// nft and ipt: the destinations that answer in each mode.
		nft, ipt []string
	}{
		{value: "", nft: primary, ipt: append(slices.Clone(all), npLoop4)},
		{value: "all", nft: all, ipt: append(slices.Clone(all), npLoop4)},
		{value: "primary", nft: primary, ipt: primary},
		{value: "localhost", nft: nil, ipt: []string{npLoop4}},
		{value: "primary,localhost", nft: primary, ipt: append(slices.Clone(primary), npLoop4)},
		// IPv4 CIDR only: IPv6 on all its addresses.
		{value: "198.18.129.0/24", nft: []string{npGateway4, npPrimary6, npGateway6}, ipt: []string{npGateway4, npPrimary6, npGateway6}},
		{value: "198.18.0.0/24,fd00:18:1:a::/64", nft: []string{npPrimary4, npGateway6}, ipt: []string{npPrimary4, npGateway6}},
		{value: "primary,198.18.129.0/24", nft: []string{npPrimary4, npGateway4, npPrimary6}, ipt: []string{npPrimary4, npGateway4, npPrimary6}},
		{value: "198.18.129.0/24,all", nft: all, ipt: append(slices.Clone(all), npLoop4)},
	} {
		name := tc.value
		if name == "" {
			name = "unset"
		}
		t.Run(strings.ReplaceAll(name, "/", "_"), func(t *testing.T) {
			// A fresh kproxy (first, full sync) with the value.
			if err := c.kproxy[nodeA].Stop(); err != nil {
				t.Fatalf("stopping kproxy on node-a: %v", err)
			}
			c.args = nil
			if tc.value != "" {
				c.args = []string{"--nodeport-addresses", tc.value}
			}
			// iptables mode turns route_localnet on only for localhost
			// node ports (it lets other hosts reach 127.0.0.0/8).
			node := c.Nodes[nodeA]
			if out, err := node.Exec(5*time.Second, "sysctl", "-w", "net.ipv4.conf.all.route_localnet=0"); err != nil {
				t.Fatalf("resetting route_localnet: %v\n%s", err, out)
			}
			c.restartKproxy(nodeA)
			served := tc.nft
			if m.iptables {
				served = tc.ipt
			}
			wantLocalnet := "0"
			if slices.Contains(served, npLoop4) {
				wantLocalnet = "1"
			}
			if v, err := node.Exec(5*time.Second, "sysctl", "-n", "net.ipv4.conf.all.route_localnet"); err != nil || strings.TrimSpace(v) != wantLocalnet {
				t.Errorf("route_localnet = %q (%v), want %s", strings.TrimSpace(v), err, wantLocalnet)
			}
			var probes []probe
			for _, dst := range []string{npPrimary4, npPrimary6, npGateway4, npGateway6, npLoop4, npLoop6} {
				p := probe{from: npFrom[dst], network: "tcp", dst: dst}
				if slices.Contains(served, dst) {
					p.servers, p.n = web, 3
				} else {
					p.outcome, p.within = netns.Refused, quick
				}
				probes = append(probes, p)
			}
			runProbes(t, c, probes)
		})
	}

	// An address the CIDRs select is added to the host, then removed,
	// with no change to the Node: served, then refused, within a sync
	// period (only full syncs read the host's addresses, and they are
	// hourly; the periodic sync notices and makes itself full).
	t.Run("address_added_and_removed", func(t *testing.T) {
		const period = 2 * time.Second
		if err := c.kproxy[nodeA].Stop(); err != nil {
			t.Fatalf("stopping kproxy on node-a: %v", err)
		}
		c.args = []string{"--nodeport-addresses", "198.18.129.0/24", "--iptables-sync-period", period.String()}
		c.restartKproxy(nodeA)
		node := c.Nodes[nodeA]
		const added, dst = "198.18.129.77/24", "198.18.129.77:30088"
		namesAdded := func() (bool, string) {
			d, err := c.mode.dump(node.NS)
			if err != nil {
				return false, err.Error()
			}
			return strings.Contains(d, "198.18.129.77"), d
		}
		if named, d := namesAdded(); named {
			t.Fatalf("the rules name 198.18.129.77 before it is added:\n%s", d)
		}
		if out, err := node.Exec(5*time.Second, "ip", "addr", "add", added, "dev", "cbr0"); err != nil {
			t.Fatalf("adding %s: %v\n%s", added, err, out)
		}
		removed := false
		defer func() {
			if !removed {
				_, _ = node.Exec(5*time.Second, "ip", "addr", "del", added, "dev", "cbr0")
			}
		}()
		netns.Eventually(t, 2*period+syncTimeout, "NodePort on the added address", func() (bool, string) {
			r := c.Pod(t, testerA).NS.Request("tcp", ap(dst), netns.DialOptions{Timeout: 300 * time.Millisecond})
			return r.Outcome == netns.Answered, r.String()
		})
		runProbes(t, c, []probe{{from: testerA, network: "tcp", dst: dst, servers: web, n: 3}})
		if out, err := node.Exec(5*time.Second, "ip", "addr", "del", added, "dev", "cbr0"); err != nil {
			t.Fatalf("removing %s: %v\n%s", added, err, out)
		}
		removed = true
		// The address is gone from the host: the rules must not keep it.
		netns.Eventually(t, 2*period+syncTimeout, "the removed address out of the rules", func() (bool, string) {
			named, _ := namesAdded()
			return !named, "rules still name 198.18.129.77"
		})
		if log := c.kproxy[nodeA].Log(); !strings.Contains(log, "The node port addresses changed on the host") {
			t.Errorf("kproxy's log does not say why the sync was full")
		}
	})
}

// nodePortAddressesCluster returns a cluster where ext-ip is a dual-stack
// NodePort (30088, policy Cluster, web endpoints on both nodes) and kproxy
// runs on node-a.
func nodePortAddressesCluster(t *testing.T, m proxyMode) *kcluster {
	t.Helper()
	snap := exampleSnapshot(t)
	snap.editService(t, "ext-ip", func(s *v1.Service) {
		s.Spec.Type = v1.ServiceTypeNodePort
		s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyCluster
		s.Spec.Ports[0].NodePort = 30088
	})
	c := newCluster(t, clusterOptions{mode: m, snapshot: snap, kproxyOn: []string{nodeA}})
	// The pod gateway must be local on node-a, or the probes to it say
	// nothing about nodePortAddresses.
	for _, gw := range c.Nodes[nodeA].Gateways {
		if !slices.Contains([]netip.Addr{ip("198.18.129.1"), ip("fd00:18:1:a::1")}, gw) {
			t.Fatalf("node-a's pod gateway %s is not the one the test expects", gw)
		}
	}
	return c
}
