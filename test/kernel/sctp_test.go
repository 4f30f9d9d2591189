package kernel

import (
	"errors"
	"testing"

	"github.com/kproxy/kproxy/internal/testutil/netns"
)

// sctpPod is the example's only SCTP endpoint, on node-b.
const sctpPod = "sctp-0"

// TestSCTP: the sctp service 198.19.0.19:9999 reaches sctp-0. Needs a
// kernel with SCTP (CONFIG_IP_SCTP); without it the test skips, saying so.
func TestSCTP(t *testing.T) {
	requireKernel(t)
	t.Parallel()
	if err := netns.New(t, netns.RandomID(3), "sctp-probe").SCTPSupported(); err != nil {
		if errors.Is(err, netns.ErrSCTPUnsupported) {
			t.Skipf("SCTP traffic not tested: %v (the kernel lacks CONFIG_IP_SCTP; a test kernel with SCTP is planned)", err)
		}
		t.Fatal(err)
	}
	c := newCluster(t, clusterOptions{})
	netns.ServeEcho(t, c.Pod(t, sctpPod).NS, sctpPod, "sctp", 9999)
	runProbes(t, c, []probe{
		{from: testerA, network: "sctp", dst: "198.19.0.19:9999", n: 3, servers: []string{sctpPod}, peer: peerOwn},
		{from: testerB, network: "sctp", dst: "198.19.0.19:9999", n: 3, servers: []string{sctpPod}, peer: peerOwn},
		{from: client, network: "sctp", dst: "198.19.0.19:9999", n: 3, servers: []string{sctpPod}, peer: peerMasq, masqBy: nodeA},
		{from: testerA, network: "sctp", dst: "198.19.0.19:9998", outcome: netns.Refused, within: quick},
	})
}
