package kernel

// Traffic from outside the cluster: NodePorts, load balancer IPs, external
// IPs, loadBalancerSourceRanges and externalTrafficPolicy Local.

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/testutil/netns"
)

func TestExternalTraffic(t *testing.T) { forEachMode(t, testExternalTraffic) }

func testExternalTraffic(t *testing.T, m proxyMode) {
	c := newCluster(t, clusterOptions{mode: m})
	runProbes(t, c, []probe{
		// web-nodeport: NodePort 30080 on each node's IP, policy Cluster:
		// any endpoint, masqueraded by the node that was hit.
		{from: client, network: "tcp", dst: "198.18.0.10:30080", servers: web, every: true, peer: peerMasq, masqBy: nodeA},
		{from: client, network: "tcp", dst: "198.18.0.11:30080", servers: web, every: true, peer: peerMasq, masqBy: nodeB},
		{from: testerB, network: "tcp", dst: "198.18.0.10:30080", servers: web, every: true, peer: peerMasq, masqBy: nodeA},
		// The node reaches its own NodePort; in nftables mode not on
		// localhost (nothing listens there: refused). iptables mode
		// serves node ports on 127.0.0.1 too (localhostNodePorts); ipvs
		// mode does not (upstream's ipvs proxier skips loopback node
		// IPs: no virtual server there, nothing listens: refused).
		{from: nodeA, network: "tcp", dst: "198.18.0.10:30080", servers: web, every: true, peer: peerMasq, masqBy: nodeA},
		{from: nodeA, network: "tcp", dst: "127.0.0.1:30080", outcome: netns.Refused, within: quick,
			ipt:  &probe{servers: web, every: true, peer: peerMasq, masqBy: nodeA},
			ipvs: &probe{outcome: netns.Refused, within: quick}},
		// Only the node's primary IPs take NodePorts (nftables default):
		// not node-a's pod gateway. Nothing listens there: refused.
		// iptables mode's default is every local address.
		{from: testerA, network: "tcp", dst: "198.18.129.1:30080", outcome: netns.Refused, within: quick,
			ipt: &probe{servers: web, every: true, peer: peerMasq, masqBy: nodeA}},

		// lb-ranges: LoadBalancer, VIP 198.19.200.1 (ipMode VIP),
		// NodePort 30443, source ranges 198.18.0.0/24 and 203.0.113.0/24.
		{from: client, network: "tcp", dst: "198.19.200.1:443", servers: web, every: true, peer: peerMasq, masqBy: nodeA},
		{from: client, source: clientAlt, network: "tcp", dst: "198.19.200.1:443", servers: web, n: 5, peer: peerMasq, masqBy: nodeA},
		{from: client, network: "tcp", dst: "198.18.0.10:30443", servers: web, n: 5, peer: peerMasq, masqBy: nodeA},
		// A pod's source (198.18.129.200) is in no source range: dropped,
		// as upstream filters the LB IP for pods too.
		{from: testerA, network: "tcp", dst: "198.19.200.1:443", outcome: netns.Timeout},
		// From the node itself (198.18.0.10, inside 198.18.0.0/24) the VIP
		// is captured on the node.
		{from: nodeA, network: "tcp", dst: "198.19.200.1:443", servers: web, every: true, peer: peerMasq, masqBy: nodeA},
		// 198.19.200.2 has ipMode Proxy: the node must not capture it but
		// send it to the load balancer (on the client, the LAN router).
		{from: nodeA, network: "tcp", dst: "198.19.200.2:443", n: 5, servers: []string{lbProxy}},
		{from: testerA, network: "tcp", dst: "198.19.200.2:443", n: 5, servers: []string{lbProxy}, peer: peerOwn},

		// ext-ip: external IPs 198.19.200.10 and fd00:19::c8:a, port
		// 8080, policy Cluster: masqueraded, also from pods.
		{from: client, network: "tcp", dst: "198.19.200.10:8080", servers: web, every: true, peer: peerMasq, masqBy: nodeA},
		{from: client, network: "tcp", dst: "[fd00:19::c8:a]:8080", servers: web, every: true, peer: peerMasq, masqBy: nodeA},
		{from: testerA, network: "tcp", dst: "198.19.200.10:8080", servers: web, every: true, peer: peerMasq, masqBy: nodeA},
		{from: nodeA, network: "tcp", dst: "[fd00:19::c8:a]:8080", servers: web, every: true, peer: peerMasq, masqBy: nodeA},
		// An external IP is no ClusterIP: a port it does not define is not
		// rejected by kproxy, the packet just leaves by the default route.
		// ipvs mode: refused (upstream puts external IPs on kube-ipvs0
		// too, and KUBE-IPVS-FILTER rejects what no virtual server takes).
		{from: client, network: "tcp", dst: "198.19.200.10:8081", outcome: netns.Timeout,
			ipvs: &probe{outcome: netns.Refused, within: quick}},
	})
}

// TestLoadBalancerSourceRanges narrows lb-ranges' loadBalancerSourceRanges
// and checks that the client's address outside the remaining range is
// dropped at the VIP, while the NodePort (not filtered) still answers it.
func TestLoadBalancerSourceRanges(t *testing.T) { forEachMode(t, testLoadBalancerSourceRanges) }

func testLoadBalancerSourceRanges(t *testing.T, m proxyMode) {
	snap := exampleSnapshot(t)
	c := newCluster(t, clusterOptions{mode: m, snapshot: snap, kproxyOn: []string{nodeA}})
	allowed := probe{from: client, network: "tcp", dst: "198.19.200.1:443", servers: web, n: 3, peer: peerMasq, masqBy: nodeA}
	alt := allowed
	alt.source = clientAlt
	c.run(t, allowed)
	c.run(t, alt)

	snap.editService(t, "lb-ranges", func(s *v1.Service) {
		s.Spec.LoadBalancerSourceRanges = []string{"198.18.0.0/24"}
	})
	c.apply(snap)
	c.waitRules(nodeA, "203.0.113.0/24 gone from lb-ranges' firewall", func(d string) bool {
		return !strings.Contains(d, "203.0.113.0/24")
	})

	dropped := alt
	dropped.servers, dropped.n, dropped.peer, dropped.outcome = nil, 1, peerAny, netns.Timeout
	c.run(t, dropped)
	c.run(t, allowed)
	nodePort := alt
	nodePort.dst = "198.18.0.10:30443"
	c.run(t, nodePort)
}

// healthCheck is what a health check node port answers.
type healthCheck struct {
	Service struct {
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
	} `json:"service"`
	LocalEndpoints      int  `json:"localEndpoints"`
	ServiceProxyHealthy bool `json:"serviceProxyHealthy"`
}

// TestExternalTrafficPolicyLocal: etp-local (NodePort 30081, LB
// 198.19.200.3, health check node port 32081, endpoints shop-a on node-a
// and shop-b on node-b). External traffic only goes to the node's own
// endpoint and keeps the client's address; pods still reach every
// endpoint. When node-b loses its endpoint, its health check says 503 and
// external traffic to it is dropped.
func TestExternalTrafficPolicyLocal(t *testing.T) { forEachMode(t, testExternalTrafficPolicyLocal) }

func testExternalTrafficPolicyLocal(t *testing.T, m proxyMode) {
	snap := exampleSnapshot(t)
	c := newCluster(t, clusterOptions{mode: m, snapshot: snap})
	shop := []string{shopA, shopB}
	runProbes(t, c, []probe{
		{from: client, network: "tcp", dst: "198.18.0.10:30081", n: 10, servers: []string{shopA}, peer: peerOwn},
		{from: client, network: "tcp", dst: "198.19.200.3:80", n: 10, servers: []string{shopA}, peer: peerOwn},
		{from: client, source: clientAlt, network: "tcp", dst: "198.19.200.3:80", n: 3, servers: []string{shopA}, peer: peerOwn},
		{from: client, network: "tcp", dst: "198.18.0.11:30081", n: 10, servers: []string{shopB}, peer: peerOwn},
		// Pods short-circuit to the cluster-wide endpoints. Not in ipvs
		// mode: upstream's virtual server of a policy Local address has
		// the local endpoints only, for pods too.
		{from: testerA, network: "tcp", dst: "198.19.200.3:80", servers: shop, every: true, peer: peerOwn,
			ipvs: &probe{n: 5, servers: []string{shopA}, peer: peerOwn}},
		{from: testerA, network: "tcp", dst: "198.19.0.14:80", servers: shop, every: true, peer: peerOwn},
		// The node itself: masqueraded, all endpoints. ipvs mode: the
		// local endpoint only (as for pods), and not masqueraded: the
		// address is on kube-ipvs0, so the node's socket takes it as its
		// source, and upstream's KUBE-LOAD-BALANCER-LOCAL returns before
		// any masquerade.
		{from: nodeA, network: "tcp", dst: "198.19.200.3:80", servers: shop, every: true, peer: peerMasq, masqBy: nodeA,
			ipvs: &probe{n: 5, servers: []string{shopA}, peer: peerOwn}},
	})

	checkHealth := func(node string, wantCode, wantLocal int) (bool, string) {
		url := "http://" + c.Nodes[node].Addr(clientIP).String() + ":32081/"
		code, body, err := c.Client.HTTPGet(url, 2*time.Second)
		if err != nil {
			return false, err.Error()
		}
		var hc healthCheck
		if err := json.Unmarshal([]byte(body), &hc); err != nil {
			return false, "body " + body + ": " + err.Error()
		}
		ok := code == wantCode && hc.LocalEndpoints == wantLocal &&
			hc.Service.Namespace == "demo" && hc.Service.Name == "etp-local"
		return ok, fmt.Sprintf("GET %s: %d %s", url, code, body)
	}
	for _, node := range []string{nodeA, nodeB} {
		netns.Eventually(t, syncTimeout, "health check of "+node+" to say 200 with 1 local endpoint", func() (bool, string) {
			return checkHealth(node, 200, 1)
		})
	}

	snap.removeEndpoint(t, "etp-local", shopB)
	c.apply(snap)
	c.waitRules(nodeB, "etp-local without shop-b", func(d string) bool {
		return !c.mode.routesTo(d, "demo/etp-local/tcp/http", c.Pod(t, shopB).IP(clientIP))
	})
	netns.Eventually(t, syncTimeout, "health check of node-b to say 503 with 0 local endpoints", func() (bool, string) {
		return checkHealth(nodeB, 503, 0)
	})
	if ok, msg := checkHealth(nodeA, 200, 1); !ok {
		t.Errorf("node-a's health check changed: %s", msg)
	}
	runProbes(t, c, []probe{
		// No local endpoint on node-b: external traffic there is dropped.
		{from: client, network: "tcp", dst: "198.18.0.11:30081", outcome: netns.Timeout},
		{from: client, network: "tcp", dst: "198.18.0.10:30081", n: 5, servers: []string{shopA}, peer: peerOwn},
		// Pods on node-b still reach the remaining endpoint.
		{from: testerB, network: "tcp", dst: "198.19.0.14:80", n: 5, servers: []string{shopA}, peer: peerOwn},
	})
}

// TestDualStackExternal makes the example's dual-stack services reachable
// from outside in both families: dual-stack becomes a LoadBalancer with
// externalTrafficPolicy Local (NodePort 30090, health check 32090, ingress
// 198.19.200.17 and fd00:19::c8:17), ext-ip a NodePort (30088, policy
// Cluster).
func TestDualStackExternal(t *testing.T) { forEachMode(t, testDualStackExternal) }

func testDualStackExternal(t *testing.T, m proxyMode) {
	snap := exampleSnapshot(t)
	snap.editService(t, "dual-stack", func(s *v1.Service) {
		s.Spec.Type = v1.ServiceTypeLoadBalancer
		s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
		s.Spec.HealthCheckNodePort = 32090
		s.Spec.Ports[0].NodePort = 30090
		vip := v1.LoadBalancerIPModeVIP
		s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{
			{IP: "198.19.200.17", IPMode: &vip}, {IP: "fd00:19::c8:17", IPMode: &vip},
		}
	})
	snap.editService(t, "ext-ip", func(s *v1.Service) {
		s.Spec.Type = v1.ServiceTypeNodePort
		s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyCluster
		s.Spec.Ports[0].NodePort = 30088
	})
	c := newCluster(t, clusterOptions{mode: m, snapshot: snap})
	runProbes(t, c, []probe{
		// Policy Local: only the hit node's endpoint, client address kept.
		{from: client, network: "tcp", dst: "[fd00:18::10]:30090", n: 10, servers: []string{dualA}, peer: peerOwn},
		{from: client, network: "tcp", dst: "198.18.0.10:30090", n: 10, servers: []string{dualA}, peer: peerOwn},
		{from: client, network: "tcp", dst: "[fd00:18::11]:30090", n: 10, servers: []string{dualB}, peer: peerOwn},
		{from: client, network: "tcp", dst: "[fd00:19::c8:17]:80", n: 10, servers: []string{dualA}, peer: peerOwn},
		{from: client, network: "tcp", dst: "198.19.200.17:80", n: 10, servers: []string{dualA}, peer: peerOwn},
		// Pods short-circuit to every endpoint; in ipvs mode to the local
		// one only (see testExternalTrafficPolicyLocal).
		{from: testerA, network: "tcp", dst: "[fd00:19::c8:17]:80", servers: dual, every: true, peer: peerOwn,
			ipvs: &probe{n: 5, servers: []string{dualA}, peer: peerOwn}},
		// Policy Cluster over IPv6: any endpoint, masqueraded.
		{from: client, network: "tcp", dst: "[fd00:18::10]:30088", servers: web, every: true, peer: peerMasq, masqBy: nodeA},
		{from: client, network: "tcp", dst: "[fd00:18::11]:30088", servers: web, every: true, peer: peerMasq, masqBy: nodeB},
		{from: client, network: "tcp", dst: "198.18.0.11:30088", servers: web, every: true, peer: peerMasq, masqBy: nodeB},
	})
	for _, url := range []string{"http://198.18.0.10:32090/", "http://[fd00:18::10]:32090/", "http://[fd00:18::11]:32090/"} {
		netns.Eventually(t, syncTimeout, "health check "+url, func() (bool, string) {
			code, body, err := c.Client.HTTPGet(url, 2*time.Second)
			var hc healthCheck
			if err == nil {
				err = json.Unmarshal([]byte(body), &hc)
			}
			return err == nil && code == 200 && hc.LocalEndpoints == 1 && hc.Service.Name == "dual-stack",
				fmt.Sprintf("GET %s: %d %q %v", url, code, body, err)
		})
	}
}

// TestLoadBalancerSourceRangesOtherFamilyOnly: lb-ranges with IPv6 source
// ranges only is closed to IPv4 clients at its IPv4 VIP (a deliberate
// difference from upstream, which leaves it open), on a fresh node and
// after a change on a running one; with a matching IPv4 range as well it
// is open to that range. The NodePort is never filtered.
func TestLoadBalancerSourceRangesOtherFamilyOnly(t *testing.T) {
	forEachMode(t, testLoadBalancerSourceRangesOtherFamilyOnly)
}

func testLoadBalancerSourceRangesOtherFamilyOnly(t *testing.T, m proxyMode) {
	snap := exampleSnapshot(t)
	snap.editService(t, "lb-ranges", func(s *v1.Service) {
		s.Spec.LoadBalancerSourceRanges = []string{"2001:db8::/32"}
	})
	c := newCluster(t, clusterOptions{mode: m, snapshot: snap, kproxyOn: []string{nodeA}})
	// The client's clientAlt address is in 203.0.113.0/24.
	allowed := probe{from: client, source: clientAlt, network: "tcp", dst: "198.19.200.1:443", servers: web, n: 3, peer: peerMasq, masqBy: nodeA}
	closed := allowed
	closed.servers, closed.n, closed.peer, closed.outcome = nil, 1, peerAny, netns.Timeout
	closedMain := closed
	closedMain.source = netip.Addr{} // the client's own address, in 198.18.0.0/24
	nodePort := allowed
	nodePort.dst = "198.18.0.10:30443"

	// Fresh node: closed at the VIP to either source, open at the NodePort.
	c.run(t, nodePort)
	c.run(t, closed)
	c.run(t, closedMain)

	// A matching IPv4 range as well: open to the client.
	snap.editService(t, "lb-ranges", func(s *v1.Service) {
		s.Spec.LoadBalancerSourceRanges = []string{"2001:db8::/32", "203.0.113.0/24"}
	})
	c.apply(snap)
	c.waitRules(nodeA, "203.0.113.0/24 in lb-ranges' firewall", func(d string) bool {
		return strings.Contains(d, "203.0.113.0/24")
	})
	c.run(t, allowed)

	// Running node: back to IPv6 ranges only closes it again.
	snap.editService(t, "lb-ranges", func(s *v1.Service) {
		s.Spec.LoadBalancerSourceRanges = []string{"2001:db8::/32"}
	})
	c.apply(snap)
	c.waitRules(nodeA, "203.0.113.0/24 gone from lb-ranges' firewall", func(d string) bool {
		return !strings.Contains(d, "203.0.113.0/24")
	})
	c.run(t, closed)
	c.run(t, nodePort)
}
