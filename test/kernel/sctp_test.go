package kernel

import (
	"errors"
	"slices"
	"testing"

	"github.com/kproxy/kproxy/internal/testutil/netns"
	"github.com/kproxy/kproxy/internal/testutil/vm"
)

// sctpPod is the example's only SCTP endpoint, on node-b.
const sctpPod = "sctp-0"

// TestSCTP: the sctp service 198.19.0.19:9999 reaches sctp-0, in every
// proxy mode. Needs a
// kernel with SCTP (CONFIG_IP_SCTP). On a host kernel without it the test
// runs itself again inside the test VM (internal/testutil/vm), whose kernel
// has SCTP, with the same kproxy binary; without a VM it skips, saying why,
// unless KPROXY_VM=1 (CI), where it fails.
//
// The VM run happens before t.Parallel, while the package's parallel tests
// still wait: an emulated VM (no KVM) is slow enough without sharing the
// CPUs with them, and the inner test keeps the usual timeouts.
func TestSCTP(t *testing.T) {
	requireKernel(t)
	if err := netns.New(t, netns.RandomID(3), "sctp-probe").SCTPSupported(); err != nil {
		if !errors.Is(err, netns.ErrSCTPUnsupported) {
			t.Fatal(err)
		}
		if vm.InVM() {
			t.Fatalf("the test VM's kernel cannot open SCTP sockets: %v", err)
		}
		ok, why := vm.Available()
		switch {
		case ok:
			t.Logf("the host kernel lacks SCTP (%v): running the test in the test VM", err)
			defer func(m []string) { vm.DefaultModules = m }(vm.DefaultModules)
			vm.DefaultModules = append(slices.Clone(vm.DefaultModules), iptablesModules...)
			vm.RunTestInVM(t, "^TestSCTP$", "KPROXY_KERNEL_TEST_BIN="+kproxyBin)
			return
		case vm.Required():
			t.Fatalf("SCTP traffic not tested: %v, and no test VM: %s (KPROXY_VM=1 requires one)", err, why)
		}
		t.Skipf("SCTP traffic not tested: %v (the kernel lacks CONFIG_IP_SCTP), and no test VM: %s", err, why)
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
// in the VM like vm.DefaultModules (an on-demand load costs seconds there).
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
