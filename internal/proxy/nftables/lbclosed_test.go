package nftables

// Source ranges of one family close the other family's LB VIPs (a
// deliberate difference from upstream, see model.ServicePort.
// LoadBalancerClosed). Addresses as in fixtures_test.go and flow_test.go.

import (
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/example"
	"github.com/kproxy/kproxy/internal/model"
)

// setSourceRanges converts the example's lb-ranges again, as the tracker
// would, with other loadBalancerSourceRanges, into the cluster's states.
func setSourceRanges(t *testing.T, c *exampleCluster, ranges []string) {
	t.Helper()
	var svc *v1.Service
	for _, s := range example.Objects().Services {
		if s.Name == "lb-ranges" {
			svc = s
		}
	}
	if svc == nil {
		t.Fatal("lb-ranges is not in the example")
	}
	svc.Spec.LoadBalancerSourceRanges = ranges
	ports, errs := model.ConvertService(svc, []v1.IPFamily{model.IPv4, model.IPv6})
	if len(errs) > 0 {
		t.Fatalf("lb-ranges: %v", errs)
	}
	for f, st := range c.states {
		for n := range st.Services {
			if n.Name == "lb-ranges" {
				delete(st.Services, n)
			}
		}
		for n, sp := range ports[f] {
			st.Services[n] = sp
		}
	}
}

func TestPacketFlowLBClosedToOtherFamily(t *testing.T) {
	c := loadExample(t, example.NodeA)
	setSourceRanges(t, c, []string{"2001:db8::/32"})
	if sp := c.states[model.IPv4].Services[spName("lb-ranges", "https", model.TCP)]; sp == nil || !sp.LoadBalancerClosed {
		t.Fatalf("lb-ranges IPv4 port: %+v, want LoadBalancerClosed", sp)
	}
	rs := c.ruleset(t, exampleOptions)
	runPacketFlowTests(t, rs, hostA, []packetFlowTest{
		{name: "LB VIP from outside (was in range)", src: outside, iif: lanIIF, dst: "198.19.200.1:443", output: "DROP"},
		{name: "LB VIP from denied outside source", src: outsideDenied, iif: lanIIF, dst: "198.19.200.1:443", output: "DROP"},
		{name: "LB VIP from other node", src: otherNode, iif: lanIIF, dst: "198.19.200.1:443", output: "DROP"},
		{name: "LB VIP from local pod", src: localPod, iif: podIIF, dst: "198.19.200.1:443", output: "DROP"},
		{name: "LB VIP from this node", src: thisNode, dst: "198.19.200.1:443", output: "DROP"},
		{name: "LB nodePort still open", src: outside, iif: lanIIF, dst: "198.18.0.10:30443", output: webEps, masq: true},
		{name: "LB clusterIP still open", src: localPod, iif: podIIF, dst: "198.19.0.12:443", output: webEps},
	})

	// Ranges of both families: IPv4 is filtered by its own again.
	c = loadExample(t, example.NodeA)
	setSourceRanges(t, c, []string{"2001:db8::/32", "203.0.113.0/24"})
	rs = c.ruleset(t, exampleOptions)
	runPacketFlowTests(t, rs, hostA, []packetFlowTest{
		{name: "both families: LB VIP from allowed source", src: outside, iif: lanIIF, dst: "198.19.200.1:443", output: webEps, masq: true},
		{name: "both families: LB VIP from denied source", src: outsideDenied, iif: lanIIF, dst: "198.19.200.1:443", output: "DROP"},
	})

	// No ranges at all: open to everyone, as upstream.
	c = loadExample(t, example.NodeA)
	setSourceRanges(t, c, nil)
	rs = c.ruleset(t, exampleOptions)
	runPacketFlowTests(t, rs, hostA, []packetFlowTest{
		{name: "no ranges: LB VIP open", src: outsideDenied, iif: lanIIF, dst: "198.19.200.1:443", output: webEps, masq: true},
	})
}
