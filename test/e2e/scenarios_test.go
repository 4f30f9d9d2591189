package e2e

// Scenarios: kproxy on node-a follows Services, EndpointSlices and its Node
// as they are created, changed and deleted through the API server, and real
// traffic from the client (outside the cluster) and from pods checks every
// step. Addresses: see env_test.go.

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/kproxy/kproxy/internal/testutil/netns"
	"github.com/kproxy/kproxy/internal/trace"
)

const (
	ipv4 = discoveryv1.AddressTypeIPv4
	ipv6 = discoveryv1.AddressTypeIPv6
)

// scenario is one end-to-end check, run in every mode on a fresh env.
type scenario struct {
	name string
	run  func(e *env)
	// kproxyArgs are extra kproxy flags for the scenario, if any.
	kproxyArgs func(mode modeCase) []string
}

var scenarios = []scenario{
	{name: "lifecycle", run: scenarioLifecycle},
	{name: "udp-scale-to-zero", run: scenarioUDPScaleToZero},
	{name: "type-switch", run: scenarioTypeSwitch},
	{name: "traffic-policies", run: scenarioTrafficPolicies},
	{name: "terminating-endpoints", run: scenarioTerminating},
	{name: "topology-hints", run: scenarioTopology},
	{name: "node-deletion", run: scenarioNodeDeletion},
	{name: "dual-stack", run: scenarioDualStack},
	{name: "programming-latency", run: scenarioLatency, kproxyArgs: latencyArgs},
	{name: "api-edge-cases", run: scenarioAPIEdgeCases},
	{name: "service-cidrs", run: scenarioServiceCIDRs},
}

// TestScenarios runs every scenario in every mode, on the package's shared
// control plane (starting one takes seconds); each gets fresh network
// namespaces, a fresh Node object, kproxy process and Kubernetes
// namespace, all removed when it ends.
func TestScenarios(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode.name, func(t *testing.T) {
			for _, sc := range scenarios {
				t.Run(sc.name, func(t *testing.T) {
					cp := sharedControlPlane(t)
					start := time.Now()
					var args []string
					if sc.kproxyArgs != nil {
						args = sc.kproxyArgs(mode)
					}
					sc.run(newEnv(t, cp, mode, args...))
					t.Logf("%s in %s mode: %s", sc.name, mode.name, time.Since(start).Round(time.Millisecond))
				})
			}
		})
	}
}

// clusterIP returns the Service's cluster IP of the family of like.
func clusterIP(svc *corev1.Service, like netip.Addr) netip.Addr {
	for _, s := range svc.Spec.ClusterIPs {
		if a, err := netip.ParseAddr(s); err == nil && a.Is4() == like.Is4() {
			return a
		}
	}
	return netip.Addr{}
}

// nodePort returns the node port of the Service's port called name.
func nodePort(svc *corev1.Service, name string) int {
	for _, p := range svc.Spec.Ports {
		if p.Name == name {
			return int(p.NodePort)
		}
	}
	return 0
}

// scenarioLifecycle: health and mode endpoints answer, a Service is
// programmed when it appears (the mode's tracer agrees with the kernel
// where the mode has one), follows its endpoints, and goes away with it.
func scenarioLifecycle(e *env) {
	t := e.t
	e.expectHealth("/healthz", http.StatusOK, ptr.To(true))
	code, h, err := e.health("/healthz")
	if err != nil || code != http.StatusOK {
		t.Fatalf("/healthz: %d %v", code, err)
	}
	if h.CurrentTime.IsZero() || h.LastUpdated.IsZero() || h.Healthy == nil || !*h.Healthy {
		t.Errorf("/healthz: lastUpdated, currentTime or healthy missing or false: %+v", h)
	}
	code, mode, err := e.node.HTTPGet("http://"+metricsAddr+"/proxyMode", 3*time.Second)
	if err != nil || code != http.StatusOK || strings.TrimSpace(mode) != e.mode.proxyMode {
		t.Fatalf("/proxyMode: %d %q %v, want 200 %q", code, mode, err, e.mode.proxyMode)
	}
	// The "kubernetes" Service is programmed from the first sync.
	e.expectCaptured(true, serviceKey("198.19.0.1", corev1.ProtocolTCP, 443))

	start := time.Now()
	svc := e.createService("web")
	cip := clusterIP(svc, v4)
	key := serviceKey(cip.String(), corev1.ProtocolTCP, 80)
	e.setEndpoints("web", ipv4, endpoint{pod: podA1})
	e.expectCaptured(true, key)
	e.expectServers(client, "tcp", ap(cip, 80), podA1)
	t.Logf("new Service programmed %s after creation", time.Since(start).Round(time.Millisecond))
	e.expectServers(testerA, "tcp", ap(cip, 80), podA1)
	e.expectServers(nodeA, "tcp", ap(cip, 80), podA1)
	e.expectTrace(cip, netip.AddrPortFrom(e.podIP(podA1, v4), targetTCP))

	// A sync pass records its metrics once every family's sync ended;
	// traffic flows as soon as its own family's did. Bounded: 50 reads,
	// 100 ms apart.
	names := []string{"kubeproxy_sync_proxy_rules_duration_seconds", "kubeproxy_network_programming_duration_seconds"}
	var missing []string
	for range 50 {
		m, err := e.metrics()
		if err != nil {
			t.Fatal(err)
		}
		missing = missing[:0]
		for _, name := range names {
			if c, ok := metricCount(m, name); !ok || c < 1 {
				missing = append(missing, fmt.Sprintf("%s_count = %v (present %v)", name, c, ok))
			}
		}
		if len(missing) == 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, m := range missing {
		t.Errorf("/metrics: %s after 5 s, want >= 1", m)
	}

	start = time.Now()
	e.setEndpoints("web", ipv4, endpoint{pod: podA2})
	e.expectServers(client, "tcp", ap(cip, 80), podA2)
	t.Logf("endpoint change programmed %s after the update", time.Since(start).Round(time.Millisecond))
	e.expectServers(testerA, "tcp", ap(cip, 80), podA2)
	e.expectTrace(cip, netip.AddrPortFrom(e.podIP(podA2, v4), targetTCP))

	start = time.Now()
	e.deleteService("web")
	e.expectCaptured(false, key)
	e.expectUnanswered(client, "tcp", ap(cip, 80))
	e.expectUnanswered(testerA, "tcp", ap(cip, 80))
	t.Logf("Service deletion programmed %s after the delete", time.Since(start).Round(time.Millisecond))
	e.expectCaptured(true, serviceKey("198.19.0.1", corev1.ProtocolTCP, 443))
	e.alive()
}

// expectTrace checks, when the mode has a tracer, that a TCP connection from
// the node to cip:80 traced through the live rules goes to want only.
func (e *env) expectTrace(cip netip.Addr, want netip.AddrPort) {
	e.t.Helper()
	if e.mode.trace == nil {
		return
	}
	local := []netip.Addr{nodeAIP, nodeAIP6}
	e.eventually("the tracer sends "+cip.String()+":80 to "+want.String(), func() error {
		eps, err := e.mode.trace(e.node.Name, trace.Packet{
			Src: nodeAIP, Dst: cip, Proto: corev1.ProtocolTCP, SrcPort: 40000, DstPort: 80,
		}, local)
		if err != nil {
			return err
		}
		if !slices.Equal(eps, []netip.AddrPort{want}) {
			return fmt.Errorf("trace: endpoints %v", eps)
		}
		return nil
	})
}

// scenarioUDPScaleToZero: long-lived UDP flows (one socket, one source
// port, so one conntrack entry each) from outside and from a pod follow
// their service as its endpoints go away, to zero, and come back. A stale
// conntrack entry would keep a flow on a removed endpoint (still running,
// so it would answer) or, after scaling to zero and back, black-holed.
func scenarioUDPScaleToZero(e *env) {
	svc := e.createService("dns", func(s *corev1.Service) { s.Spec.Ports = []corev1.ServicePort{portUDP} })
	dst := ap(clusterIP(svc, v4), 53)
	e.setEndpoints("dns", ipv4, endpoint{pod: podA1}, endpoint{pod: podB1})
	e.expectServers(client, "udp", dst, podA1, podB1)
	e.expectServers(testerA, "udp", dst, podA1, podB1)

	flows := []*udpFlow{e.openUDPFlow(client, dst, 40053), e.openUDPFlow(testerA, dst, 40054)}
	first := map[*udpFlow]string{}
	for _, f := range flows {
		r := f.ask()
		if r.Outcome != netns.Answered {
			e.t.Fatalf("UDP flow from %s: %v", f.from, r)
		}
		first[f] = r.Server
		e.expectFlow("sticky", f, netns.Answered, r.Server)
	}

	// Remove the endpoint the client's flow is on; the pod keeps running.
	gone := first[flows[0]]
	stay := podA1
	if gone == podA1 {
		stay = podB1
	}
	e.setEndpoints("dns", ipv4, endpoint{pod: stay})
	e.expectServers(client, "udp", dst, stay)
	for _, f := range flows {
		e.expectFlow(gone+" removed", f, netns.Answered, stay)
	}

	// Scale to zero: rejected (ICMP port unreachable).
	e.setEndpoints("dns", ipv4)
	e.expectOutcome(client, "udp", dst, netns.Refused)
	for _, f := range flows {
		e.expectFlow("scaled to zero", f, netns.Refused)
	}

	// And back, to the endpoint removed first: the same flows, which kept
	// sending all along, are answered again.
	e.setEndpoints("dns", ipv4, endpoint{pod: gone})
	e.expectServers(client, "udp", dst, gone)
	for _, f := range flows {
		e.expectFlow("scaled back to one", f, netns.Answered, gone)
	}
	e.setEndpoints("dns", ipv4, endpoint{pod: podA1}, endpoint{pod: podB1})
	e.expectServers(client, "udp", dst, podA1, podB1)
	e.expectServers(testerA, "udp", dst, podA1, podB1)
}

// scenarioTypeSwitch: one Service goes ClusterIP → NodePort → LoadBalancer
// → ClusterIP; each address kind answers exactly while the type offers it.
func scenarioTypeSwitch(e *env) {
	svc := e.createService("web")
	cip := ap(clusterIP(svc, v4), 80)
	e.setEndpoints("web", ipv4, endpoint{pod: podA1}, endpoint{pod: podB1})
	both := []string{podA1, podB1}
	e.expectServers(client, "tcp", cip, both...)
	e.expectServers(testerA, "tcp", cip, both...)

	svc = e.editService("web", func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeNodePort })
	np := nodePort(svc, "tcp")
	if np == 0 {
		e.t.Fatalf("no node port allocated: %+v", svc.Spec.Ports)
	}
	e.expectServersPeer(client, "tcp", ap(nodeAIP, np), e.masqueraded(), both...)
	e.expectServers(client, "tcp", cip, both...)

	svc = e.editService("web", func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeLoadBalancer })
	if got := nodePort(svc, "tcp"); got != np {
		e.t.Fatalf("node port changed from %d to %d with the type", np, got)
	}
	e.setLoadBalancerIngress("web", lbIP)
	e.expectServers(client, "tcp", ap(lbIP, 80), both...)
	e.expectServers(testerA, "tcp", ap(lbIP, 80), both...)
	e.expectServers(client, "tcp", ap(nodeAIP, np), both...)

	svc = e.editService("web", func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeClusterIP })
	if got := nodePort(svc, "tcp"); got != 0 {
		e.t.Errorf("back to ClusterIP, the API server kept node port %d", got)
	}
	e.t.Logf("back to ClusterIP: status.loadBalancer %+v", svc.Status.LoadBalancer)
	e.expectCaptured(false, nodePortKey("ip", corev1.ProtocolTCP, int32(np)))
	e.expectOutcome(client, "tcp", ap(nodeAIP, np), netns.Refused)
	e.expectUnanswered(client, "tcp", ap(lbIP, 80))
	e.expectServers(client, "tcp", cip, both...)
	e.expectServers(testerA, "tcp", cip, both...)
}

// scenarioTrafficPolicies flips externalTrafficPolicy and
// internalTrafficPolicy between Cluster and Local on a LoadBalancer Service
// (only those get a health check node port). a1 runs on node-a, where
// kproxy runs; b1 on node-b.
func scenarioTrafficPolicies(e *env) {
	svc := e.createService("web", func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeLoadBalancer })
	e.setLoadBalancerIngress("web", lbIP)
	cip := ap(clusterIP(svc, v4), 80)
	np := ap(nodeAIP, nodePort(svc, "tcp"))
	lb := ap(lbIP, 80)
	e.setEndpoints("web", ipv4, endpoint{pod: podA1}, endpoint{pod: podB1})
	// Cluster: both endpoints, the client's address masqueraded.
	for _, dst := range []netip.AddrPort{np, lb} {
		e.expectServersPeer(client, "tcp", dst, e.masqueraded(), podA1, podB1)
	}

	svc = e.editService("web", func(s *corev1.Service) { s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal })
	hc := int(svc.Spec.HealthCheckNodePort)
	if hc == 0 {
		e.t.Fatal("externalTrafficPolicy Local: no health check node port allocated")
	}
	// Local: external traffic only to the local endpoint, the client's
	// address kept; traffic from pods, to the load balancer IP too, still
	// goes everywhere.
	for _, dst := range []netip.AddrPort{np, lb} {
		e.expectServersPeer(client, "tcp", dst, keeps(clientIP), podA1)
	}
	e.expectServers(testerA, "tcp", cip, podA1, podB1)
	e.expectServers(testerA, "tcp", lb, podA1, podB1)
	e.expectHealthCheck(hc, http.StatusOK, 1)

	// No local endpoint left: external traffic is dropped, the health
	// check says so.
	e.setEndpoints("web", ipv4, endpoint{pod: podB1})
	e.expectHealthCheck(hc, http.StatusServiceUnavailable, 0)
	e.expectOutcome(client, "tcp", np, netns.Timeout)
	e.expectOutcome(client, "tcp", lb, netns.Timeout)
	e.expectServers(testerA, "tcp", cip, podB1)
	e.setEndpoints("web", ipv4, endpoint{pod: podA1}, endpoint{pod: podB1})
	e.expectServersPeer(client, "tcp", np, keeps(clientIP), podA1)
	e.expectHealthCheck(hc, http.StatusOK, 1)

	svc = e.editService("web", func(s *corev1.Service) { s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyCluster })
	if svc.Spec.HealthCheckNodePort != 0 {
		e.t.Errorf("externalTrafficPolicy Cluster kept health check node port %d", svc.Spec.HealthCheckNodePort)
	}
	for _, dst := range []netip.AddrPort{np, lb} {
		e.expectServersPeer(client, "tcp", dst, e.masqueraded(), podA1, podB1)
	}
	e.expectOutcome(client, "tcp", ap(nodeAIP, hc), netns.Refused)

	e.editService("web", func(s *corev1.Service) {
		s.Spec.InternalTrafficPolicy = ptr.To(corev1.ServiceInternalTrafficPolicyLocal)
	})
	e.expectServers(testerA, "tcp", cip, podA1)
	e.expectServers(nodeA, "tcp", cip, podA1)
	// External traffic to the NodePort is not internal: still both.
	e.expectServersPeer(client, "tcp", np, e.masqueraded(), podA1, podB1)
	// No local endpoint: internal traffic is dropped.
	e.setEndpoints("web", ipv4, endpoint{pod: podB1})
	e.expectOutcome(testerA, "tcp", cip, netns.Timeout)

	e.editService("web", func(s *corev1.Service) {
		s.Spec.InternalTrafficPolicy = ptr.To(corev1.ServiceInternalTrafficPolicyCluster)
	})
	e.expectServers(testerA, "tcp", cip, podB1)
	e.setEndpoints("web", ipv4, endpoint{pod: podA1}, endpoint{pod: podB1})
	e.expectServers(testerA, "tcp", cip, podA1, podB1)
}

// expectHealthCheck waits until the health check node port answers code
// with localEndpoints local, as upstream's JSON says it.
func (e *env) expectHealthCheck(port, code, local int) {
	e.t.Helper()
	e.eventually(fmt.Sprintf("health check node port %d answers %d with %d local endpoints", port, code, local), func() error {
		got, body, err := e.c.Client.HTTPGet(fmt.Sprintf("http://%s/", ap(nodeAIP, port)), 3*time.Second)
		if err != nil {
			return err
		}
		var st struct {
			Service struct {
				Namespace string `json:"namespace"`
				Name      string `json:"name"`
			} `json:"service"`
			LocalEndpoints int `json:"localEndpoints"`
		}
		if err := json.Unmarshal([]byte(body), &st); err != nil {
			return fmt.Errorf("not JSON: %v: %s", err, body)
		}
		if got != code || st.LocalEndpoints != local || st.Service.Namespace != e.kns || st.Service.Name != "web" {
			return fmt.Errorf("status %d: %s", got, body)
		}
		return nil
	})
}

// scenarioTerminating: endpoints going terminating leave the ready set;
// when no endpoint is ready, the serving terminating ones take the traffic;
// terminating endpoints that stopped serving never do.
func scenarioTerminating(e *env) {
	svc := e.createService("web")
	cip := ap(clusterIP(svc, v4), 80)
	steps := []struct {
		what string
		eps  []endpoint
		want []string // nil: rejected
	}{
		{"both ready", []endpoint{{pod: podA1}, {pod: podB1}}, []string{podA1, podB1}},
		{"a1 terminating", []endpoint{{pod: podA1, state: "terminating"}, {pod: podB1}}, []string{podB1}},
		{"both terminating, still serving: fallback", []endpoint{{pod: podA1, state: "terminating"}, {pod: podB1, state: "terminating"}}, []string{podA1, podB1}},
		{"a1 no longer serving", []endpoint{{pod: podA1, state: "stopping"}, {pod: podB1, state: "terminating"}}, []string{podB1}},
		{"a1 back, b1 unready", []endpoint{{pod: podA1}, {pod: podB1, state: "unready"}}, []string{podA1}},
		{"none serving", []endpoint{{pod: podA1, state: "stopping"}, {pod: podB1, state: "stopping"}}, nil},
	}
	for _, s := range steps {
		e.t.Logf("step: %s", s.what)
		e.setEndpoints("web", ipv4, s.eps...)
		for _, from := range []string{client, testerA} {
			if s.want == nil {
				e.expectOutcome(from, "tcp", cip, netns.Refused)
			} else {
				e.expectServers(from, "tcp", cip, s.want...)
			}
		}
	}
}

// scenarioTopology: with topology hints on every endpoint, node-a's zone
// label (and then a same-node hint) picks the endpoints.
func scenarioTopology(e *env) {
	setZone := func(zone string) {
		e.editNode(func(n *corev1.Node) {
			if zone == "" {
				delete(n.Labels, corev1.LabelTopologyZone)
			} else {
				n.Labels[corev1.LabelTopologyZone] = zone
			}
		})
	}
	setZone("zone-a")
	svc := e.createService("web", func(s *corev1.Service) {
		s.Spec.TrafficDistribution = ptr.To(corev1.ServiceTrafficDistributionPreferSameZone)
	})
	cip := ap(clusterIP(svc, v4), 80)
	e.setEndpoints("web", ipv4, endpoint{pod: podA1, hintZone: "zone-a"}, endpoint{pod: podB1, hintZone: "zone-b"})
	e.expectServers(testerA, "tcp", cip, podA1)
	e.expectServers(client, "tcp", cip, podA1)

	setZone("zone-b")
	e.expectServers(testerA, "tcp", cip, podB1)

	// A zone with no hint for it: hints are ignored.
	setZone("zone-c")
	e.expectServers(testerA, "tcp", cip, podA1, podB1)

	// No zone label: no zone topology either.
	setZone("")
	e.expectServers(testerA, "tcp", cip, podA1, podB1)

	// Same-node hints (PreferSameNode) win over zones.
	setZone("zone-b")
	e.setEndpoints("web", ipv4,
		endpoint{pod: podA1, hintZone: "zone-a", hintNode: nodeA},
		endpoint{pod: podB1, hintZone: "zone-b", hintNode: nodeB})
	e.expectServers(testerA, "tcp", cip, podA1)
}

// scenarioNodeDeletion: the cluster autoscaler's deletion taint and a Node
// being deleted make /healthz answer 503 (nodeEligible false), so that load
// balancers drain the node; /livez stays 200 and the rules stay.
func scenarioNodeDeletion(e *env) {
	svc := e.createService("web")
	cip := ap(clusterIP(svc, v4), 80)
	e.setEndpoints("web", ipv4, endpoint{pod: podA1})
	e.expectServers(client, "tcp", cip, podA1)
	e.expectHealth("/healthz", http.StatusOK, ptr.To(true))

	taint := corev1.Taint{Key: "ToBeDeletedByClusterAutoscaler", Value: strconv.FormatInt(time.Now().Unix(), 10), Effect: corev1.TaintEffectNoSchedule}
	e.editNode(func(n *corev1.Node) { n.Spec.Taints = append(n.Spec.Taints, taint) })
	e.expectHealth("/healthz", http.StatusServiceUnavailable, ptr.To(false))
	e.expectHealth("/livez", http.StatusOK, nil)
	e.expectServers(client, "tcp", cip, podA1)

	e.editNode(func(n *corev1.Node) {
		n.Spec.Taints = slices.DeleteFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == taint.Key })
	})
	e.expectHealth("/healthz", http.StatusOK, ptr.To(true))

	// A finalizer keeps the deleted Node around with a deletion
	// timestamp, as while a node controller cleans up.
	const finalizer = "e2e.kproxy.io/hold"
	e.editNode(func(n *corev1.Node) { n.Finalizers = append(n.Finalizers, finalizer) })
	e.t.Cleanup(func() {
		// Also on failure: a Node held by our finalizer would outlive the
		// test, and the next scenario registers node-a again.
		e.editNode(func(n *corev1.Node) {
			n.Finalizers = slices.DeleteFunc(n.Finalizers, func(s string) bool { return s == finalizer })
		})
	})
	if err := e.cp.Client.CoreV1().Nodes().Delete(e.ctx, nodeA, metav1.DeleteOptions{}); err != nil {
		e.t.Fatal(err)
	}
	e.expectHealth("/healthz", http.StatusServiceUnavailable, ptr.To(false))
	e.expectHealth("/livez", http.StatusOK, nil)
	e.expectServers(client, "tcp", cip, podA1)
}

// scenarioDualStack: a RequireDualStack Service answers on both cluster
// IPs and on the NodePort of both node addresses, each family following
// its own EndpointSlice; downgraded to IPv4 only, its IPv6 addresses stop
// answering.
func scenarioDualStack(e *env) {
	svc := e.createService("web", func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeNodePort
		s.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicyRequireDualStack)
		s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
	})
	cip4, cip6 := ap(clusterIP(svc, v4), 80), ap(clusterIP(svc, v6), 80)
	if !cip4.Addr().IsValid() || !cip6.Addr().IsValid() {
		e.t.Fatalf("cluster IPs %v, want one per family", svc.Spec.ClusterIPs)
	}
	np := nodePort(svc, "tcp")
	np4, np6 := ap(nodeAIP, np), ap(nodeAIP6, np)
	e.setEndpoints("web", ipv4, endpoint{pod: podA1}, endpoint{pod: podB1})
	e.setEndpoints("web", ipv6, endpoint{pod: podA1}, endpoint{pod: podB1})
	for _, dst := range []netip.AddrPort{cip4, cip6, np4, np6} {
		e.expectServers(client, "tcp", dst, podA1, podB1)
	}
	e.expectServersPeer(testerA, "tcp", cip6, keeps(e.podIP(testerA, v6)), podA1, podB1)
	e.expectServersPeer(client, "tcp", np6, e.masqueraded(), podA1, podB1)

	// Each family follows its own slice.
	e.setEndpoints("web", ipv6, endpoint{pod: podB1})
	e.expectServers(client, "tcp", cip6, podB1)
	e.expectServers(client, "tcp", np6, podB1)
	e.expectServers(client, "tcp", cip4, podA1, podB1)

	svc = e.editService("web", func(s *corev1.Service) {
		s.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicySingleStack)
		s.Spec.IPFamilies = s.Spec.IPFamilies[:1]
		s.Spec.ClusterIPs = s.Spec.ClusterIPs[:1]
	})
	if len(svc.Spec.ClusterIPs) != 1 {
		e.t.Fatalf("downgraded Service still has cluster IPs %v", svc.Spec.ClusterIPs)
	}
	e.expectCaptured(false, serviceKey(cip6.Addr().String(), corev1.ProtocolTCP, 80), nodePortKey("ip6", corev1.ProtocolTCP, int32(np)))
	e.expectUnanswered(client, "tcp", cip6)
	e.expectOutcome(client, "tcp", np6, netns.Refused)
	e.expectServers(client, "tcp", cip4, podA1, podB1)
	e.expectServers(client, "tcp", np4, podA1, podB1)
}
