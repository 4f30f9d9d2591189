package kernel

import (
	"testing"

	"github.com/kproxy/kproxy/internal/testutil/netns"
)

// sctpPod is the example's only SCTP endpoint, on node-b.
const sctpPod = "sctp-0"

// TestSCTP: the sctp service 198.19.0.19:9999 reaches sctp-0, in every
// proxy mode. Needs a kernel with SCTP (CONFIG_IP_SCTP). On a host kernel
// without it the test skips and TestInVM runs it inside the test VM
// (internal/testutil/vm), whose kernel has SCTP, with the same kproxy
// binary.
func TestSCTP(t *testing.T) {
	requireKernel(t)
	if err := sctpUnsupported(t); err != nil {
		skipForVM(t, err)
	}
	t.Parallel()
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			for _, bin := range m.needs {
				netns.Require(t, bin)
			}
			testSCTP(t, m)
		})
	}
}

// iptablesModules are what the iptables modes' rules use, loaded up front
// in the VM (TestInVM) like vm.DefaultModules (an on-demand load costs seconds there).
var iptablesModules = []string{
	"ip_tables", "iptable_nat", "iptable_filter", "iptable_mangle",
	"ip6_tables", "ip6table_nat", "ip6table_filter", "ip6table_mangle", "nft_compat",
	"xt_comment", "xt_statistic", "xt_recent", "xt_mark", "xt_conntrack", "xt_addrtype",
	"xt_MASQUERADE", "xt_nat", "xt_tcpudp", "xt_sctp", "xt_multiport", "ipt_REJECT", "ip6t_REJECT",
}

// testSCTP runs one mode's SCTP probes; in the VM the modes run one after
// the other (the emulated CPUs are slow enough).
func testSCTP(t *testing.T, m proxyMode) {
	c := newCluster(t, clusterOptions{mode: m})
	netns.ServeEcho(t, c.Pod(t, sctpPod).NS, sctpPod, "sctp", 9999)
	runProbes(t, c, []probe{
		{from: testerA, network: "sctp", dst: "198.19.0.19:9999", n: 3, servers: []string{sctpPod}, peer: peerOwn},
		{from: testerB, network: "sctp", dst: "198.19.0.19:9999", n: 3, servers: []string{sctpPod}, peer: peerOwn},
		{from: client, network: "sctp", dst: "198.19.0.19:9999", n: 3, servers: []string{sctpPod}, peer: peerMasq, masqBy: nodeA},
		{from: testerA, network: "sctp", dst: "198.19.0.19:9998", outcome: netns.Refused, within: quick, nftOnly: true},
	})
}
